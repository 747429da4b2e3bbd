"""Transformer blocks for conditional generation: a bidirectional encoder and a decoder that attends to it.

Both attend with :class:`~lmkit.layers.attention.Attention`: not causal with
separate ``query`` and fused ``key_value`` projections for the encoder's
self-attention and the decoder's attention to the encoder, whose keys and
values are computed once per source (:meth:`TransformerCrossDecoder.memory`)
and reused at every decoding step.

* :class:`TransformerEncoderLayer`, :class:`TransformerEncoder`: bidirectional
  self-attention over a padded source ``[batch, source_time, dim]`` with a
  ``[batch, source_time]`` mask.
* :class:`CrossAttentionLayer`, :class:`TransformerCrossDecoder`: causal
  self-attention (with the key/value cache of :mod:`lmkit.layers.attention`),
  attention to the encoder's outputs, and a feed-forward block.

Pre-layer-norm (``x + drop(f(norm(x)))``) or post-layer-norm
(``norm(x + drop(f(x)))``, Vaswani et al.) as the decoder-only blocks; masks
and softmax in float32 under mixed precision; every shape fixed from the
first decoding step to the last, so the loop compiles with XLA.
"""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional, Tuple, Union

import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.layers.attention import Attention, AttentionCache
from lmkit.layers.base import Module, Training, check_positive_int
from lmkit.layers.norms import LayerNorm
from lmkit.layers.transformer import (
    ResidualLayer,
    TransformerLayer,
    TransformerState,
    default_ffn_dim,
    empty_state,
    layer_stack,
    run_layers,
)

__all__ = ["CrossAttentionLayer", "Memory", "TransformerCrossDecoder", "TransformerEncoder",
           "TransformerEncoderLayer"]


def _memory_attention(layer: ResidualLayer, name: str) -> Attention:
    """A layer's attention to a memory or to its padded input: not causal, ``query`` and ``key_value``."""
    return Attention(dim=layer.dim, num_heads=layer.num_heads, causal=False, fused="kv",
                     dropout=layer.attention_dropout, qkv_bias=layer.use_bias, output_bias=layer.use_bias,
                     init_scale=layer.init_scale, name=name)


class TransformerEncoderLayer(ResidualLayer):
    """Bidirectional self-attention over a padded source and a feed-forward block.

    Arguments as :class:`~lmkit.layers.transformer.ResidualLayer`. Variables:
    ``attention/...`` (an :class:`~lmkit.layers.attention.Attention` over the
    layer's own input: not causal, ``query``, ``key_value`` and ``output``),
    ``attention_norm/...``, ``ffn_inner``, ``ffn_outer``, ``ffn_norm/...``.
    """

    def _attention(self) -> Module:
        return _memory_attention(self, "attention")

    def __call__(self, inputs: tf.Tensor, mask: Optional[tf.Tensor] = None,
                 training: Training = False) -> tf.Tensor:
        """inputs [batch, source_time, dim], mask [batch, source_time] bool (True = token) -> same shape."""
        def self_attention(x: tf.Tensor) -> tf.Tensor:
            return self.attention(x, training, mask=mask)[0]

        x = self._residual(inputs, self.attention_norm, self_attention, training)
        return self._residual(x, self.ffn_norm, lambda h: self._feed_forward(h, training), training)


class TransformerEncoder(Module):
    """A stack of :class:`TransformerEncoderLayer` s (and a final layer norm with ``pre_layer_norm``).

    Variables: ``layer_<i>/...`` and, with ``pre_layer_norm``, ``final_norm/...``.
    """

    def __init__(self, *, num_layers: int, dim: int, num_heads: int, ffn_dim: int = 0, dropout: float = 0.0,
                 attention_dropout: Optional[float] = None, pre_layer_norm: bool = True, activation: str = "gelu",
                 init_scale: float = 0.1, layer_norm_epsilon: float = 1e-5, use_bias: bool = True,
                 name: Optional[str] = None) -> None:
        """Creates the layers (``ffn_dim`` 0 means ``4 * dim``; the rest as :class:`TransformerEncoderLayer`)."""
        super().__init__(name=name)
        self.num_layers = check_positive_int("num_layers", num_layers)
        self.pre_layer_norm = bool(pre_layer_norm)
        ffn_dim = default_ffn_dim(ffn_dim, dim)
        with self.name_scope:
            self.layers, self.final_norm = layer_stack(
                TransformerEncoderLayer, num_layers, dim=dim, num_heads=num_heads, ffn_dim=ffn_dim, dropout=dropout,
                attention_dropout=attention_dropout, pre_layer_norm=pre_layer_norm, activation=activation,
                init_scale=init_scale, layer_norm_epsilon=layer_norm_epsilon, use_bias=use_bias)

    def __call__(self, inputs: tf.Tensor, mask: Optional[tf.Tensor] = None,
                 training: Training = False) -> tf.Tensor:
        """Encodes ``inputs`` [batch, source_time, dim] (embedded source) with ``mask`` [batch, source_time]."""
        x = inputs
        for layer in self.layers:
            x = layer(x, mask, training)
        return x if self.final_norm is None else self.final_norm(x)

    def get_config(self) -> Dict[str, Any]:
        config = self.layers[0].get_config()
        config.update(num_layers=self.num_layers, name=self.name)
        return config


class Memory(NamedTuple):
    """What a :class:`TransformerCrossDecoder` attends to: per layer the encoder outputs' keys and values
    ([batch, heads, source_time, head_dim]) and the source mask [batch, source_time] bool.

    Every tensor has the batch first, so beam search reorders it with a gather like the cache.
    """

    caches: Tuple[AttentionCache, ...]
    mask: tf.Tensor


class CrossAttentionLayer(TransformerLayer):
    """Causal self-attention (cached), attention to the encoder's outputs, a feed-forward block.

    Arguments as :class:`~lmkit.layers.transformer.ResidualLayer`. Variables:
    ``attention/...`` (causal, one ``qkv`` kernel: :class:`~lmkit.layers.transformer.TransformerLayer`'s),
    ``attention_norm/...``, ``cross_attention/...`` (as the encoder's ``attention``),
    ``cross_norm/...``, ``ffn_inner``, ``ffn_outer``, ``ffn_norm/...``.
    """

    def _middle(self) -> None:
        self.cross_attention = _memory_attention(self, "cross_attention")
        self.cross_norm = LayerNorm(dim=self.dim, epsilon=self.attention_norm.epsilon, use_offset=self.use_bias,
                                    name="cross_norm")

    def __call__(self, inputs: tf.Tensor, training: Training = False, cache: Optional[AttentionCache] = None,
                 positions: Optional[tf.Tensor] = None, *, memory: AttentionCache,
                 memory_mask: Optional[tf.Tensor] = None) -> Tuple[tf.Tensor, Optional[AttentionCache]]:
        """Runs the layer over the target window ``inputs`` [batch, time, dim].

        ``cache`` and ``positions`` as :meth:`lmkit.layers.attention.Attention.__call__`;
        ``memory`` this layer's keys and values of the encoder outputs
        (``cross_attention.memory``), ``memory_mask`` the source mask.
        Returns ``(outputs, cache)``.
        """
        def cross_attention(h: tf.Tensor) -> tf.Tensor:
            return self.cross_attention(h, training, memory=memory, mask=memory_mask)[0]

        x, cache = self._self_attention(inputs, training, cache, positions)
        x = self._residual(x, self.cross_norm, cross_attention, training)
        return self._residual(x, self.ffn_norm, lambda h: self._feed_forward(h, training), training), cache


class TransformerCrossDecoder(Module):
    """A stack of :class:`CrossAttentionLayer` s: the decoder of a transformer encoder-decoder.

    Decoding state: the :class:`~lmkit.layers.TransformerState` of the
    decoder-only transformer (positions and a self-attention cache per layer);
    the encoder's outputs enter once, as the :class:`Memory` that
    :meth:`memory` computes.
    """

    def __init__(self, *, num_layers: int, dim: int, num_heads: int, ffn_dim: int = 0, dropout: float = 0.0,
                 attention_dropout: Optional[float] = None, pre_layer_norm: bool = True, max_positions: int = 512,
                 activation: str = "gelu", init_scale: float = 0.1, layer_norm_epsilon: float = 1e-5,
                 attention_blocks: Union[int, str] = "auto", use_bias: bool = True, name: Optional[str] = None) -> None:
        """Creates the layers (``ffn_dim`` 0 means ``4 * dim``; ``max_positions`` bounds the target cache;
        ``attention_blocks`` as :class:`~lmkit.layers.TransformerDecoder`'s)."""
        super().__init__(name=name)
        self.num_layers = check_positive_int("num_layers", num_layers)
        self.max_positions = check_positive_int("max_positions", max_positions)
        self.pre_layer_norm = bool(pre_layer_norm)
        ffn_dim = default_ffn_dim(ffn_dim, dim)
        with self.name_scope:
            self.layers, self.final_norm = layer_stack(
                CrossAttentionLayer, num_layers, dim=dim, num_heads=num_heads, ffn_dim=ffn_dim, dropout=dropout,
                attention_dropout=attention_dropout, pre_layer_norm=pre_layer_norm, activation=activation,
                init_scale=init_scale, layer_norm_epsilon=layer_norm_epsilon, attention_blocks=attention_blocks,
                use_bias=use_bias)

    def memory(self, encoder_outputs: tf.Tensor, mask: Optional[tf.Tensor] = None) -> Memory:
        """The keys and values of ``encoder_outputs`` [batch, source_time, dim] for every layer (once per source)."""
        if mask is None:
            mask = tf.ones(tf.shape(encoder_outputs)[:2], tf.bool)
        return Memory(tuple(layer.cross_attention.memory(encoder_outputs) for layer in self.layers),
                      tf.cast(mask, tf.bool))

    def initial_state(self, batch_size: Union[int, tf.Tensor], max_length: Optional[int] = None) -> TransformerState:
        """An empty self-attention cache of ``max_length`` (default ``max_positions``) target positions."""
        return empty_state([layer.attention for layer in self.layers], batch_size, max_length, self.max_positions)

    def __call__(self, inputs: tf.Tensor, memory: Memory, state: Optional[TransformerState] = None,
                 training: Training = False) -> Tuple[tf.Tensor, Optional[TransformerState]]:
        """Decodes the target window ``inputs`` [batch, time, dim] (embedded) against ``memory``.

        Without ``state`` the window stands alone (teacher forcing); with one,
        it extends the cache (prefill, then one token at a time). Returns
        ``(outputs [batch, time, dim], state or None)``.
        """
        if len(memory.caches) != self.num_layers:
            raise UsageError(f"memory has {len(memory.caches)} layers but the decoder has {self.num_layers}; "
                             "use this decoder's memory()")
        layers = [_WithMemory(layer, cache, memory.mask) for layer, cache in zip(self.layers, memory.caches)]
        x, state = run_layers(layers, inputs, state, training)
        return (x if self.final_norm is None else self.final_norm(x)), state

    def get_config(self) -> Dict[str, Any]:
        config = self.layers[0].get_config()
        config.update(num_layers=self.num_layers, max_positions=self.max_positions, name=self.name)
        return config


class _WithMemory:
    """A layer with its memory bound, in the ``layer(x, training, cache, positions)`` form run_layers calls."""

    def __init__(self, layer: CrossAttentionLayer, memory: AttentionCache, mask: tf.Tensor) -> None:
        self.layer, self.memory, self.mask = layer, memory, mask

    def __call__(self, x: tf.Tensor, training: Training, cache: Optional[AttentionCache] = None,
                 positions: Optional[tf.Tensor] = None) -> Tuple[tf.Tensor, Optional[AttentionCache]]:
        return self.layer(x, training, cache, positions, memory=self.memory, memory_mask=self.mask)
