"""lmkit: modular language models for TensorFlow 2, on one process or many.

The package reads like the data flow::

    lmkit.data      vocabularies, PTB download, BPTT batches, text corpora
    lmkit.modules   embedders, RNN cells and decoder, transformer decoder
    lmkit.models    language models built from the modules (build_model)
    lmkit.losses    sequence losses
    lmkit.optim     optimizers, LARC, learning-rate policies, clipping
    lmkit.train     the distributed trainer, checkpoints
    lmkit.decoding  samplers, the decode loop, beam search
    lmkit.dist      the one module that talks to Horovod

Importing ``lmkit`` does not import Horovod.
"""

from lmkit import data, decoding, dist, losses, models, modules, optim, train
from lmkit.config import ConfigError, TrainConfig, load_config
from lmkit.errors import CheckpointError, LmkitError, NonFiniteError, UsageError
from lmkit.losses import sequence_softmax_cross_entropy
from lmkit.models import LanguageModel, RNNLanguageModel, TransformerLanguageModel, build_model
from lmkit.train import Trainer, load_model

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "ConfigError",
    "LanguageModel",
    "LmkitError",
    "NonFiniteError",
    "RNNLanguageModel",
    "TrainConfig",
    "Trainer",
    "TransformerLanguageModel",
    "UsageError",
    "build_model",
    "data",
    "decoding",
    "dist",
    "load_config",
    "load_model",
    "losses",
    "models",
    "modules",
    "optim",
    "sequence_softmax_cross_entropy",
    "train",
    "__version__",
]
