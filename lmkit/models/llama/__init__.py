"""The Llama family (Llama, Qwen2, Mistral): the model (model.py) and its Hugging Face converter.

Its model classes load on first use (no TensorFlow import here).
"""

import importlib
from typing import Any

_MODULES = ('model',)


def __getattr__(name: str) -> Any:  # PEP 562: lmkit.models.llama.X, as before this folder
    for module in _MODULES:
        found = importlib.import_module(f"{__name__}.{module}")
        if hasattr(found, name):
            return getattr(found, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
