"""Gemma language models: lmkit's Llama with Gemma's settings (Hugging Face's ``GemmaForCausalLM``).

What sets Gemma apart from Llama is a choice of settings of the same blocks:
the feed-forward gates with gelu in its tanh form (GeGLU), the token
embeddings are multiplied by ``sqrt(hidden_size)`` before the first layer,
the head size is its own (``head_dim``, not ``hidden_size // num_heads``),
the softmax shares the embedding table, and one ``attention_bias`` puts a
bias on all four attention projections. Gemma's RMSNorms compute
``x / rms(x) * (1 + weight)``; lmkit's compute ``x / rms(x) * scale``, and
:mod:`lmkit.models.gemma.convert` stores ``scale = 1 + weight``, so the
variables (and checkpoints) are those of the ``llama`` model.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional, Union

from lmkit.core.checks import check_positive_int
from lmkit.models.llama.model import LlamaLanguageModel

__all__ = ["GemmaLanguageModel"]

#: get_config keys of the llama model that a Gemma does not take (it has no window, one attention bias)
_LLAMA_ONLY = ("sliding_window", "layer_types", "qkv_bias", "attention_output_bias")


class GemmaLanguageModel(LlamaLanguageModel):
    """A Gemma decoder-only language model (the ``gemma`` entry of :data:`lmkit.models.MODELS`).

    Its variables, cache and decoding are the ``llama`` model's
    (:class:`~lmkit.models.llama.model.LlamaLanguageModel`); only the
    defaults and the config differ.
    """

    def __init__(self, *, vocab_size: int, hidden_size: int, num_layers: int = 2, num_heads: int = 4,
                 num_kv_heads: int = 0, head_dim: int = 0, ffn_dim: int = 0, max_positions: int = 8192,
                 rope_theta: float = 10000.0, rope_scaling: Optional[Mapping[str, Any]] = None,
                 attention_bias: bool = False, rms_norm_epsilon: float = 1e-6, tie_weights: bool = True,
                 activation: str = "gelu", dropout: float = 0.0, init_scale: float = 0.02,
                 attention_blocks: Union[int, str] = "auto", embedding_scale: float = 0.0,
                 name: Optional[str] = None) -> None:
        """Creates the embedder, the decoder and the softmax layer.

        Args:
          vocab_size: number of token ids.
          hidden_size: model size.
          num_layers: decoder layers.
          num_heads: query heads.
          num_kv_heads: key/value heads (grouped-query attention; Gemma 2B has 1); 0 = ``num_heads``.
          head_dim: features per head (Gemma's 256); 0 = ``hidden_size // num_heads``.
          ffn_dim: the gated feed-forward's inner size; 0 = ``8 * hidden_size`` (Gemma's ratio).
          max_positions: longest sequence (and cache).
          rope_theta: the rotary embedding's base.
          rope_scaling: None, or ``{"rope_type": "linear" | "llama3", "factor": ..., ...}``.
          attention_bias: biases on the query, key, value and output projections.
          rms_norm_epsilon: added to the mean square in every RMSNorm.
          tie_weights: share the embedding table with the softmax kernel (Gemma's do).
          activation: the feed-forward gate's: ``"gelu"`` (the tanh form, Gemma's
            ``gelu_pytorch_tanh``) or ``"silu"``.
          dropout: on residual branches and attention probabilities while training.
          init_scale: kernels and embeddings from uniform(-init_scale, init_scale).
          attention_blocks: as :class:`~lmkit.models.llama.model.LlamaLanguageModel`'s.
          embedding_scale: the token embeddings are multiplied by it before the
            first layer; 0 = ``sqrt(hidden_size)`` (Gemma's).
          name: module name.
        """
        hidden_size = check_positive_int("hidden_size", hidden_size)
        gemma_scale = math.sqrt(hidden_size)
        super().__init__(
            vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
            num_kv_heads=num_kv_heads, head_dim=head_dim, ffn_dim=ffn_dim or 8 * hidden_size,
            max_positions=max_positions, rope_theta=rope_theta, rope_scaling=rope_scaling,
            qkv_bias=attention_bias, attention_output_bias=attention_bias, rms_norm_epsilon=rms_norm_epsilon,
            tie_weights=tie_weights, activation=activation, dropout=dropout, init_scale=init_scale,
            attention_blocks=attention_blocks, embedding_scale=embedding_scale or gemma_scale,
            name=name)
        self.attention_bias = bool(attention_bias)
        self.default_embedding_scale = gemma_scale

    def get_config(self) -> Dict[str, Any]:
        """``lmkit.models.build_model`` keys (``model = "gemma"``); ``build_model`` of them rebuilds this model."""
        config = {k: v for k, v in super().get_config().items() if k not in _LLAMA_ONLY}
        config.update(model="gemma", attention_bias=self.attention_bias)
        config.pop("embedding_scale", None)
        if self.embedding_scale != self.default_embedding_scale:  # absent at Gemma's own
            config["embedding_scale"] = self.embedding_scale
        return config
