"""lmkit: modular language models for TensorFlow 2, on one process or many.

The package reads like the data flow::

    lmkit.core         errors, checks, registries, files written whole, the run folder (no TensorFlow)
    lmkit.config       the run config: its sections, config files and flags
    lmkit.data         tokenizers, corpora, the token cache, batches (pure functions of rank and size)
    lmkit.layers       embeddings, norms, attention, feed-forward, RNN cells, LoRA, kernels
    lmkit.models       language models and encoder-decoders, a folder per family (the model registry)
    lmkit.hub          Hugging Face folders: safetensors, tokenizers, generation config, converters
    lmkit.decoding     samplers, the decode loop, beam search, generate()
    lmkit.optim        optimizers, LARC, learning-rate schedules, clipping
    lmkit.train        the trainer, losses, checkpoints, evaluation
    lmkit.distributed  the one package that talks to Horovod or tf.distribute (launch too)

Importing ``lmkit`` imports neither TensorFlow nor Horovod: the names below
load their module on first use, so command-line tools answer a bad flag at
once. Nor does it touch the import system: the 0.2 module names
(``lmkit.modules``, ``lmkit.hf``, ...) are gone, and CHANGELOG.md lists where
each one lives now.
"""


from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.3.0"

# public name -> the module that defines it (a module itself when the names agree)
_EXPORTS = {
    "data": "lmkit.data",
    "decoding": "lmkit.decoding",
    "distributed": "lmkit.distributed",
    "models": "lmkit.models",
    "layers": "lmkit.layers",
    "hub": "lmkit.hub",
    "core": "lmkit.core",
    "optim": "lmkit.optim",
    "train": "lmkit.train",
    "ConfigError": "lmkit.config",
    "TrainConfig": "lmkit.config",
    "load_config": "lmkit.config",
    "CheckpointError": "lmkit.core.errors",
    "LmkitError": "lmkit.core.errors",
    "NonFiniteError": "lmkit.core.errors",
    "UsageError": "lmkit.core.errors",
    "sequence_softmax_cross_entropy": "lmkit.train.losses",
    "LanguageModel": "lmkit.models",
    "RNNLanguageModel": "lmkit.models",
    "TransformerLanguageModel": "lmkit.models",
    "build_model": "lmkit.models",
    "Trainer": "lmkit.train",
    "load_model": "lmkit.train",
    "generate": "lmkit.decoding.generation",
    "Generation": "lmkit.decoding.generation",
    "GenerationConfig": "lmkit.decoding.config",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:  # PEP 562
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lmkit' has no attribute {name!r}")
    if module == f"lmkit.{name}":
        return importlib.import_module(module)
    return getattr(importlib.import_module(module), name)


def __dir__() -> list:
    return __all__
