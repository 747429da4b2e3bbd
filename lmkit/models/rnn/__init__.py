"""The RNN family: LSTM/GRU language models (model.py) and encoder-decoders with attention (seq2seq.py).

No Hugging Face family maps onto it. Its model classes load on first use (no TensorFlow import here).
"""

import importlib
from typing import Any, Dict, Optional, Tuple

#: config ``model`` names -> ("module:Class", the constructor arguments the name fixes)
MODELS: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "lstm": ("lmkit.models.rnn.model:RNNLanguageModel", {"cell": "lstm"}),
    "gru": ("lmkit.models.rnn.model:RNNLanguageModel", {"cell": "gru"}),
}
#: the same for its encoder-decoders (conditional = True: they train on data = "pairs")
SEQ2SEQ_MODELS: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "rnn_seq2seq": ("lmkit.models.rnn.seq2seq:RNNSeq2Seq", {}),
}
#: Hugging Face ``model_type``s it reads -> the model above they load as; and their converter
HF_MODEL_TYPES: Dict[str, str] = {}
CONVERTER: Optional[str] = None

_MODULES = ('model', 'seq2seq')


def __getattr__(name: str) -> Any:  # PEP 562: lmkit.models.rnn.X, as before this folder
    for module in _MODULES:
        found = importlib.import_module(f"{__name__}.{module}")
        if hasattr(found, name):
            return getattr(found, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
