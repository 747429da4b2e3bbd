"""Language models: the protocol, the model families (one folder each: the model and its Hugging Face
converter) and the one registry of families, :mod:`lmkit.models.registry`.

:data:`MODELS` maps a config's ``model`` name to the class that builds it
(as ``"module:Class"``, imported only when used) and the constructor
arguments the name fixes. A config may also name a user's own class by
import path, ``model = "my_pkg.my_module:MyLM"``; it is stored in the run's
``config.json``, so generation and resume rebuild it without the user's
script. The registry is :mod:`lmkit.models.registry`.

:func:`build_model` turns a ``model_config`` (``TrainConfig.model_config()``
or ``model.get_config()``) into a model: ``model`` is the name, every other
key a constructor argument of the class. Keys checked against the
constructor: an unknown key is an error naming the closest known one; a key
that only another built-in model takes is ignored, so one config dict
serves all.

Importing this package does not import TensorFlow; the classes load on
first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from lmkit.models.build import load_pretrained
from lmkit.models.registry import FAMILIES, MODELS, build_model, is_import_path, model_class, model_keys

__all__ = [
    "FAMILIES",
    "MODELS",
    "LanguageModel",
    "LlamaLanguageModel",
    "RNNLanguageModel",
    "TransformerLanguageModel",
    "build_model",
    "is_import_path",
    "load_pretrained",
    "model_class",
    "model_keys",
]

_LAZY = {
    "LanguageModel": "lmkit.models.protocols",
    "RNNLanguageModel": "lmkit.models.rnn.model",
    "TransformerLanguageModel": "lmkit.models.gpt2.model",
    "LlamaLanguageModel": "lmkit.models.llama.model",
}


def __getattr__(name: str) -> Any:  # PEP 562: the classes import TensorFlow, load them on use
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lmkit.models' has no attribute {name!r}")
