"""The GPT-2 family: lmkit's transformer language model (model.py) and its Hugging Face converter (convert.py).

Its classes load on first use (no TensorFlow import here).
"""

from typing import Any, Dict, Optional, Tuple

from lmkit.core.registry import lazy_attributes

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
CONFIG_CHECK: Optional[str] = "lmkit.models.gpt2.checks:check_config"  # the checks of a training config

__getattr__ = lazy_attributes(__name__, ('model',))  # PEP 562: the classes load on first use
