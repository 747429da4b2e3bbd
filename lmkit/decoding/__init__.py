"""Text generation: one entry point for text, one for token ids, one config, pluggable samplers.

The public entry points (``docs/generation.md``):

* :func:`generate` (:mod:`lmkit.decoding.generation`): text in, text out, for language models and
  encoder-decoders, from a run folder, a Hugging Face folder or a model object; prompts may be texts,
  token ids or chat conversations;
* :func:`decode` (:mod:`lmkit.decoding.loop`): token ids in, token ids out, with any sampler;
* :class:`GenerationConfig` (:mod:`lmkit.decoding.config`): every setting of a generation, checked when
  it is built, resolved as given, then the model folder's ``generation_config.json``, then lmkit's defaults;
* the samplers: :class:`GreedySampler`, :class:`RandomSampler`, :class:`TopKSampler`,
  :class:`TopPSampler` (:mod:`lmkit.decoding.samplers`) and :class:`BeamSampler`
  (:mod:`lmkit.decoding.beam`, the one beam search), all :class:`Sampler` s, by name through
  :func:`get_sampler`;
* :func:`load_generator` (:mod:`lmkit.decoding.source`): a folder's model with its tokenizers, loaded once.

Their parts: :mod:`~lmkit.decoding.prompts` (a prompt or a conversation encoded),
:mod:`~lmkit.decoding.plan` (a generation checked before any model is built), :mod:`~lmkit.decoding.text`
and :mod:`~lmkit.decoding.transduction` (a language model's and an encoder-decoder's decoding),
:mod:`~lmkit.decoding.constraints` (rules on tokens). Importing this package does not import TensorFlow;
the names load their module on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "BeamSampler",
    "BeamSearchResult",
    "Constraints",
    "DecodeResult",
    "Generation",
    "GenerationConfig",
    "Generator",
    "GreedySampler",
    "RandomSampler",
    "SAMPLERS",
    "SAMPLER_NAMES",
    "Sampler",
    "TopKSampler",
    "TopPSampler",
    "decode",
    "encode_prompt",
    "generate",
    "get_sampler",
    "load_generator",
]

_HOMES = {
    "BeamSampler": "beam", "BeamSearchResult": "beam", "Constraints": "constraints", "DecodeResult": "batch",
    "GreedySampler": "samplers", "RandomSampler": "samplers", "TopKSampler": "samplers", "TopPSampler": "samplers",
    "SAMPLERS": "registry", "SAMPLER_NAMES": "registry", "get_sampler": "registry",
    "Sampler": "sampler", "decode": "loop", "GenerationConfig": "config", "Generation": "text",
    "Generator": "source", "load_generator": "source", "encode_prompt": "prompts", "generate": "generation",
}


def __getattr__(name: str) -> Any:  # PEP 562
    if name in _HOMES:
        return getattr(importlib.import_module(f"lmkit.decoding.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'lmkit.decoding' has no attribute {name!r}")


def __dir__() -> list:
    return __all__
