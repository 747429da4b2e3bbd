"""The BART family: lmkit's transformer encoder-decoder (model.py) and its Hugging Face converter (convert.py).

Its classes load on first use (no TensorFlow import here).
"""

from typing import Any, Dict, Optional, Tuple

from lmkit.core.registry import lazy_attributes

#: config ``model`` names of its encoder-decoders (conditional = True: they train on data = "pairs") ->
#: ("module:Class", the constructor arguments the name fixes)
SEQ2SEQ_MODELS: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "transformer_seq2seq": ("lmkit.models.bart.model:TransformerSeq2Seq", {}),
}
#: Hugging Face ``model_type``s it reads -> the model above they load as; and their converter
HF_MODEL_TYPES: Dict[str, str] = {"bart": "transformer_seq2seq"}
CONVERTER: Optional[str] = "lmkit.models.bart.convert:BartConverter"

__getattr__ = lazy_attributes(__name__, ('model',))  # PEP 562: the classes load on first use
