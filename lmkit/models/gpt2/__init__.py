"""The GPT-2 family: lmkit's transformer language model (model.py) and its Hugging Face converter (convert.py).

Its classes load on first use (no TensorFlow import here).
"""

import importlib
from typing import Any, Dict, Optional, Tuple

#: config ``model`` names -> ("module:Class", the constructor arguments the name fixes)
MODELS: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "transformer": ("lmkit.models.gpt2.model:TransformerLanguageModel", {}),
    # GPT-2's architecture: tied softmax without bias, learned positions, pre-layer-norm
    "gpt2": ("lmkit.models.gpt2.model:TransformerLanguageModel",
             {"tie_weights": True, "pre_layer_norm": True, "position_embedding": "learned",
              "output_bias": False}),
}
#: Hugging Face ``model_type``s it reads -> the model above they load as; and their converter
HF_MODEL_TYPES: Dict[str, str] = {"gpt2": "gpt2"}
CONVERTER: Optional[str] = "lmkit.models.gpt2.convert:GPT2Converter"

_MODULES = ('model',)


def __getattr__(name: str) -> Any:  # PEP 562: lmkit.models.gpt2.X, as before this folder
    for module in _MODULES:
        found = importlib.import_module(f"{__name__}.{module}")
        if hasattr(found, name):
            return getattr(found, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
