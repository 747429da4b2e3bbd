"""The sampler registry: a strategy name -> its class (no TensorFlow import).

``lmkit generate --strategy NAME`` and :func:`get_sampler` both read
:data:`SAMPLERS`; adding a strategy is one file and one line here.
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, Tuple

from lmkit.errors import UsageError
from lmkit.registry import import_object, lookup

__all__ = ["SAMPLERS", "SAMPLER_NAMES", "get_sampler", "sampler_from_flags"]

SAMPLERS: Dict[str, str] = {
    "greedy": "lmkit.decoding.samplers:GreedySampler",
    "sample": "lmkit.decoding.samplers:RandomSampler",
    "top_k": "lmkit.decoding.samplers:TopKSampler",
    "top_p": "lmkit.decoding.samplers:TopPSampler",
    "beam": "lmkit.decoding.beam:BeamSampler",
}
SAMPLER_NAMES: Tuple[str, ...] = tuple(SAMPLERS)


def get_sampler(name: str, **kwargs: Any):
    """Builds a sampler by name.

    Args:
      name: one of :data:`SAMPLER_NAMES` (``"greedy"``, ``"sample"``,
        ``"top_k"``, ``"top_p"``, ``"beam"``).
      **kwargs: constructor arguments of that sampler (``temperature``, ``k``,
        ``p``, ``beam_width``, ``length_penalty``).

    Returns:
      A :class:`~lmkit.decoding.sampler.Sampler`.

    Raises:
      UsageError: unknown name, or an argument the sampler does not take.
    """
    cls = lookup(SAMPLERS, name, "sampler")
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise UsageError(f"sampler {name!r} does not accept {sorted(kwargs)}: {exc}") from None


def sampler_from_flags(name: str, **flags: Any):
    """The sampler ``name`` built from those of ``flags`` its constructor takes.

    For callers that hold every strategy's settings at once (``lmkit generate``'s
    flags, :func:`lmkit.generate`'s keywords): ``k`` reaches ``top_k`` only, and so on.

    Raises:
      UsageError: an unknown name.
    """
    if name not in SAMPLERS:
        raise UsageError(f"strategy {name!r} is not one of {', '.join(SAMPLER_NAMES)}")
    cls = import_object(SAMPLERS[name], "sampler")
    takes = inspect.signature(cls.__init__).parameters
    return cls(**{k: v for k, v in flags.items() if k in takes})
