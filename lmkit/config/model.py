"""The model section: the model's name and the keyword arguments of its constructor.

::

    model = dict(name="transformer", vocab_size=10000, hidden_size=256, num_layers=4, num_heads=4,
                 ffn_dim=1024, max_positions=128, tie_weights=True, init_scale=0.05, dropout=0.1)

``name`` is a name of :data:`lmkit.models.registry.MODELS` or a user's class
as ``"package.module:Class"``; every other key is an argument of that class's
constructor, spelled as the constructor spells it (``dropout``, not 0.x's
``keep_prob = 1 - dropout``). What 0.x's ``model_params`` held joins the same
dict. The keys are checked against the constructor when the model is built,
as ``optimizer_params`` are against the optimizer's.

The shape keys of the flat config (:data:`SHAPE_DEFAULTS`) keep lmkit's
defaults: a section that does not state ``max_positions`` reads it as 512,
and the model is built with 512, as 0.x built it. A shape key the class does
not take is left out when the model is built; set, it stays in the section,
since lmkit reads it (``max_source_positions`` bounds the sources an RNN
encoder-decoder is given).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Collection, Dict, Optional

from lmkit.config.base import ConfigError, check_type

__all__ = ["ModelConfig", "REQUIRED", "SHAPE_DEFAULTS", "SHAPE_TYPES", "dropout_of", "keep_prob_of"]


class _Required:
    """The default of a key that every config states."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()

#: The model keys of the flat config (0.x's TrainConfig fields), in its order, with their defaults.
SHAPE_DEFAULTS: Dict[str, Any] = {
    "vocab_size": REQUIRED, "hidden_size": REQUIRED, "num_layers": REQUIRED,
    "init_scale": REQUIRED,  # uniform(-init_scale, init_scale) initialiser
    "dropout": REQUIRED,  # 0.x: keep_prob = 1 - dropout
    "forget_bias": 0.0, "tie_weights": False,
    "embedding_dim": 0,  # 0 = hidden_size
    "num_heads": 4, "ffn_dim": 0,  # transformers; ffn_dim 0 = 4 * hidden_size
    "max_positions": 512, "pre_layer_norm": True,
    "source_vocab_size": 0,  # encoder-decoders: the source's ids (0: set from the source tokenizer)
    "max_source_positions": 256,  # the longest source
    "share_embeddings": False,  # encoder-decoders: one embedding table for both sides (needs share_vocab)
}
#: Their types (checked without coercion).
SHAPE_TYPES: Dict[str, type] = {
    "vocab_size": int, "hidden_size": int, "num_layers": int, "init_scale": float, "dropout": float,
    "forget_bias": float, "tie_weights": bool, "embedding_dim": int, "num_heads": int, "ffn_dim": int,
    "max_positions": int, "pre_layer_norm": bool, "source_vocab_size": int, "max_source_positions": int,
    "share_embeddings": bool,
}


def dropout_of(keep_prob: float) -> float:
    """0.x's ``keep_prob`` as a dropout rate (to 12 decimals, so 0.9 gives 0.1 and back)."""
    return round(1.0 - keep_prob, 12)


def keep_prob_of(dropout: float) -> float:
    """A dropout rate as 0.x's ``keep_prob``."""
    return round(1.0 - dropout, 12)


@dataclass(frozen=True, eq=False)
class ModelConfig:
    """The model's name and its constructor's keyword arguments.

    ``cfg.model == "lstm"`` compares the name, as the flat config's ``model``
    string did; ``str(cfg.model)`` is the name; ``cfg.model.hidden_size``
    reads an argument (a shape key not stated reads as its default).
    """

    SECTION = "model"

    name: str
    arguments: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, values: Dict[str, Any], source: str = "config") -> "ModelConfig":
        """The section of ``{"name": ..., <argument>: ...}``; shape keys are type-checked.

        Raises:
          ConfigError: no name, or a shape key of the wrong type.
        """
        values = dict(values)
        if "name" not in values:
            raise ConfigError(f"{source}: missing required key 'model' (the model's name); add `model = ...` "
                              "or name=... to model = dict(...)")
        name = values.pop("name")
        if not isinstance(name, str):
            raise ConfigError(f"{source}: model = {name!r} must be a string: a model's name or "
                              "'package.module:Class'")
        checked = {k: check_type(source, k, v, SHAPE_TYPES[k]) if k in SHAPE_TYPES else v
                   for k, v in values.items()}
        return cls(name=name, arguments=checked)

    def __getattr__(self, key: str) -> Any:
        arguments = self.__dict__.get("arguments")
        if arguments is None or key.startswith("__"):
            raise AttributeError(key)
        if key in arguments:
            return arguments[key]
        if SHAPE_DEFAULTS.get(key, REQUIRED) is not REQUIRED:
            return SHAPE_DEFAULTS[key]
        raise AttributeError(f"model {self.name!r} states no argument {key!r}")

    def get(self, key: str, default: Any = None) -> Any:
        """The argument ``key``, its shape default, or ``default``."""
        try:
            return getattr(self, key)
        except AttributeError:
            return default

    def shape(self) -> Dict[str, Any]:
        """Every shape key (:data:`SHAPE_DEFAULTS`) as the model gets it: stated, or its default."""
        return {k: self.arguments.get(k, d) for k, d in SHAPE_DEFAULTS.items()
                if k in self.arguments or d is not REQUIRED}

    def extras(self) -> Dict[str, Any]:
        """The stated arguments beyond the shape keys (what 0.x's ``model_params`` held)."""
        return {k: v for k, v in self.arguments.items() if k not in SHAPE_DEFAULTS}

    def model_config(self) -> Dict[str, Any]:
        """0.x's ``model_config()``: ``model``, the shape keys (``keep_prob`` for ``dropout``), the extras.

        :func:`lmkit.models.build_model` takes it; keys the class does not take are left out there.
        """
        config: Dict[str, Any] = {"model": self.name}
        for key, value in self.shape().items():
            if key == "dropout":
                config["keep_prob"] = keep_prob_of(value)
            else:
                config[key] = value
        config.update(self.extras())
        return config

    def resolved(self, parameters: Optional[Collection[str]]) -> Dict[str, Any]:
        """The section as a config file writes it: ``name``, then the shape keys the class takes
        (``parameters``: its constructor's; None: all) or that are not at their default, then the extras.

        A shape key the class does not take is left out at its default only, so
        nothing that the run reads is lost.
        """
        out: Dict[str, Any] = {"name": self.name}
        for key, value in self.shape().items():
            if parameters is None or key in parameters or value != SHAPE_DEFAULTS[key]:
                out[key] = value
        out.update(self.extras())
        return out

    def to_dict(self) -> Dict[str, Any]:
        """``{"name": ..., **arguments}`` as stated."""
        return {"name": self.name, **self.arguments}

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return self.name == other
        if isinstance(other, ModelConfig):
            return (self.name, self.shape(), self.extras()) == (other.name, other.shape(), other.extras())
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)

    def __str__(self) -> str:
        return self.name
