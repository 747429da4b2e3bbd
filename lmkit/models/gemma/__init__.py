"""The Gemma family: the model (model.py) and its Hugging Face converter (convert.py).

Gemma is a Llama with other settings: a GeGLU feed-forward (the gate's gelu
in its tanh form), embeddings multiplied by ``sqrt(hidden_size)``, a head
size of its own and a tied softmax. Its RMSNorms scale by ``1 + weight``;
the converter stores ``1 + weight`` as lmkit's ``scale``, so the model is
lmkit's Llama. Its classes load on first use (no TensorFlow import here).
"""

from typing import Any, Dict, Optional, Tuple

from lmkit.core.registry import lazy_attributes

#: config ``model`` names -> ("module:Class", the constructor arguments the name fixes)
MODELS: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "gemma": ("lmkit.models.gemma.model:GemmaLanguageModel", {}),
}
#: Hugging Face ``model_type``s it reads -> the model above they load as; and their converter
HF_MODEL_TYPES: Dict[str, str] = {"gemma": "gemma"}
CONVERTER: Optional[str] = "lmkit.models.gemma.convert:GemmaConverter"

__getattr__ = lazy_attributes(__name__, ('model',))  # PEP 562: the classes load on first use
