"""The registry of model families: a config's ``model`` name -> the class that builds it (no TensorFlow import).

A family is one folder, ``lmkit/models/<family>/``: its model, its Hugging
Face converter (``convert.py``, :class:`lmkit.hub.converters.Converter`)
and an ``__init__.py`` that declares, as plain data, the ``model`` names it
builds (``MODELS``, and ``SEQ2SEQ_MODELS`` for encoder-decoders), the
Hugging Face ``model_type``s it reads (``HF_MODEL_TYPES``, each with the
model it loads as), its converter (``CONVERTER``, ``"module:Class"``) and
the checks it makes of a training config (``CONFIG_CHECK``,
``"module:function"``, :func:`check_config`). :data:`FAMILIES` lists the
families, one line each; everything else here is assembled from them.

:data:`MODELS` maps a config's ``model`` name to the class that builds it
(as ``"module:Class"``, imported only when used) and the constructor
arguments the name fixes. A config may also name a user's own class by
import path, ``model = "my_pkg.my_module:MyLM"``; it is stored in the run's
``config.json``, so generation and resume rebuild it without the user's
script.

:func:`build_model` turns a ``model_config`` (``TrainConfig.model_config()``
or ``model.get_config()``) into a model: ``model`` is the name, every other
key a constructor argument of the class (:func:`model_arguments` lists
them; a config's unstated ones take the constructor's defaults). Keys are
checked against the constructor: an unknown key is an error naming the
closest known one; a key that only another built-in model takes is
ignored, so one config dict serves all.
"""

from __future__ import annotations

import importlib
import inspect
from types import ModuleType
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

from lmkit.core.checks import check_known_keys, did_you_mean
from lmkit.core.errors import UsageError
from lmkit.core.registry import import_object

if TYPE_CHECKING:  # pragma: no cover
    from lmkit.hub.converters import Converter
    from lmkit.models.protocols import LanguageModel

__all__ = ["CONVERTERS", "FAMILIES", "MODELS", "SEQ2SEQ_MODELS", "Arguments", "build_model", "check_config",
           "converter_of_model", "family_converters", "family_of_model", "family_package", "is_import_path",
           "model_arguments", "model_class", "model_keys", "model_of_hf_type", "pretrained_models"]

#: family -> its package. A new family is one line here.
FAMILIES: Dict[str, str] = {
    "rnn": "lmkit.models.rnn",  # LSTM, GRU, and their encoder-decoder with attention
    "gpt2": "lmkit.models.gpt2",  # lmkit's transformer, and GPT-2
    "llama": "lmkit.models.llama",  # Llama, Qwen2, Mistral
    "gemma": "lmkit.models.gemma",  # Gemma
    "bart": "lmkit.models.bart",  # the transformer encoder-decoder, and BART
}


def family_package(family: str) -> ModuleType:
    """The package of ``family`` (its ``__init__.py`` declarations; no TensorFlow import)."""
    return importlib.import_module(FAMILIES[family])


def _declaration(family: str, name: str, default: Any = None) -> Any:
    """One declaration of ``family``'s ``__init__.py`` (``default`` where it has none), read from the module's
    own names: a family's lazy ``__getattr__`` would import its model, and TensorFlow with it."""
    return vars(family_package(family)).get(name, default)


def _declared(name: str) -> Dict[str, Any]:
    """One declaration (a dict) of every family, merged in the families' order."""
    return {key: value for family in FAMILIES for key, value in _declaration(family, name, {}).items()}


#: name -> ("module:Class", constructor arguments the name fixes): the language models, then the
#: encoder-decoders.
MODELS: Dict[str, Tuple[str, Dict[str, Any]]] = {**_declared("MODELS"), **_declared("SEQ2SEQ_MODELS")}
#: the names of :data:`MODELS` that are encoder-decoders (they train on ``data = "pairs"``)
SEQ2SEQ_MODELS: Tuple[str, ...] = tuple(_declared("SEQ2SEQ_MODELS"))
#: Hugging Face ``model_type`` -> the converter that reads its folders (``"module:Class"``).
CONVERTERS: Dict[str, str] = {model_type: _declaration(family, "CONVERTER") for family in FAMILIES
                              for model_type in _declaration(family, "HF_MODEL_TYPES", {})}


def family_of_model(model: str) -> Optional[str]:
    """The family whose folder holds the model named ``model`` (None for a user's import path)."""
    for family in FAMILIES:
        if model in _declaration(family, "MODELS", {}) or model in _declaration(family, "SEQ2SEQ_MODELS", {}):
            return family
    return None


def converter_of_model(model: str) -> Optional["Converter"]:
    """The Hugging Face converter of the family of the model named ``model``; None where there is none."""
    return family_converters().get(family_of_model(model))


def family_converters() -> Dict[str, "Converter"]:
    """family -> its Hugging Face converter, for the families that have one (in the families' order)."""
    from lmkit.hub.converters import converter_at
    paths = {family: _declaration(family, "CONVERTER") for family in FAMILIES}
    return {family: converter_at(path) for family, path in paths.items() if path}


def model_of_hf_type(model_type: str) -> Optional[str]:
    """The ``model`` name a Hugging Face ``model_type`` loads as (None for a type no family reads)."""
    return _declared("HF_MODEL_TYPES").get(model_type)


def pretrained_models() -> Tuple[str, ...]:
    """The ``model`` names that ``--init_from`` fills from a Hugging Face folder (those its families'
    ``model_type``s load as), in the families' order."""
    return tuple(dict.fromkeys(_declared("HF_MODEL_TYPES").values()))


def is_import_path(model: str) -> bool:
    """True for ``"package.module:Class"`` (a user's model), False for a registry name."""
    return isinstance(model, str) and ":" in model


def model_class(model: str) -> Tuple[type, Dict[str, Any]]:
    """The class a config's ``model`` names and the constructor arguments the name fixes.

    Args:
      model: a name of :data:`MODELS` or an import path ``"package.module:Class"``.

    Raises:
      UsageError: an unknown name, an import path that does not resolve, or
        a class that is not a language model.
    """
    if not isinstance(model, str):
        raise UsageError(f"model = {model!r} must be a string: one of {', '.join(MODELS)} "
                         "or an import path 'package.module:Class'")
    if is_import_path(model):
        cls, fixed = import_object(model, "model"), {}
    elif model in MODELS:
        path, fixed = MODELS[model]
        cls = import_object(path, "model")
    else:
        hint = did_you_mean(model, MODELS, full=False)
        hint = f" ({hint})" if hint.startswith("did") else ""
        raise UsageError(f"unknown model {model!r}; use one of {', '.join(MODELS)}{hint} "
                         "or an import path 'package.module:Class' for your own model")
    _check_language_model(cls, model)
    return cls, dict(fixed)


def _check_language_model(cls: Any, model: str) -> None:
    if not inspect.isclass(cls):
        raise UsageError(f"model {model!r} is a {type(cls).__name__}, not a class; name a subclass "
                         "of lmkit.models.LanguageModel")
    import tensorflow as tf

    missing = [m for m in ("__call__", "initial_state", "step") if not callable(getattr(cls, m, None))]
    if not issubclass(cls, tf.Module) or missing:
        why = f"it lacks {', '.join(missing)}" if missing else "it is not a tf.Module"
        raise UsageError(f"model {model!r} ({cls.__name__}) is not a language model: {why}; "
                         "subclass lmkit.models.LanguageModel (see docs/design.md)")


class Arguments(NamedTuple):
    """The keyword arguments a config may give a model's constructor (:func:`model_arguments`)."""

    defaults: Dict[str, Any]  # name -> the constructor's default
    required: Tuple[str, ...]  # the names without a default
    open: bool  # the constructor also takes **kwargs


def model_arguments(model: str) -> Arguments:
    """The constructor arguments of the class ``model`` names, less ``name`` and those the name fixes.

    Raises:
      UsageError: as :func:`model_class`.
    """
    cls, fixed = model_class(model)
    params = inspect.signature(cls.__init__).parameters.values()
    named = [p for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
             and p.name not in ("self", "name") and p.name not in fixed]
    return Arguments(defaults={p.name: p.default for p in named if p.default is not p.empty},
                     required=tuple(p.name for p in named if p.default is p.empty),
                     open=any(p.kind is p.VAR_KEYWORD for p in params))


def _config_keys(model: str) -> List[str]:
    arguments = model_arguments(model)
    return [*arguments.required, *arguments.defaults]


def model_keys() -> List[str]:
    """Every ``model_config`` key of the built-in models (``model`` included)."""
    keys = ["model"]
    for name in MODELS:
        keys += [k for k in _config_keys(name) if k not in keys]
    return keys


def check_config(cfg: Any, source: str) -> None:
    """The checks of a :class:`lmkit.config.TrainConfig` that its model's family declares (``CONFIG_CHECK``,
    ``"module:function"`` taking ``(cfg, source)``); none for a user's model or a family without them.

    Raises:
      ConfigError: what the family finds wrong.
    """
    family = family_of_model(cfg.model.name)
    path = _declaration(family, "CONFIG_CHECK") if family else None
    if path:
        import_object(path, "config check")(cfg, source)


def build_model(model_config: Mapping[str, Any]) -> "LanguageModel":
    """Builds a language model from ``{"model": name, <constructor argument>: value}``.

    ``model`` picks the class through :data:`MODELS` (or an import path);
    every other key is the constructor argument of the same name
    (``TrainConfig.model_config()`` and ``model.get_config()`` give such
    dicts). Keys that only another built-in model takes are ignored; missing
    optional keys take the constructor's defaults.

    Args:
      model_config: the mapping.

    Returns:
      The model, with its variables created.

    Raises:
      UsageError: an unknown model or key, a missing required key, or a bad
        value (the message names it).
    """
    config = dict(model_config)
    if "model" not in config:
        raise UsageError("model_config is missing required key 'model'")
    model = config.pop("model")
    cls, fixed = model_class(model)
    arguments = model_arguments(model)
    own = set(arguments.defaults) | set(arguments.required)
    if not arguments.open:
        check_known_keys("model_config", config, own | set(model_keys()))
    kwargs = {k: v for k, v in config.items() if arguments.open or k in own}
    missing = [n for n in arguments.required if n not in kwargs]
    if missing:
        raise UsageError(f"model_config is missing required key {missing[0]!r}")
    return cls(**fixed, **kwargs)
