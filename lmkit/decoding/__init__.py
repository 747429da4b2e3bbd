"""Text generation: one entry point, one config, one decode loop, pluggable samplers, beam search as a sampler.

* :func:`generate` (:mod:`lmkit.decoding.generation`): text in, text out, for language models and
  encoder-decoders, from a run folder, a Hugging Face folder or a model object;
* :class:`GenerationConfig` (:mod:`lmkit.decoding.config`): every setting of a generation, resolved
  as given, then the model folder's ``generation_config.json``, then lmkit's defaults;
* :mod:`lmkit.decoding.source`: which model a folder holds (:func:`load_generator`);
* :mod:`lmkit.decoding.text` / :mod:`lmkit.decoding.transduction`: a language model's prompts and an
  encoder-decoder's sources (BLEU: :func:`lmkit.decoding.transduction.score`);
* :func:`decode` (:mod:`lmkit.decoding.loop`): token ids in, token ids out;
* :mod:`lmkit.decoding.sampler`: the :class:`Sampler` interface and the loop;
* :mod:`lmkit.decoding.samplers`: greedy, sampling, top-k, top-p;
* :mod:`lmkit.decoding.beam`: :class:`BeamSampler` (overrides the loop; ``scoring="transformers"``
  runs :mod:`lmkit.decoding.beam_hf`);
* :mod:`lmkit.decoding.constraints`: :class:`Constraints`, rules on tokens for every strategy;
* :mod:`lmkit.decoding.registry`: names -> samplers (:func:`get_sampler`). See ``docs/generation.md``.

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
    "beam_search",
    "decode",
    "generate",
    "get_sampler",
    "gnmt_length_penalty",
    "load_generator",
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
    "GenerationConfig": "config",
    "Generation": "text",
    "Generator": "source", "load_generator": "source",
    "generate": "generation",
}


def __getattr__(name: str) -> Any:  # PEP 562
    if name in _HOMES:
        return getattr(importlib.import_module(f"lmkit.decoding.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'lmkit.decoding' has no attribute {name!r}")


def __dir__() -> list:
    return __all__
