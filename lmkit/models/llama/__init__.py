"""The Llama family (Llama, Qwen2, Mistral): the model (model.py) and its Hugging Face converter (convert.py).

RMSNorm, rotary positions, SwiGLU and grouped-query attention; the three differ by settings. Its classes
load on first use (no TensorFlow import here).
"""

from typing import Any, Dict, Optional, Tuple

from lmkit.core.registry import lazy_attributes

#: config ``model`` names -> ("module:Class", the constructor arguments the name fixes)
MODELS: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "llama": ("lmkit.models.llama.model:LlamaLanguageModel", {}),
}
#: Hugging Face ``model_type``s it reads -> the model above they load as; and their converter
HF_MODEL_TYPES: Dict[str, str] = {"llama": "llama", "qwen2": "llama", "mistral": "llama"}
CONVERTER: Optional[str] = "lmkit.models.llama.convert:LlamaConverter"

__getattr__ = lazy_attributes(__name__, ('model', 'blocks'))  # PEP 562: the classes load on first use
