"""The RNN family: LSTM/GRU language models (model.py) and encoder-decoders with attention (seq2seq.py).

No Hugging Face family maps onto it. Its model classes load on first use (no TensorFlow import here).
"""

from typing import Any, Dict, Optional, Tuple

from lmkit.core.registry import lazy_attributes

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
CONFIG_CHECK: Optional[str] = "lmkit.models.rnn.checks:check_config"  # the checks of a training config

__getattr__ = lazy_attributes(__name__, ('model', 'seq2seq'))  # PEP 562: the classes load on first use
