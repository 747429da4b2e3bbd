"""The RNN family: LSTM/GRU language models (model.py) and encoder-decoders with attention (seq2seq.py).

Its model classes load on first use (no TensorFlow import here).
"""

import importlib
from typing import Any

_MODULES = ('model', 'seq2seq')


def __getattr__(name: str) -> Any:  # PEP 562: lmkit.models.rnn.X, as before this folder
    for module in _MODULES:
        found = importlib.import_module(f"{__name__}.{module}")
        if hasattr(found, name):
            return getattr(found, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
