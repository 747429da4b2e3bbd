"""The BART family: lmkit's transformer encoder-decoder (model.py) and its Hugging Face converter (convert.py).

Its classes load on first use (no TensorFlow import here).
"""

import importlib
from typing import Any, Dict, Optional, Tuple

#: config ``model`` names of its encoder-decoders (conditional = True: they train on data = "pairs") ->
#: ("module:Class", the constructor arguments the name fixes)
SEQ2SEQ_MODELS: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "transformer_seq2seq": ("lmkit.models.bart.model:TransformerSeq2Seq", {}),
}
#: Hugging Face ``model_type``s it reads -> the model above they load as; and their converter
HF_MODEL_TYPES: Dict[str, str] = {"bart": "transformer_seq2seq"}
CONVERTER: Optional[str] = "lmkit.models.bart.convert:BartConverter"

_MODULES = ('model',)


def __getattr__(name: str) -> Any:  # PEP 562: lmkit.models.bart.X, as before this folder
    for module in _MODULES:
        found = importlib.import_module(f"{__name__}.{module}")
        if hasattr(found, name):
            return getattr(found, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
