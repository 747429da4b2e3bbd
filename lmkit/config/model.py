"""The model section: the model's name and the keyword arguments of its constructor.

::

    model = dict(name="<a registered model>", vocab_size=10000, hidden_size=256, num_layers=4, dropout=0.1)

``name`` is a name of :data:`lmkit.models.registry.MODELS` or a user's class
as ``"package.module:Class"``; every other key is an argument of that class's
constructor, spelled as the constructor spells it (``dropout``, not 0.x's
``keep_prob = 1 - dropout``). A key the section does not state has the
constructor's default: ``cfg.model["max_positions"]`` reads the stated value,
else the default of the class's ``__init__``, found through the registry's
``"module:Class"`` string (:mod:`lmkit.config.names`: the class is imported
then, and TensorFlow with it, only when an unstated key is read). The keys
are checked against the constructor when the model is built, as
``optimizer_params`` are against the optimizer's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping

from lmkit.config import names
from lmkit.config.base import ConfigError, check_type
from lmkit.core.errors import UsageError

__all__ = ["FLAT_MODEL_KEYS", "ModelConfig", "dropout_of"]

#: The model keys that a flat (0.x) config writes at its top level (``hidden_size = 200``), with their types,
#: checked when a config loads; any other argument of the model is written in the model section.
FLAT_MODEL_KEYS: Dict[str, type] = {
    "vocab_size": int, "hidden_size": int, "num_layers": int, "init_scale": float, "dropout": float,
    "forget_bias": float, "tie_weights": bool, "embedding_dim": int, "num_heads": int, "ffn_dim": int,
    "max_positions": int, "pre_layer_norm": bool, "source_vocab_size": int, "max_source_positions": int,
    "share_embeddings": bool,
}


def dropout_of(keep_prob: float) -> float:
    """0.x's ``keep_prob`` as a dropout rate (to 12 decimals, so 0.9 gives 0.1 and back)."""
    return round(1.0 - keep_prob, 12)


@dataclass(frozen=True, eq=False)
class ModelConfig:
    """The model's name and the constructor arguments the config states.

    ``cfg.model.name`` is the name; ``cfg.model["hidden_size"]`` reads an
    argument (stated, else the constructor's default; ``KeyError`` naming the
    model when neither); ``cfg.model.get("hidden_size", default)`` never
    raises ``KeyError``. ``str(cfg.model)`` is the name, for messages.
    """

    SECTION = "model"

    name: str
    arguments: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str = "config") -> "ModelConfig":
        """The section of ``{"name": ..., <argument>: ...}``; the flat model keys are type-checked.

        Raises:
          ConfigError: no name, or a flat model key of the wrong type.
        """
        values = dict(values)
        if "name" not in values:
            raise ConfigError(f"{source}: missing required key 'model' (the model's name); add `model = ...` "
                              "or name=... to model = dict(...)")
        name = values.pop("name")
        if not isinstance(name, str):
            raise ConfigError(f"{source}: model = {name!r} must be a string: a model's name or "
                              "'package.module:Class'")
        checked = {k: check_type(source, k, v, FLAT_MODEL_KEYS[k]) if k in FLAT_MODEL_KEYS else v
                   for k, v in values.items()}
        return cls(name=name, arguments=checked)

    # ------------------------------------------------------------------ reading
    def __getitem__(self, key: str) -> Any:
        """The argument ``key``: stated, else the constructor's default.

        Raises:
          KeyError: the config does not state it and the constructor has no default for it.
          UsageError: the model's class cannot be imported (only read for an unstated key).
        """
        if key in self.arguments:
            return self.arguments[key]
        signature = names.model_arguments(self.name)
        if key in signature.defaults:
            return signature.defaults[key]
        why = "has no default for it" if key in signature.required else "takes no such argument"
        raise KeyError(f"model {self.name!r}: the config states no {key!r} and the constructor {why}")

    def get(self, key: str, default: Any = None) -> Any:
        """The argument ``key`` (stated, else the constructor's default), or ``default`` when it has neither."""
        try:
            return self[key]
        except KeyError:
            return default

    def resolved(self) -> Dict[str, Any]:
        """``name``, the stated arguments (also keys its constructor does not take, which building leaves out),
        then the constructor's defaults of the others: every argument the model is built with.

        Raises:
          UsageError: the model's class cannot be imported.
        """
        defaults = names.model_arguments(self.name).defaults
        return {"name": self.name, **self.arguments,
                **{key: value for key, value in defaults.items() if key not in self.arguments}}

    def model_config(self) -> Dict[str, Any]:
        """``{"model": name, <argument>: value}``: the keyword arguments of the constructor, each stated or at
        its default (keys of other models left out), as :func:`lmkit.models.build_model` takes them.

        Raises:
          UsageError: the model's class cannot be imported.
        """
        signature = names.model_arguments(self.name)
        takes = set(signature.defaults) | set(signature.required)
        stated = {k: v for k, v in self.arguments.items() if signature.open or k in takes}
        return {"model": self.name, **stated,
                **{key: value for key, value in signature.defaults.items() if key not in stated}}

    def to_dict(self) -> Dict[str, Any]:
        """``{"name": ..., **arguments}`` as stated."""
        return {"name": self.name, **self.arguments}

    def __eq__(self, other: object) -> bool:
        """Same name and the same arguments, a default stated or not."""
        if not isinstance(other, ModelConfig):
            return NotImplemented
        if self.name != other.name:
            return False
        if self.arguments == other.arguments:
            return True
        try:
            return self.resolved() == other.resolved()
        except UsageError:  # a user's class that does not import: only the stated values compare
            return False

    def __hash__(self) -> int:
        return hash(self.name)

    def __str__(self) -> str:
        return self.name
