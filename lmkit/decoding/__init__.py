"""Text generation: one decode loop, pluggable samplers, beam search as a sampler.

* :mod:`lmkit.decoding.sampler`: the :class:`Sampler` interface and the loop;
* :mod:`lmkit.decoding.samplers`: greedy, sampling, top-k, top-p;
* :mod:`lmkit.decoding.beam`: :class:`BeamSampler` (overrides the loop; ``scoring="transformers"``
  runs :mod:`lmkit.decoding.beam_hf`);
* :mod:`lmkit.decoding.constraints`: :class:`Constraints`, rules on tokens for every strategy
  (``decode(..., rules=)``);
* :mod:`lmkit.decoding.registry`: names -> samplers (:func:`get_sampler`);
* :func:`decode`: the entry point. See ``docs/generation.md``.

Importing this package does not import TensorFlow; the names load their
module on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "BeamSampler",
    "BeamSearchResult",
    "Constraints",
    "DecodeResult",
    "GreedySampler",
    "RandomSampler",
    "SAMPLERS",
    "SAMPLER_NAMES",
    "Sampler",
    "TopKSampler",
    "TopPSampler",
    "beam_search",
    "decode",
    "get_sampler",
    "gnmt_length_penalty",
    "prepare_prompts",
]

_HOMES = {
    "BeamSampler": "beam", "BeamSearchResult": "beam", "beam_search": "beam",
    "gnmt_length_penalty": "beam", "Constraints": "constraints",
    "DecodeResult": "prompts", "prepare_prompts": "prompts",
    "GreedySampler": "samplers", "RandomSampler": "samplers", "TopKSampler": "samplers",
    "TopPSampler": "samplers",
    "SAMPLERS": "registry", "SAMPLER_NAMES": "registry", "get_sampler": "registry",
    "Sampler": "sampler",
    "decode": "loop",
}


def __getattr__(name: str) -> Any:  # PEP 562
    if name in _HOMES:
        return getattr(importlib.import_module(f"lmkit.decoding.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'lmkit.decoding' has no attribute {name!r}")


def __dir__() -> list:
    return __all__
