"""The Llama family (Llama, Qwen2, Mistral): the model (model.py) and its Hugging Face converter (convert.py).

RMSNorm, rotary positions, SwiGLU and grouped-query attention; the three differ by settings. Its classes
load on first use (no TensorFlow import here).
"""

import importlib
from typing import Any, Dict, Optional, Tuple

#: config ``model`` names -> ("module:Class", the constructor arguments the name fixes)
MODELS: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "llama": ("lmkit.models.llama.model:LlamaLanguageModel", {}),
}
#: Hugging Face ``model_type``s it reads -> the model above they load as; and their converter
HF_MODEL_TYPES: Dict[str, str] = {"llama": "llama", "qwen2": "llama", "mistral": "llama"}
CONVERTER: Optional[str] = "lmkit.models.llama.convert:LlamaConverter"

_MODULES = ('model', 'blocks')


def __getattr__(name: str) -> Any:  # PEP 562: lmkit.models.llama.X, as before this folder
    for module in _MODULES:
        found = importlib.import_module(f"{__name__}.{module}")
        if hasattr(found, name):
            return getattr(found, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
