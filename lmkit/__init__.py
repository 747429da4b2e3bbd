"""lmkit: modular language models for TensorFlow 2, on one process or many.

The package reads like the data flow::

    lmkit.data      vocabularies, tokenizers, PTB download, BPTT batches, text corpora
    lmkit.modules   embedders, RNN cells and decoder, transformer decoder
    lmkit.models    language models built from the modules (the model registry)
    lmkit.losses    sequence losses
    lmkit.optim     optimizers, LARC, learning-rate policies, clipping
    lmkit.train     the distributed trainer, checkpoints, watchdog
    lmkit.decoding  samplers, the decode loop, beam search
    lmkit.generation  text in, text out: lmkit.generate(model_dir, prompts, ...)
    lmkit.distributed  the one package that talks to Horovod or tf.distribute
                    (lmkit.dist: its old name, deprecated)

Importing ``lmkit`` imports neither TensorFlow nor Horovod: the names below
load their module on first use, so command-line tools answer a bad flag at
once.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"

# public name -> the module that defines it (a module itself when the names agree)
_EXPORTS = {
    "data": "lmkit.data",
    "decoding": "lmkit.decoding",
    "dist": "lmkit.dist",  # deprecated name of lmkit.distributed (warns)
    "distributed": "lmkit.distributed",
    "losses": "lmkit.losses",
    "models": "lmkit.models",
    "modules": "lmkit.modules",
    "optim": "lmkit.optim",
    "train": "lmkit.train",
    "ConfigError": "lmkit.config",
    "TrainConfig": "lmkit.config",
    "load_config": "lmkit.config",
    "CheckpointError": "lmkit.errors",
    "LmkitError": "lmkit.errors",
    "NonFiniteError": "lmkit.errors",
    "UsageError": "lmkit.errors",
    "sequence_softmax_cross_entropy": "lmkit.losses",
    "LanguageModel": "lmkit.models",
    "RNNLanguageModel": "lmkit.models",
    "TransformerLanguageModel": "lmkit.models",
    "build_model": "lmkit.models",
    "Trainer": "lmkit.train",
    "load_model": "lmkit.train",
    "generate": "lmkit.generation",
    "Generation": "lmkit.generation",
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
