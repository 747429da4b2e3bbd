"""Language models: the protocol, the model families (one folder each: the model and its Hugging Face
converter) and the one registry of families, :mod:`lmkit.models.registry`.

:data:`MODELS` (a config's ``model`` name -> the class that builds it) and
:func:`build_model` (a ``model_config`` -> the model) are the registry's;
its docstring says what they take. A config may also name a user's own
class by import path, ``model = "my_pkg.my_module:MyLM"``.

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
