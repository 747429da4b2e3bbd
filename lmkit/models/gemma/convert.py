"""Hugging Face Gemma folders (``GemmaForCausalLM``) onto lmkit's ``gemma`` model, and ``gemma`` runs back.

A Gemma folder holds Llama's tensors under Llama's names and most of its
keys, so the converter is Llama's with what differs:

- the config: transformers' Gemma defaults (a tied softmax, ``head_dim``
  256, ...), a GeGLU gate (``hidden_act`` or, in older folders,
  ``hidden_activation``), one ``attention_bias`` for the four projections and
  no sliding window; the embeddings' ``sqrt(hidden_size)`` is not in it (the
  model's default);
- the norms: Gemma's RMSNorm multiplies by ``1 + weight`` where lmkit's
  multiplies by ``scale``, so a norm's ``weight`` loads as ``scale = 1 + weight``
  and exports as ``scale - 1`` (both in float32, as Gemma computes ``1 + weight``;
  for scales in [0.5, 2] the export gives transformers back lmkit's scale exactly).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List

from lmkit.core.errors import UsageError
from lmkit.hub.weights import Port, shifted
from lmkit.models.llama.convert import LlamaConverter

__all__ = ["GemmaConverter"]

#: Hugging Face gate activations -> lmkit's (``gelu`` is the tanh form in both)
_GATES = {"gelu_pytorch_tanh": "gelu", "gelu_new": "gelu", "silu": "silu"}
_HF_GATES = {"gelu": "gelu_pytorch_tanh", "silu": "silu"}


def _gate(config: Dict[str, Any], path: str) -> str:
    """lmkit's gate activation of a Gemma ``config.json`` (its ``hidden_act``).

    Gemma's first folders wrote ``hidden_act = "gelu"`` meaning the tanh form, and transformers computes
    that; they may add ``hidden_activation``, which transformers 4 reads instead (transformers 5 ignores
    it), so it must name the same gate.
    """
    act = config.get("hidden_act")
    gates = {**_GATES, "gelu": "gelu"}
    if act not in gates:
        raise UsageError(f"{path}: hidden_act {act!r} is not supported (lmkit's gemma gates its feed-forward "
                         f"with {', '.join(sorted(gates))})")
    other = config.get("hidden_activation")
    if other is not None and _GATES.get(other) != gates[act]:
        raise UsageError(f"{path}: hidden_activation {other!r} is not the gate of hidden_act {act!r}, and "
                         "transformers 4 reads the one, 5 the other; make them agree (e.g. both "
                         "'gelu_pytorch_tanh')")
    return gates[act]


class GemmaConverter(LlamaConverter):
    """Gemma folders onto lmkit's ``gemma`` model, and ``gemma`` runs back."""

    title = "Gemma"
    model = "gemma"
    architectures = {"gemma": "GemmaForCausalLM"}
    #: transformers' GemmaConfig defaults for the keys a config.json may leave out (Llama's differ)
    defaults = {"head_dim": 256, "num_key_value_heads": 16, "max_position_embeddings": 8192,
                "tie_word_embeddings": True, "hidden_act": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6}

    def config_in(self, config: Dict[str, Any], path: str) -> Dict[str, Any]:
        activation = _gate(config, path)
        if config.get("use_bidirectional_attention"):
            raise UsageError(f"{path}: use_bidirectional_attention = true is not supported (lmkit's gemma is a "
                             "causal language model)")
        return {**self.decoder_in(config, path), "attention_bias": bool(config.get("attention_bias", False)),
                "activation": activation}

    def config_out(self, arguments: Dict[str, Any]) -> Dict[str, Any]:
        """Raises UsageError for an ``embedding_scale`` other than ``sqrt(hidden_size)``, which Gemma does
        not store."""
        hidden = arguments["hidden_size"]
        if arguments.get("embedding_scale", math.sqrt(hidden)) != math.sqrt(hidden):
            raise UsageError(f"embedding_scale = {arguments['embedding_scale']!r}: a Gemma folder multiplies the "
                             f"embeddings by sqrt(hidden_size) = {math.sqrt(hidden):g}; train without embedding_scale")
        activation = _HF_GATES[arguments.get("activation", "gelu")]
        return {**self.decoder_out(arguments), "hidden_act": activation, "hidden_activation": activation,
                "attention_bias": bool(arguments.get("attention_bias")),
                "pad_token_id": None}  # not Gemma's default 0: the tokenizer's, or none

    def weights(self, model: Any) -> List[Port]:
        # Gemma's norm weight w scales by 1 + w: lmkit's scale is 1 + w (float32, as Gemma adds)
        return [shifted(port, 1.0) if port.names[0].endswith("norm.weight") else port
                for port in super().weights(model)]
