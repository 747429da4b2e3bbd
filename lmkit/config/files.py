"""Config files: plain Python modules found by name (``--config config_small``) or path.

A config file's top-level lowercase names are its settings (as in Texar's
examples): sections as dicts, or 0.x's flat keys, or both::

    model = dict(name="<a registered model>", vocab_size=10000, hidden_size=200, num_layers=2, init_scale=0.1,
                 dropout=0.0)
    data = dict(batch_size=20, num_steps=20)
    optimization = dict(learning_rate=1.0, max_grad_norm=5.0, num_epochs=13)

:func:`load_config` looks in ``$LMKIT_CONFIG_PATH``, in ``./configs``, then
among the configs that come with lmkit (``lmkit/configs/``), or takes a file
path or an importable module.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from typing import Any, Dict, Mapping, Optional, Tuple

from lmkit.config import names
from lmkit.config.base import ConfigError
from lmkit.config.spelling import merge, spell
from lmkit.config.train_config import TrainConfig
from lmkit.core.checks import did_you_mean

__all__ = ["available_configs", "load_config"]


def _module_values(module: types.ModuleType) -> Dict[str, Any]:
    return {k: v for k, v in vars(module).items()
            if not k.startswith("_") and k == k.lower()
            and not isinstance(v, (types.ModuleType, types.FunctionType, type))}


def _builtin_dir() -> str:
    return os.path.realpath(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs"))


def _search_dirs() -> Tuple[str, ...]:
    dirs = [d for d in os.environ.get("LMKIT_CONFIG_PATH", "").split(os.pathsep) if d]
    dirs += [os.path.join(os.getcwd(), "configs"), _builtin_dir()]  # yours, then lmkit's
    return tuple(dict.fromkeys(os.path.realpath(d) for d in dirs))


def _note_shadowing(name: str, path: Optional[str]) -> None:
    """One line (rank 0) when a config file found first hides the built-in config of that name.

    A config file is Python that runs as the user: ``--config config_small``
    inside someone else's checkout would run its ``configs/config_small.py``.
    """
    builtin = os.path.join(_builtin_dir(), name + ".py")
    if path is None or not os.path.isfile(builtin) or os.path.realpath(path) == builtin:
        return
    if names.launcher_rank() == 0:
        sys.stderr.write(f"note: --config {name} is {os.path.realpath(path)}, which shadows lmkit's built-in "
                         f"{name}; a config file is Python code that runs as you, so check it (lmkit's own: "
                         f"--config {builtin})\n")


def available_configs() -> Tuple[str, ...]:
    """Names of the configs found in the search folders."""
    found = set()
    for d in _search_dirs():
        if os.path.isdir(d):
            found.update(f[:-3] for f in os.listdir(d) if f.endswith(".py") and not f.startswith("_"))
    return tuple(sorted(found))


def _find(name: str) -> Optional[str]:
    """The file of config ``name`` (a path, or a name in the search folders); None: try it as a module."""
    if name.endswith(".py") or os.sep in name:
        if not os.path.isfile(name):
            raise ConfigError(f"config file {name!r} does not exist")
        return name
    for d in _search_dirs():
        candidate = os.path.join(d, name + ".py")
        if os.path.isfile(candidate):
            _note_shadowing(name, candidate)
            return candidate
    return None


def _import(name: str) -> types.ModuleType:
    """Runs the config file (or imports the module) ``name``."""
    path = _find(name)
    try:
        if path is not None:
            spec = importlib.util.spec_from_file_location(f"lmkit_config_{abs(hash(path))}", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            hint = did_you_mean(name, available_configs(), listing="available")
            raise ConfigError(f"unknown config {name!r}; {hint} (or pass a path to a .py file)") from None
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"config {name!r} failed to load: {type(exc).__name__}: {exc}") from exc


def load_config(name: str, overrides: Optional[Mapping[str, Any]] = None) -> TrainConfig:
    """Loads a config by name (``config_small``), file path or module path, with ``overrides`` on top.

    The file and the overrides may spell each setting any way
    (:mod:`lmkit.config.spelling`); a deprecated 0.x key in either prints one
    warning naming its new spelling.

    Raises:
      ConfigError: the config cannot be found, fails to import, or has an
        unknown, missing or ill-typed key.
    """
    module = _import(name)
    source = f"config {name!r}"
    sections = spell(_module_values(module), source, warn=True)
    if overrides:
        sections = merge(sections, spell(overrides, source, warn=True))
    return TrainConfig.from_sections(sections, source)
