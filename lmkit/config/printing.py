"""A config written out as a config file: every section as a dict, the model's as its constructor takes it.

``lmkit train --print_config`` prints :func:`format_config`'s text; saved as
a ``.py`` file it loads back (``--config that_file.py``) as the same config.
"""

from __future__ import annotations

import math
from typing import Any, List

from lmkit.config.spelling import SECTIONS

__all__ = ["format_config"]


def _literal(value: Any) -> str:
    """``value`` as Python source (``repr``, with infinities and NaN spelled so they load)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"float({str(value)!r})"
    return repr(value)


def format_config(cfg: Any, header: str = "") -> str:
    """``cfg`` (a :class:`~lmkit.config.TrainConfig`) as the text of a config file.

    Every field of every section is written, the defaults too; the model
    section holds the model's name and every argument of its constructor,
    stated or at its default (:meth:`~lmkit.config.model.ModelConfig.resolved`).

    Args:
      cfg: the config.
      header: the module docstring's text (what the file is, how to use it).

    Raises:
      UsageError: the model's class cannot be imported.
    """
    lines: List[str] = [f'"""{header.strip()}\n"""', ""] if header.strip() else []
    for name in SECTIONS:
        values = cfg.model.resolved() if name == "model" else getattr(cfg, name).to_dict()
        if name == "data":
            values = {"kind": values.pop("kind"), **values}
        lines.append(f"{name} = dict(")
        lines += [f"    {key}={_literal(value)}," for key, value in values.items()]
        lines += [")", ""]
    return "\n".join(lines)
