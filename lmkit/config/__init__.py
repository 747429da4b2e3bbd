"""The run config: settings grouped by concern, loaded from plain Python config files and flags.

A config is a Python file such as ``configs/config_small.py`` whose top-level
lowercase names are its sections (as in Texar's examples)::

    model = dict(name="<a registered model>", vocab_size=10000, hidden_size=200, num_layers=2, init_scale=0.1,
                 dropout=0.0)
    data = dict(batch_size=20, num_steps=20)
    optimization = dict(learning_rate=1.0, max_grad_norm=5.0, lr_decay=0.5, lr_decay_start_epoch=4,
                        num_epochs=13)

The sections (:class:`TrainConfig`'s fields):

* ``model``: the model's name and its constructor's keyword arguments
  (:class:`~lmkit.config.model.ModelConfig`; unstated ones take the
  constructor's defaults);
* ``data``, ``optimization``, ``compute`` (precision, XLA, attention
  kernel), ``distribution``, ``checkpoints`` (``init_from`` too),
  ``adapters`` (LoRA), ``run`` (seed, logs): :mod:`lmkit.config.sections`.

Code reads a config by section: ``cfg.optimization.learning_rate``,
``cfg.data.batch_size``, ``cfg.model.name``, ``cfg.model["hidden_size"]``.
Files and flags may still spell a setting flat, as 0.x did (``hidden_size =
200``, ``--set batch_size=40``), or dotted (``--set
optimization.learning_rate=0.5``): :mod:`lmkit.config.spelling` maps each
onto its section. ``keep_prob`` and ``model_params`` print one warning
naming their new spelling. A run folder's ``config.json`` holds the
sections (:mod:`lmkit.config.stored` reads 0.2's flat ones too).

``load_config("config_small")`` finds a config (:mod:`lmkit.config.files`),
then :meth:`TrainConfig.from_sections` checks it: a missing required key or
an unknown key is a :class:`ConfigError` naming the key; values are
type-checked, never silently coerced (``2.7`` is not an int, ``"False"`` is
not a bool). :func:`format_config` writes a config back as a file
(``lmkit train --print_config``).

This package imports only :mod:`lmkit.core`: the names it checks (models,
tokenizers, precisions, backends, ...) are read from their registries by
import path (:mod:`lmkit.config.names`), and so are a model's constructor
defaults and its family's own checks of a config.
"""

from __future__ import annotations

from lmkit.config.base import ConfigError, Section
from lmkit.config.files import available_configs, load_config
from lmkit.config.model import ModelConfig
from lmkit.config.printing import format_config
from lmkit.config.sections import (
    AdapterConfig,
    CheckpointConfig,
    ComputeConfig,
    DataConfig,
    DistributionConfig,
    OptimizationConfig,
    RunConfig,
)
from lmkit.config.spelling import DEPRECATED, FLAT_KEYS, LEGACY_BACKEND_KEY, SECTIONS
from lmkit.config.stored import stored_model_config, stored_setting
from lmkit.config.train_config import ADAPTER_KEYS, PLAN_KEYS, REQUIRED_KEYS, TrainConfig
from lmkit.config.validation import DATA_KINDS, PAIR_FILE_KEYS

__all__ = [
    "ADAPTER_KEYS", "DATA_KINDS", "DEPRECATED", "FLAT_KEYS", "LEGACY_BACKEND_KEY", "PAIR_FILE_KEYS", "PLAN_KEYS",
    "REQUIRED_KEYS", "SECTIONS",
    "AdapterConfig", "CheckpointConfig", "ComputeConfig", "ConfigError", "DataConfig", "DistributionConfig",
    "ModelConfig", "OptimizationConfig", "RunConfig", "Section", "TrainConfig",
    "available_configs", "format_config", "load_config", "stored_model_config", "stored_setting",
]

