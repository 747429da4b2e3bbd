"""The pieces that families' config mappings share: keys renamed both ways, and rotary settings as
``transformers`` writes them in any version.

A family's ``Converter.config_in`` turns a checked ``config.json`` into the
model's constructor arguments and ``Converter.config_out`` goes back; the
keys that only change their name are listed once, as ``(Hugging Face key,
lmkit argument)`` pairs, for :func:`renamed` and :func:`renamed_back`.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from lmkit.core.errors import UsageError

__all__ = ["ROPE_TYPES", "renamed", "renamed_back", "rope_in", "rope_out"]

#: The rotary scalings lmkit computes (besides none).
ROPE_TYPES = ("linear", "llama3")


def renamed(config: Mapping[str, Any], pairs: Sequence[Tuple[str, str]]) -> Dict[str, Any]:
    """The lmkit arguments of ``pairs`` (``(Hugging Face key, lmkit argument)``) with ``config``'s values."""
    return {ours: config[theirs] for theirs, ours in pairs}


def renamed_back(arguments: Mapping[str, Any], pairs: Sequence[Tuple[str, str]]) -> Dict[str, Any]:
    """The Hugging Face keys of ``pairs`` with the ``arguments``' values (:func:`renamed`'s inverse)."""
    return {theirs: arguments[ours] for theirs, ours in pairs}


def rope_in(config: Mapping[str, Any], path: str) -> Tuple[float, Optional[Dict[str, Any]]]:
    """``(rope_theta, rope_scaling or None)`` of a ``config.json`` of any ``transformers`` version:
    5 writes ``rope_parameters`` (theta and type in one dict), earlier ones ``rope_theta`` and ``rope_scaling``.

    Raises:
      UsageError: a theta that is not a positive number, or a scaling lmkit does not compute (:data:`ROPE_TYPES`).
    """
    params = config.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        theta = params["rope_theta"]
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta = config.get("rope_theta", 10000.0)
        scaling = dict(config.get("rope_scaling") or {})
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise UsageError(f"{path}: rope_theta = {theta!r} must be a number > 0")
    kind = scaling.pop("rope_type", scaling.pop("type", "default")) if scaling else "default"
    if kind == "default":
        return float(theta), None
    if kind not in ROPE_TYPES:
        raise UsageError(f"{path}: rope type {kind!r} is not supported; lmkit computes default, "
                         f"{', '.join(ROPE_TYPES)}")
    return float(theta), {"rope_type": kind, **scaling}


def rope_out(theta: float, scaling: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """``config.json``'s ``rope_theta`` and ``rope_scaling`` (as ``transformers`` 4 writes them, which 5 reads)."""
    return {"rope_theta": theta, "rope_scaling": None if scaling is None else dict(scaling)}
