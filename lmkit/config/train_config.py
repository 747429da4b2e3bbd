"""The config of a training run: its sections, built from any spelling and checked as a whole."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional

from lmkit.config.base import ConfigError
from lmkit.config.model import ModelConfig
from lmkit.config.sections import (
    AdapterConfig,
    CheckpointConfig,
    ComputeConfig,
    DataConfig,
    DistributionConfig,
    OptimizationConfig,
    RunConfig,
)
from lmkit.config.spelling import FLAT_KEYS, SECTIONS, Sections, merge, spell
from lmkit.config.validation import validate

__all__ = ["ADAPTER_KEYS", "PLAN_KEYS", "REQUIRED_KEYS", "TrainConfig"]

# The keys that shape a LoRA run's adapters (what its checkpoints hold): fixed for the run, like the model's.
ADAPTER_KEYS = ("lora_rank", "lora_alpha", "lora_targets")
# The keys every config states, flat, with their sections' fields.
REQUIRED_KEYS = ("model", "vocab_size", "hidden_size", "num_layers", "init_scale", "dropout",
                 "batch_size", "num_steps", "learning_rate", "max_grad_norm")
# The keys that plan a run's length: a config states exactly one.
PLAN_KEYS = ("num_epochs", "max_steps", "max_tokens")


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of a training run, grouped by concern.

    ``cfg.model`` holds the model's name and its constructor's arguments,
    ``cfg.data`` what the run reads, then ``optimization``, ``compute``
    (precision, XLA, kernels), ``distribution``, ``checkpoints``,
    ``adapters`` (LoRA) and ``run`` (seed, logs). Read a setting by its
    section: ``cfg.optimization.learning_rate``, ``cfg.data.batch_size``,
    ``cfg.model.name``, ``cfg.model["hidden_size"]`` (0.x's flat names,
    ``cfg.learning_rate``, are spellings of files and flags only).

    Build one with :meth:`from_dict` (any spelling, :mod:`lmkit.config.spelling`)
    or :func:`lmkit.config.load_config`; both check every value.
    """

    model: ModelConfig
    data: DataConfig
    optimization: OptimizationConfig
    compute: ComputeConfig = field(default_factory=ComputeConfig)
    distribution: DistributionConfig = field(default_factory=DistributionConfig)
    checkpoints: CheckpointConfig = field(default_factory=CheckpointConfig)
    adapters: AdapterConfig = field(default_factory=AdapterConfig)
    run: RunConfig = field(default_factory=RunConfig)

    # ------------------------------------------------------------------ building
    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str = "config") -> "TrainConfig":
        """A checked config from settings spelled any way (flat 0.x keys, sections, dotted keys).

        Raises:
          ConfigError: naming the bad key: unknown, missing, ill-typed or out of range.
        """
        return cls.from_sections(spell(values, source), source)

    @classmethod
    def from_sections(cls, sections: Sections, source: str = "config") -> "TrainConfig":
        """A checked config from ``{section: {field: value}}`` (:func:`lmkit.config.spelling.spell`)."""
        for key in REQUIRED_KEYS:
            section, name = FLAT_KEYS[key]
            if name not in sections.get(section, {}):
                raise ConfigError(f"{source}: missing required key {key!r}; add `{key} = ...` (or {name}=... "
                                  f"in {section} = dict(...); required keys: {', '.join(REQUIRED_KEYS)})")
        built = {name: section_cls.from_dict(sections.get(name, {}), source)
                 for name, section_cls in SECTIONS.items()}
        cfg = cls(**built)
        validate(cfg, source)
        return cfg

    def replace(self, **changes: Any) -> "TrainConfig":
        """A checked copy with some values changed, spelled any way (``batch_size=64``,
        ``optimization={"learning_rate": 0.5}``, ``**{"model.dropout": 0.1}``); unknown keys are errors."""
        return TrainConfig.from_sections(merge(self.to_sections(), spell(changes, "config override")),
                                         source="config override")

    # ------------------------------------------------------------------ reading
    @property
    def tokens_per_step(self) -> int:
        """Tokens a global step trains on: ``batch_size * num_steps`` (a language model's windows)."""
        return self.data.batch_size * self.data.num_steps

    @property
    def planned_steps(self) -> Optional[int]:
        """The run's last global step when it is planned in steps or tokens; None for a plan in epochs.

        ``max_tokens`` becomes ``ceil(max_tokens / tokens_per_step)`` steps: the
        global batch's tokens, on any number of workers.
        """
        opt = self.optimization
        if opt.max_steps:
            return opt.max_steps
        if opt.max_tokens:
            return -(-opt.max_tokens // self.tokens_per_step)
        return None

    def epochs_to_run(self, steps_per_epoch: int) -> int:
        """The epochs a run goes through: ``num_epochs``, or those the planned steps need (the last one cut short)."""
        planned = self.planned_steps
        return self.optimization.num_epochs if planned is None else -(-planned // max(steps_per_epoch, 1))

    @property
    def source_length_limit(self) -> int:
        """The most ids a source may have (``max_source_length``, 0 meaning ``max_source_positions``)."""
        return self.data.max_source_length or self.model["max_source_positions"]

    @property
    def target_length_limit(self) -> int:
        """The most ids a target may have, without its start/end id (0 meaning ``max_positions - 1``)."""
        return self.data.max_target_length or self.model["max_positions"] - 1

    @property
    def tokenizer_options(self) -> Dict[str, Any]:
        """The options of ``lmkit.data.train_tokenizer`` this config asks for."""
        return {"vocab_size": self.model["vocab_size"], "max_vocab": self.data.max_vocab or None,
                "min_count": self.data.min_count, "model_type": self.data.spm_model_type,
                "source": self.checkpoints.init_from}

    def model_config(self) -> Dict[str, Any]:
        """``{"model": name, <constructor argument>: value}``, every argument stated or at the constructor's
        default, as :func:`lmkit.models.build_model` takes them (:meth:`ModelConfig.model_config`)."""
        return self.model.model_config()

    # ------------------------------------------------------------------ writing
    def to_sections(self) -> Sections:
        """``{section: {field: value}}``: the model's arguments as stated, every field of the others."""
        return {name: getattr(self, name).to_dict() for name in SECTIONS}

    def to_dict(self) -> Dict[str, Any]:
        """Every setting by section, as a run folder's ``config.json`` holds it: the model section with every
        argument of its constructor (the defaults written out, so a later lmkit whose defaults differ rebuilds
        the same model), every field of the others.

        Raises:
          UsageError: the model's class cannot be imported.
        """
        return {**self.to_sections(), "model": self.model.resolved()}

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON (``config.json``); :meth:`from_dict` reads it back."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)
