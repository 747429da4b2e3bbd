"""The Gemma family: the model (model.py) and its Hugging Face converter (convert.py).

Gemma is a Llama with other settings: a GeGLU feed-forward (the gate's gelu
in its tanh form), embeddings multiplied by ``sqrt(hidden_size)``, a head
size of its own and a tied softmax. Its RMSNorms scale by ``1 + weight``;
the converter stores ``1 + weight`` as lmkit's ``scale``, so the model is
lmkit's Llama. Its classes load on first use (no TensorFlow import here).
"""

import importlib
from typing import Any, Dict, Optional, Tuple

#: config ``model`` names -> ("module:Class", the constructor arguments the name fixes)
MODELS: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "gemma": ("lmkit.models.gemma.model:GemmaLanguageModel", {}),
}
#: Hugging Face ``model_type``s it reads -> the model above they load as; and their converter
HF_MODEL_TYPES: Dict[str, str] = {"gemma": "gemma"}
CONVERTER: Optional[str] = "lmkit.models.gemma.convert:GemmaConverter"

_MODULES = ('model',)


def __getattr__(name: str) -> Any:  # PEP 562: lmkit.models.gemma.GemmaLanguageModel, loaded on first use
    for module in _MODULES:
        found = importlib.import_module(f"{__name__}.{module}")
        if hasattr(found, name):
            return getattr(found, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
