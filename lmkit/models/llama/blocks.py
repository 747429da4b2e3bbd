"""The Llama family's layer and decoder stack, composed from the shared blocks of :mod:`lmkit.layers`.

Llama 3, Qwen2/2.5, Mistral, SmolLM and TinyLlama share one layer: RMSNorm
before attention and before a SwiGLU feed-forward block, rotary position
embeddings on queries and keys, fewer key/value heads than query heads
(grouped-query attention), no biases (Qwen2: on q/k/v) and, for Mistral, a
sliding attention window. The families differ by these settings only. The
decoder keeps the key/value cache of :mod:`lmkit.layers.attention` in the
same :class:`~lmkit.layers.transformer.TransformerState` as GPT-2's, so the
decode loop, sliding generation and beam search serve it.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.layers.attention import Attention, AttentionCache
from lmkit.layers.base import Module, Training, check_positive_int, check_rate, dropout, plain
from lmkit.layers.documents import Documents
from lmkit.layers.feedforward import GatedFeedForward
from lmkit.layers.norms import RMSNorm
from lmkit.layers.transformer import TransformerState, empty_state, run_layers

__all__ = ["LlamaDecoder", "LlamaLayer"]


class LlamaLayer(Module):
    """``x + attn(norm(x))``, then ``x + ffn(norm(x))`` with RMSNorm, grouped-query attention and SwiGLU.

    Variables: ``attention/...`` (an :class:`~lmkit.layers.attention.Attention`
    with rotary positions: ``query``, ``key``, ``value``, ``output``),
    ``attention_norm/scale``, ``ffn/...`` (:class:`~lmkit.layers.feedforward.GatedFeedForward`),
    ``ffn_norm/scale``.
    """

    def __init__(self, *, dim: int, num_heads: int, ffn_dim: int, num_kv_heads: Optional[int] = None,
                 head_dim: Optional[int] = None, rope_theta: float = 10000.0,
                 rope_scaling: Optional[Mapping[str, Any]] = None, sliding_window: Optional[int] = None,
                 qkv_bias: bool = False, output_bias: bool = False, norm_epsilon: float = 1e-6,
                 activation: str = "silu", dropout: float = 0.0, init_scale: float = 0.02,
                 attention_blocks: Union[int, str] = "auto", name: Optional[str] = None) -> None:
        """Creates the norms, the attention and the feed-forward block.

        Args:
          dim: model size.
          num_heads, num_kv_heads, head_dim: the attention's heads (``num_kv_heads`` default ``num_heads``,
            ``head_dim`` default ``dim // num_heads``).
          ffn_dim: the gated feed-forward's inner size.
          rope_theta, rope_scaling: the rotary embedding's base and scaling.
          sliding_window: None, or how many positions (the query's own included) a query sees.
          qkv_bias, output_bias: biases on the query/key/value and the output projections.
          norm_epsilon: added to the mean square in both RMSNorms.
          activation: the feed-forward gate's (``"silu"``).
          dropout: on the residual branches and the attention probabilities while training.
          init_scale: kernels from uniform(-init_scale, init_scale).
          attention_blocks: as :class:`~lmkit.layers.attention.Attention`'s.
          name: module name.
        """
        super().__init__(name=name)
        self.dropout = check_rate("dropout", dropout)
        self._config = {"dim": dim, "num_heads": num_heads, "ffn_dim": ffn_dim, "num_kv_heads": num_kv_heads,
                        "head_dim": head_dim, "rope_theta": rope_theta, "rope_scaling": rope_scaling,
                        "sliding_window": sliding_window, "qkv_bias": qkv_bias, "output_bias": output_bias,
                        "norm_epsilon": norm_epsilon, "activation": activation, "dropout": self.dropout,
                        "init_scale": init_scale, "attention_blocks": attention_blocks, "name": name}
        with self.name_scope:
            self.attention_norm = RMSNorm(dim=dim, epsilon=norm_epsilon, name="attention_norm")
            self.attention = Attention(
                dim=dim, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                rotary={"theta": rope_theta, "scaling": rope_scaling}, sliding_window=sliding_window,
                qkv_bias=qkv_bias, output_bias=output_bias, dropout=dropout, init_scale=init_scale,
                attention_blocks=attention_blocks, name="attention")
            self.ffn_norm = RMSNorm(dim=dim, epsilon=norm_epsilon, name="ffn_norm")
            self.ffn = GatedFeedForward(dim=dim, ffn_dim=ffn_dim, activation=activation, init_scale=init_scale,
                                        name="ffn")

    def __call__(self, inputs: tf.Tensor, training: Training = False, cache: Optional[AttentionCache] = None,
                 positions: Optional[tf.Tensor] = None,
                 documents: Optional[Documents] = None) -> Tuple[tf.Tensor, Optional[AttentionCache]]:
        """inputs [batch, time, dim] -> ``(outputs [batch, time, dim], cache)``; arguments as
        :meth:`lmkit.layers.attention.Attention.__call__`'s."""
        attended, cache = self.attention(self.attention_norm(inputs), training, cache, positions,
                                         documents=documents)
        x = inputs + dropout(attended, self.dropout, training)
        x = x + dropout(self.ffn(self.ffn_norm(x), training), self.dropout, training)
        return x, cache

    def get_config(self) -> Dict[str, Any]:
        return plain(self._config)


class LlamaDecoder(Module):
    """A stack of :class:`LlamaLayer` s and a final RMSNorm, with the cached decoding of
    :class:`lmkit.layers.TransformerDecoder` (same :class:`~lmkit.layers.transformer.TransformerState`).

    ``sliding_windows`` gives each layer its window (None = full attention), as
    Mistral (every layer) or Qwen2's ``layer_types`` do.

    Variables: ``layer_<i>/...`` per layer and ``final_norm/scale``.
    """

    def __init__(self, *, num_layers: int, dim: int, num_heads: int, ffn_dim: int,
                 num_kv_heads: Optional[int] = None, head_dim: Optional[int] = None, rope_theta: float = 10000.0,
                 rope_scaling: Optional[Mapping[str, Any]] = None,
                 sliding_windows: Optional[Sequence[Optional[int]]] = None, qkv_bias: bool = False,
                 output_bias: bool = False, norm_epsilon: float = 1e-6, activation: str = "silu",
                 max_positions: int = 2048, dropout: float = 0.0, init_scale: float = 0.02,
                 attention_blocks: Union[int, str] = "auto", name: Optional[str] = None) -> None:
        """Creates the layers (arguments as :class:`LlamaLayer`'s; ``max_positions`` bounds the cache)."""
        super().__init__(name=name)
        self.num_layers = check_positive_int("num_layers", num_layers)
        self.max_positions = check_positive_int("max_positions", max_positions)
        windows = list(sliding_windows) if sliding_windows is not None else [None] * num_layers
        if len(windows) != num_layers:
            raise UsageError(f"sliding_windows has {len(windows)} entries for {num_layers} layers")
        self._config = {"num_layers": num_layers, "dim": dim, "num_heads": num_heads, "ffn_dim": ffn_dim,
                        "num_kv_heads": num_kv_heads, "head_dim": head_dim, "rope_theta": rope_theta,
                        "rope_scaling": rope_scaling, "sliding_windows": windows, "qkv_bias": qkv_bias,
                        "output_bias": output_bias, "norm_epsilon": norm_epsilon, "activation": activation,
                        "max_positions": max_positions, "dropout": dropout, "init_scale": init_scale,
                        "attention_blocks": attention_blocks, "name": name}
        with self.name_scope:
            self.layers = [
                LlamaLayer(dim=dim, num_heads=num_heads, ffn_dim=ffn_dim, num_kv_heads=num_kv_heads,
                           head_dim=head_dim, rope_theta=rope_theta, rope_scaling=rope_scaling,
                           sliding_window=windows[i], qkv_bias=qkv_bias, output_bias=output_bias,
                           norm_epsilon=norm_epsilon, activation=activation, dropout=dropout,
                           init_scale=init_scale, attention_blocks=attention_blocks, name=f"layer_{i}")
                for i in range(num_layers)]
            self.final_norm = RMSNorm(dim=dim, epsilon=norm_epsilon, name="final_norm")

    def initial_state(self, batch_size: Union[int, tf.Tensor], max_length: Optional[int] = None) -> TransformerState:
        """An empty cache of ``max_length`` (default ``max_positions``) positions."""
        return empty_state([layer.attention for layer in self.layers], batch_size, max_length, self.max_positions)

    def __call__(self, inputs: tf.Tensor, state: Optional[TransformerState] = None, training: Training = False,
                 documents: Optional[Documents] = None) -> Tuple[tf.Tensor, Optional[TransformerState]]:
        """Runs the stack over ``inputs`` [batch, time, dim]; a state's cache is extended, a packed window's
        ``documents`` attend apart (as TransformerDecoder's)."""
        x, state = run_layers(self.layers, inputs, state, training, documents)
        return self.final_norm(x), state

    def get_config(self) -> Dict[str, Any]:
        return plain(self._config)
