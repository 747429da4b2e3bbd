"""Llama-family language models: token embeddings -> Llama decoder -> softmax.

One class covers Hugging Face's ``LlamaForCausalLM`` (Llama 2/3, TinyLlama,
SmolLM), ``Qwen2ForCausalLM`` (biases on q/k/v, tied embeddings in the small
ones) and ``MistralForCausalLM`` (a sliding attention window);
:mod:`lmkit.models.llama.convert` maps their checkpoints onto it. Positions are rotary
(no position table), so ``max_positions`` only bounds the cache.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import tensorflow as tf

from lmkit.core.checks import check_non_negative_int, check_positive_float, check_positive_int, check_rate
from lmkit.core.errors import UsageError
from lmkit.layers.base import Training, dropout, plain, uniform_initializer
from lmkit.layers.documents import documents_of
from lmkit.layers.embeddings import WordEmbedder
from lmkit.layers.projection import OutputProjection
from lmkit.layers.transformer import TransformerState
from lmkit.models.llama.blocks import LlamaDecoder
from lmkit.models.protocols import LanguageModel, check_window

__all__ = ["LlamaLanguageModel", "default_ffn_dim"]

_LAYER_TYPES = ("full_attention", "sliding_attention")


def default_ffn_dim(hidden_size: int) -> int:
    """Llama's rule: 8/3 of the model size, rounded up to a multiple of 64."""
    return -(-(8 * hidden_size // 3) // 64) * 64


class LlamaLanguageModel(LanguageModel):
    """A Llama-style decoder-only language model (the ``llama`` entry of :data:`lmkit.models.MODELS`).

    ``stateful`` is False (windows are independent); generation prefills and
    steps a key/value cache exactly as :class:`~lmkit.models.TransformerLanguageModel`
    does, with the same :class:`~lmkit.layers.TransformerState`.

    Args:
      vocab_size: number of token ids.
      hidden_size: model size.
      num_layers: decoder layers.
      num_heads: query heads.
      num_kv_heads: key/value heads (grouped-query attention); 0 = ``num_heads``.
      head_dim: features per head; 0 = ``hidden_size // num_heads``.
      ffn_dim: the gated feed-forward's inner size; 0 = :func:`default_ffn_dim`.
      max_positions: longest sequence (and cache).
      rope_theta: the rotary embedding's base.
      rope_scaling: None, or ``{"rope_type": "linear" | "llama3", "factor": ..., ...}``.
      sliding_window: positions a query sees (0 = all).
      layer_types: per layer ``"full_attention"`` or ``"sliding_attention"``
        (Qwen2's); None = every layer slides when ``sliding_window`` is set.
      qkv_bias: biases on the query/key/value projections (Qwen2, Llama's ``attention_bias``).
      attention_output_bias: a bias on the attention output projection (Llama's ``attention_bias``).
      rms_norm_epsilon: added to the mean square in every RMSNorm.
      tie_weights: share the embedding table with the softmax kernel.
      activation: the feed-forward gate's activation (``"silu"``).
      dropout: on residual branches and attention probabilities while training.
      init_scale: kernels and embeddings from uniform(-init_scale, init_scale).
      attention_blocks: a training window's attention in this many query
        blocks that skip the masked keys (and, with a sliding window, the
        keys before it); 1 = the whole window at once; ``"auto"`` (default):
        4 blocks for windows of at least 1024 positions, else 1. The results
        are the same (``attention_blocks=4`` in a config's model section).
      embedding_scale: the token embeddings are multiplied by it before the
        first layer (Gemma's ``sqrt(hidden_size)``); the tied softmax uses
        the table as it is.
      name: module name.
    """

    stateful = False
    lora_targets = ("query", "value")  # PEFT's default for Llama models (q_proj, v_proj)

    def __init__(self, *, vocab_size: int, hidden_size: int, num_layers: int = 2, num_heads: int = 4,
                 num_kv_heads: int = 0, head_dim: int = 0, ffn_dim: int = 0, max_positions: int = 2048,
                 rope_theta: float = 10000.0, rope_scaling: Optional[Mapping[str, Any]] = None,
                 sliding_window: int = 0, layer_types: Optional[Sequence[str]] = None,
                 qkv_bias: bool = False, attention_output_bias: bool = False,
                 rms_norm_epsilon: float = 1e-6, tie_weights: bool = False, activation: str = "silu",
                 dropout: float = 0.0, init_scale: float = 0.02, attention_blocks: Union[int, str] = "auto",
                 embedding_scale: float = 1.0, name: Optional[str] = None) -> None:
        """Creates the embedder, the decoder and the softmax layer."""
        super().__init__(name=name)
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.hidden_size = check_positive_int("hidden_size", hidden_size)
        self.num_kv_heads = check_non_negative_int("num_kv_heads", num_kv_heads, "0 means num_heads") or num_heads
        self.head_dim = check_non_negative_int("head_dim", head_dim, "0 means hidden_size // num_heads")
        self.ffn_dim = (check_non_negative_int("ffn_dim", ffn_dim, "0 means 8/3 hidden_size")
                        or default_ffn_dim(hidden_size))
        self.sliding_window = check_non_negative_int("sliding_window", sliding_window, "0 means none")
        if layer_types is not None:
            layer_types = list(layer_types)
            bad = [t for t in layer_types if t not in _LAYER_TYPES]
            if bad or len(layer_types) != num_layers:
                raise UsageError(f"layer_types must list {num_layers} of {', '.join(_LAYER_TYPES)}; got "
                                 f"{layer_types!r}")
        self.layer_types = layer_types
        windows: List[Optional[int]] = [
            self.sliding_window or None if (layer_types is None or t == "sliding_attention") else None
            for t in (layer_types or [None] * num_layers)]
        self.rms_norm_epsilon = check_positive_float("rms_norm_epsilon", rms_norm_epsilon)
        self.dropout = check_rate("dropout", dropout)
        self.init_scale = check_positive_float("init_scale", init_scale)
        self.tie_weights = bool(tie_weights)
        self.embedding_scale = check_positive_float("embedding_scale", embedding_scale)
        initializer = uniform_initializer(init_scale)
        with self.name_scope:
            self.embedder = WordEmbedder(vocab_size=vocab_size, dim=hidden_size, initializer=initializer,
                                         name="embedder")
            self.decoder = LlamaDecoder(
                num_layers=num_layers, dim=hidden_size, num_heads=num_heads, ffn_dim=self.ffn_dim,
                num_kv_heads=self.num_kv_heads, head_dim=self.head_dim or None, rope_theta=rope_theta,
                rope_scaling=rope_scaling, sliding_windows=windows, qkv_bias=qkv_bias,
                output_bias=attention_output_bias, norm_epsilon=rms_norm_epsilon, activation=activation,
                max_positions=max_positions, dropout=dropout, init_scale=init_scale,
                attention_blocks=attention_blocks, name="decoder")
            self.projection = OutputProjection(dim=hidden_size, vocab_size=vocab_size,
                                               tied_embedder=self.embedder if self.tie_weights else None,
                                               use_bias=False, initializer=initializer, name="projection")

    @property
    def max_positions(self) -> int:
        return self.decoder.max_positions

    def initial_state(self, batch_size: Union[int, tf.Tensor],
                      max_length: Optional[int] = None) -> TransformerState:
        """An empty key/value cache for ``max_length`` tokens (``max_positions`` when None)."""
        return self.decoder.initial_state(batch_size, max_length)

    def __call__(self, ids: tf.Tensor, state: Optional[TransformerState] = None, training: Training = False, *,
                 positions: Optional[tf.Tensor] = None,
                 segment_ids: Optional[tf.Tensor] = None) -> Tuple[tf.Tensor, Optional[TransformerState]]:
        """ids [batch, time] -> (logits [batch, time, vocab] float32, state or None), as the transformer's
        (``positions`` and ``segment_ids`` too: a packed window's)."""
        ids = check_window(ids, state, self.max_positions)
        x = dropout(self.embed(ids), self.dropout, training)
        outputs, state = self.decoder(x, state, training, documents_of(segment_ids, positions, state))
        return self.projection(outputs), state

    def step(self, ids: tf.Tensor, state: TransformerState) -> Tuple[tf.Tensor, TransformerState]:
        """One cached step: ids [batch] int32 at ``state.positions`` -> (logits [batch, vocab], state)."""
        outputs, state = self.decoder(self.embed(ids)[:, tf.newaxis, :], state, False)
        return self.projection(outputs[:, 0, :]), state

    def embed(self, ids: tf.Tensor) -> tf.Tensor:
        """ids [...] -> the decoder's inputs [..., hidden] (the embeddings, times ``embedding_scale``)."""
        x = self.embedder(ids)  # [..., hidden] in the compute dtype
        if self.embedding_scale != 1.0:  # a constant of the input's dtype, as Gemma's own scale
            x = x * tf.cast(self.embedding_scale, x.dtype)
        return x

    def get_config(self) -> Dict[str, Any]:
        """``lmkit.models.build_model`` keys (``model = "llama"``)."""
        attention = self.decoder.layers[0].attention
        config = {"model": "llama", "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
                  "num_layers": self.decoder.num_layers, "num_heads": attention.num_heads,
                  "num_kv_heads": self.num_kv_heads, "head_dim": self.head_dim, "ffn_dim": self.ffn_dim,
                  "max_positions": self.max_positions, "rope_theta": attention.rotary.theta,
                  "rope_scaling": plain(attention.rotary.scaling), "sliding_window": self.sliding_window,
                  "layer_types": plain(self.layer_types), "qkv_bias": attention.qkv_bias,
                  "attention_output_bias": attention.output_bias, "rms_norm_epsilon": self.rms_norm_epsilon,
                  "tie_weights": self.tie_weights, "activation": self.decoder.layers[0].ffn.activation,
                  "dropout": self.dropout, "init_scale": self.init_scale}
        if attention.attention_blocks != "auto":  # absent by default, as in the transformer's config
            config["attention_blocks"] = attention.attention_blocks
        if self.embedding_scale != 1.0:  # absent by default: the configs of runs before it stay as they were
            config["embedding_scale"] = self.embedding_scale
        return config
