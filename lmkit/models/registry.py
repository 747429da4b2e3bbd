"""The registry of model families: a config's ``model`` name -> the class that builds it (no TensorFlow import).

A family is one folder, ``lmkit/models/<family>/``: its model, its Hugging
Face converter (``convert.py``, :class:`lmkit.hub.converters.Converter`)
and an ``__init__.py`` that declares, as plain data, the ``model`` names it
builds (``MODELS``, and ``SEQ2SEQ_MODELS`` for encoder-decoders), the
Hugging Face ``model_type``s it reads (``HF_MODEL_TYPES``, each with the
model it loads as) and its converter (``CONVERTER``, ``"module:Class"``).
:data:`FAMILIES` lists the families, one line each; everything else here is
assembled from them.

:data:`MODELS` maps a config's ``model`` name to the class that builds it
(as ``"module:Class"``, imported only when used) and the constructor
arguments the name fixes. A config may also name a user's own class by
import path, ``model = "my_pkg.my_module:MyLM"``; it is stored in the run's
``config.json``, so generation and resume rebuild it without the user's
script.

:func:`build_model` turns a ``model_config`` (``TrainConfig.model_config()``
or ``model.get_config()``) into a model: every key is a constructor argument
of the class, except ``keep_prob`` (the constructors take
``dropout = 1 - keep_prob``). Keys checked against the constructor: an
unknown key is an error naming the closest known one; a key that only
another built-in model takes is ignored, so one config dict serves all.
"""

from __future__ import annotations

import importlib
import inspect
from types import ModuleType
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

from lmkit.core.checks import check_known_keys, did_you_mean
from lmkit.core.errors import UsageError
from lmkit.core.registry import import_object

if TYPE_CHECKING:  # pragma: no cover
    from lmkit.hub.converters import Converter
    from lmkit.models.protocols import LanguageModel

__all__ = ["CONVERTERS", "FAMILIES", "MODELS", "build_model", "converter_of_model", "family_converters",
           "family_of_model", "family_package", "is_import_path", "model_class", "model_keys", "model_of_hf_type",
           "pretrained_models"]

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


# Constructor arguments that no config sets (the module name) or that a
# config spells differently (dropout = 1 - keep_prob).
_NOT_CONFIG_KEYS = ("name", "dropout")


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


def _constructor_params(cls: type) -> Dict[str, inspect.Parameter]:
    """The keyword arguments of ``cls``'s constructor."""
    params = inspect.signature(cls.__init__).parameters
    return {n: p for n, p in params.items()
            if n != "self" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def _config_keys(cls: type, fixed: Mapping[str, Any]) -> List[str]:
    params = _constructor_params(cls)
    keys = [k for k in params if k not in _NOT_CONFIG_KEYS and k not in fixed]
    if "dropout" in params:
        keys.append("keep_prob")
    return keys


def model_keys() -> List[str]:
    """Every ``model_config`` key of the built-in models (``model`` included)."""
    keys = ["model"]
    for name in MODELS:
        cls, fixed = model_class(name)
        keys += [k for k in _config_keys(cls, fixed) if k not in keys]
    return keys


def build_model(model_config: Mapping[str, Any]) -> "LanguageModel":
    """Builds a language model from ``TrainConfig.model_config()`` keys.

    ``model`` picks the class through :data:`MODELS` (or an import path);
    ``dropout`` is ``1 - keep_prob``; every other key is the constructor
    argument of the same name (``embedding_dim`` 0 means ``hidden_size``,
    ``ffn_dim`` 0 means ``4 * hidden_size``). Keys that only another
    built-in model takes are ignored; missing optional keys take the
    constructor's defaults. ``model.get_config()`` is a valid
    ``model_config``.

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
    cls, fixed = model_class(config.pop("model"))
    own = _config_keys(cls, fixed)
    check_known_keys("model_config", config, set(own) | set(model_keys()))
    params = _constructor_params(cls)
    kwargs = {k: v for k, v in config.items() if k in own and k != "keep_prob"}
    if "keep_prob" in config and "dropout" in params:
        keep_prob = config["keep_prob"]
        if isinstance(keep_prob, bool) or not isinstance(keep_prob, (int, float)) \
                or not 0.0 < keep_prob <= 1.0:
            raise UsageError(f"keep_prob {keep_prob!r} must be in (0, 1]")
        kwargs["dropout"] = max(0.0, 1.0 - float(keep_prob))
    missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty
               and n not in kwargs and n not in fixed]
    if missing:
        raise UsageError(f"model_config is missing required key {missing[0]!r}")
    return cls(**fixed, **kwargs)
