"""A decoder-only transformer with a pre-allocated key/value cache.

``TransformerDecoder.__call__`` runs causal self-attention over a window. For
incremental decoding it takes a :class:`TransformerState`: per-row positions
[batch] int32 and, per layer, keys and values of shape
[batch, heads, max_length, head_dim] allocated once by ``initial_state``. A
call writes the new keys and values at each row's positions with
``tf.tensor_scatter_nd_update`` and masks out the slots not yet written, so
every tensor keeps one shape from the first step to the last (one trace under
``tf.function``), every state tensor has the batch first (``reorder_state`` is
a gather), and rows may sit at different positions.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import tensorflow as tf

from lmkit.core.checks import check_heads
from lmkit.layers import kernels as attention_kernels
from lmkit.core.errors import UsageError
from lmkit.layers.base import (Linear, Module, Training, check_positive_float, check_positive_int,
                                check_rate, dropout, ones_initializer, zeros_initializer)
from lmkit.layers.precision import cast_like

__all__ = [
    "ACTIVATIONS",
    "AttentionCache",
    "LayerNorm",
    "MultiHeadAttention",
    "TransformerDecoder",
    "TransformerLayer",
    "ResidualLayer",
    "TransformerState",
    "attend",
    "causal_attend",
    "causal_mask",
    "grouped_attend",
    "default_ffn_dim",
    "empty_state",
    "layer_stack",
    "masked_softmax",
    "run_layers",
    "write_cache",
]

# Added to masked scores; exp() of it underflows to exactly 0 in float32.
_MASK_VALUE = -1.0e9

ACTIVATIONS = {
    "gelu": lambda x: tf.nn.gelu(x, approximate=True),  # GPT-2's tanh approximation
    "gelu_exact": lambda x: tf.nn.gelu(x, approximate=False),  # the erf form (BART; Hugging Face's "gelu")
    "relu": tf.nn.relu,
}


def attend(queries: tf.Tensor, keys: tf.Tensor, values: tf.Tensor, mask: Optional[tf.Tensor],
           rate: float, training: Training) -> tf.Tensor:
    """Scaled dot-product attention: softmax(queries keys^T) values, masked.

    Args:
      queries: [batch, heads, time, head_dim], already scaled by 1/sqrt(head_dim).
      keys, values: [batch, heads, keys, head_dim].
      mask: bool, broadcastable to [batch, heads, time, keys] (True = attend), or None.
      rate: dropout on the attention probabilities while training.
      training: apply dropout.

    Returns:
      [batch, heads, time, head_dim]. The mask and softmax run in float32
      (mixed precision: -1e9 overflows float16).
    """
    scores = tf.matmul(queries, keys, transpose_b=True)  # [batch, heads, time, keys]
    probs = dropout(cast_like(masked_softmax(scores, mask), values), rate, training)
    return tf.matmul(probs, values)


# attention_blocks = "auto" (the default): a window of at least AUTO_BLOCKS_FROM positions attends in
# AUTO_BLOCKS query blocks, a shorter one in one. Measured at 1024 positions (docs/performance.md,
# "Attention in query blocks"): the GPT-2-shaped bf16 step 1.10x on an H100 under XLA, the tiny
# transformer's step 1.16x on a CPU with TensorFlow's kernels; at 512 positions on the CPU 1.00x.
AUTO_BLOCKS = 4
AUTO_BLOCKS_FROM = 1024


def check_attention_blocks(value: Any) -> Union[int, str]:
    """Returns ``value`` when it is ``"auto"`` or a positive int (the ``attention_blocks`` option)."""
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise UsageError(f"attention_blocks {value!r} must be a positive integer or \"auto\" (query blocks of a "
                         f"window's causal attention); pass e.g. attention_blocks=1")
    return int(value)


def attention_blocks_for(blocks: Union[int, str], length: Optional[int]) -> int:
    """The query blocks a window of ``length`` positions attends in (None: not known when tracing: 1)."""
    if length is None:
        return 1
    if blocks == "auto":
        blocks = AUTO_BLOCKS if length >= AUTO_BLOCKS_FROM else 1
    return min(int(blocks), length)


def causal_attend(queries: tf.Tensor, keys: tf.Tensor, values: tf.Tensor, blocks: Union[int, str], rate: float,
                  training: Training, window: Optional[int] = None) -> tf.Tensor:
    """Causal self-attention over one window, in ``blocks`` query blocks that skip the keys after them.

    Query block i (positions ``start_i`` to ``end_i - 1``) attends to keys 0 to
    ``end_i - 1`` only: the key blocks after it, all masked, are never computed.
    With one block this is :func:`attend` with the causal mask; with ``B``
    blocks of a window of ``T`` positions the scores shrink from ``T^2`` to
    about ``T^2 (B + 1) / (2 B)`` (5/8 with 4 blocks), at the price of ``B``
    smaller matmuls. The results equal one block's up to summation order.

    Grouped-query attention (Llama, Mistral, Qwen2) passes fewer key/value
    heads than query heads (:func:`grouped_attend`). A sliding ``window`` (Mistral's rule: the query at ``q``
    sees the keys ``k <= q`` with ``q - k < window``) also skips, per block,
    the key blocks before the window.

    Args:
      queries: [batch, heads, time, head_dim], already scaled.
      keys, values: [batch, kv_heads, time, head_dim] of the same window;
        ``kv_heads`` divides ``heads``. ``time`` must be static for ``blocks``
        > 1 (under ``tf.function`` a dynamic window falls back to one block).
      blocks: query blocks (at most ``time`` are used; their sizes differ by at most one), or
        ``"auto"``: :data:`AUTO_BLOCKS` for windows of at least :data:`AUTO_BLOCKS_FROM`
        positions, else one.
      rate, training: dropout on the attention probabilities, as :func:`attend`.
      window: None, or how many positions (the query's own included) a query sees.

    Returns:
      [batch, heads, time, head_dim]; a fused kernel in :func:`lmkit.layers.kernels.scope`
      (``attention_kernel = "cudnn"``) computes the calls it applies to.
    """
    kernel = attention_kernels.active()
    if kernel is not None and kernel.applies(queries, keys, values, rate, training, window):
        return kernel(queries, keys, values)
    length = queries.shape[2]
    blocks = attention_blocks_for(blocks, length)
    if blocks <= 1:  # the whole window, unsliced
        positions = tf.range(tf.shape(queries)[2])
        return grouped_attend(queries, keys, values, causal_mask(positions, positions, window), rate, training)
    ends = [length * i // blocks for i in range(blocks + 1)]
    outputs = []
    for start, end in zip(ends[:-1], ends[1:]):
        first_key = max(0, start - window + 1) if window else 0
        mask = causal_mask(tf.range(start, end), tf.range(first_key, end), window)
        outputs.append(grouped_attend(queries[:, :, start:end], keys[:, :, first_key:end],
                                      values[:, :, first_key:end], mask, rate, training))
    return tf.concat(outputs, axis=2)


def causal_mask(query_positions: tf.Tensor, key_positions: tf.Tensor, window: Optional[int] = None) -> tf.Tensor:
    """Which keys each query sees: bool [1 or batch, 1, time, keys].

    Key ``k`` is visible from the query at position ``q`` when ``k <= q`` and,
    with a ``window`` ``w``, ``q - k < w`` (Mistral's rule: ``w`` positions, the
    query's own included).

    Args:
      query_positions: [time], or [batch, time] (each row's own positions: a cache).
      key_positions: [keys].
      window: None, or the positions a query sees.
    """
    queries = query_positions if query_positions.shape.rank == 2 else query_positions[tf.newaxis]
    offsets = queries[:, :, tf.newaxis] - key_positions[tf.newaxis, tf.newaxis, :]  # [1 or batch, time, keys]
    visible = offsets >= 0
    if window:
        visible = tf.logical_and(visible, offsets < window)
    return visible[:, tf.newaxis]


def grouped_attend(queries: tf.Tensor, keys: tf.Tensor, values: tf.Tensor, mask: Optional[tf.Tensor],
                   rate: float, training: Training) -> tf.Tensor:
    """:func:`attend` with fewer key/value heads than query heads (grouped-query attention).

    Query head ``h`` reads key/value head ``h // (heads / kv_heads)``
    (Hugging Face's ``repeat_kv`` order) without copying the keys: the query
    rows of one group go one after the other against their shared head.

    Args:
      queries: [batch, heads, time, head_dim], already scaled.
      keys, values: [batch, kv_heads, keys, head_dim]; ``kv_heads`` (static) divides ``heads``.
      mask: bool, broadcastable to [batch, 1, time, keys], or None.
      rate, training: as :func:`attend`.

    Returns:
      [batch, heads, time, head_dim].
    """
    group = queries.shape[1] // keys.shape[1]
    if group == 1:
        return attend(queries, keys, values, mask, rate, training)
    batch, head_dim = tf.shape(queries)[0], tf.shape(queries)[3]
    rows = tf.reshape(queries, [batch, keys.shape[1], -1, head_dim])  # [batch, kv_heads, group * time, head_dim]
    if mask is not None:
        mask = tf.tile(mask, [1, 1, group, 1])
    context = attend(rows, keys, values, mask, rate, training)
    return tf.reshape(context, [batch, queries.shape[1], -1, head_dim])


def masked_softmax(scores: tf.Tensor, mask: Optional[tf.Tensor]) -> tf.Tensor:
    """``softmax(where(mask, scores, -1e9))`` over the last axis, computed in float32, in ``scores``' dtype.

    For float32 scores this is TensorFlow's softmax and its gradient. For
    bfloat16 or float16 scores (mixed precision) the mask, the softmax and
    its gradient still compute in float32, but what the backward pass keeps
    of the forward is the probabilities in the low precision, the dtype the
    next matmul reads anyway: TensorFlow's gradient of a float32 softmax
    keeps its float32 output, an extra [batch, heads, time, keys] array
    (twice the bytes) written once and read twice per layer and step. On a
    GPU that traffic, not the matmuls, bounds the attention of long windows
    (``benchmarks/attention.py`` measures both). Masked positions get a zero
    gradient, as through ``tf.where``.

    Args:
      scores: [..., keys] float scores.
      mask: bool, broadcastable to ``scores`` (True = attend), or None.

    Returns:
      The probabilities, ``scores``' shape and dtype.
    """
    if scores.dtype == tf.float32:
        if mask is not None:
            scores = tf.where(mask, scores, _MASK_VALUE)
        return tf.nn.softmax(scores, axis=-1)
    dtype = scores.dtype

    @tf.custom_gradient
    def low_precision_softmax(scores):
        x = tf.cast(scores, tf.float32)
        if mask is not None:
            x = tf.where(mask, x, _MASK_VALUE)
        probs = tf.cast(tf.nn.softmax(x, axis=-1), dtype)

        def grad(d_probs):
            p = tf.cast(probs, tf.float32)
            g = tf.cast(d_probs, tf.float32)
            d_scores = p * (g - tf.reduce_sum(g * p, axis=-1, keepdims=True))
            if mask is not None:
                d_scores = tf.where(mask, d_scores, 0.0)
            return tf.cast(d_scores, dtype)

        return probs, grad

    return low_precision_softmax(scores)


class AttentionCache(NamedTuple):
    """Keys and values of one layer, each [batch, heads, max_length, head_dim]."""

    keys: tf.Tensor
    values: tf.Tensor


def write_cache(cache: AttentionCache, keys: tf.Tensor, values: tf.Tensor,
                query_positions: tf.Tensor) -> AttentionCache:
    """``cache`` with ``keys`` and ``values`` [batch, heads, time, head_dim] written at
    ``query_positions`` [batch, time] of each row (one shape throughout: no concat)."""
    batch, heads, length = tf.shape(keys)[0], tf.shape(keys)[1], tf.shape(keys)[2]
    index_shape = [batch, heads, length]
    indices = tf.stack([
        tf.broadcast_to(tf.range(batch)[:, tf.newaxis, tf.newaxis], index_shape),
        tf.broadcast_to(tf.range(heads)[tf.newaxis, :, tf.newaxis], index_shape),
        tf.broadcast_to(query_positions[:, tf.newaxis, :], index_shape),
    ], axis=-1)  # [batch, heads, time, 3]
    return AttentionCache(tf.tensor_scatter_nd_update(cast_like(cache.keys, keys), indices, keys),
                          tf.tensor_scatter_nd_update(cast_like(cache.values, values), indices, values))


class TransformerState(NamedTuple):
    """Decoding state of a :class:`TransformerDecoder`.

    Attributes:
      positions: [batch] int32, the number of tokens already in each row's
        cache (= the position of the next token).
      caches: one :class:`AttentionCache` per layer.
    """

    positions: tf.Tensor
    caches: Tuple[AttentionCache, ...]


def run_layers(layers: Sequence[Any], inputs: tf.Tensor, state: Optional[TransformerState],
               training: Training) -> Tuple[tf.Tensor, Optional[TransformerState]]:
    """Runs decoder ``layers`` (each ``layer(x, training, cache, positions) -> (x, cache)``) over a window.

    Without a state every layer attends within the window; with one, each
    extends its cache and the state advances by the window's length.
    """
    x = inputs
    if state is None:
        for layer in layers:
            x, _ = layer(x, training)
        return x, None
    if len(state.caches) != len(layers):
        raise UsageError(f"state has {len(state.caches)} layer caches but the decoder has "
                         f"{len(layers)} layers; use this decoder's initial_state")
    caches: List[AttentionCache] = []
    for layer, cache in zip(layers, state.caches):
        x, cache = layer(x, training, cache, state.positions)
        caches.append(cache)
    return x, TransformerState(state.positions + tf.shape(inputs)[1], tuple(caches))


class LayerNorm(Module):
    """Layer normalization over the last axis (Ba et al., 2016).

    Variables: ``scale`` [dim] (ones) and ``offset`` [dim] (zeros).
    """

    def __init__(self, *, dim: int, epsilon: float = 1e-5, name: Optional[str] = None) -> None:
        """Creates the variables.

        Args:
          dim: size of the last axis.
          epsilon: added to the variance.
          name: module name.

        Raises:
          ValueError: ``dim`` is not a positive integer or ``epsilon`` <= 0.
        """
        super().__init__(name=name)
        self.dim = check_positive_int("dim", dim)
        self.epsilon = check_positive_float("epsilon", epsilon)
        with self.name_scope:
            self.scale = tf.Variable(ones_initializer()([dim], tf.float32), name="scale")
            self.offset = tf.Variable(zeros_initializer()([dim], tf.float32), name="offset")

    def __call__(self, inputs: tf.Tensor) -> tf.Tensor:
        """Normalizes ``inputs`` [..., dim]; returns the same shape and dtype.

        The statistics are computed in float32 also for a bfloat16 or float16
        input (mixed precision), then cast back.
        """
        x = tf.cast(inputs, tf.float32) if inputs.dtype != tf.float32 else inputs
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)  # [..., 1]
        normalized = (x - mean) * tf.math.rsqrt(variance + self.epsilon)
        return cast_like(normalized * self.scale + self.offset, inputs)

    def get_config(self) -> Dict[str, Any]:
        return {"dim": self.dim, "epsilon": self.epsilon, "name": self.name}


class MultiHeadAttention(Module):
    """Causal multi-head self-attention.

    Variables: ``qkv/kernel`` [dim, 3 * dim] and ``qkv/bias`` (queries, keys
    and values in one matmul), ``output/kernel`` [dim, dim] and
    ``output/bias``.
    """

    def __init__(self,
                 *,
                 dim: int,
                 num_heads: int,
                 dropout: float = 0.0,
                 init_scale: float = 0.1,
                 attention_blocks: Union[int, str] = "auto",
                 name: Optional[str] = None) -> None:
        """Creates the variables.

        Args:
          dim: model size; a multiple of ``num_heads``.
          num_heads: number of heads.
          dropout: rate of dropout on the attention probabilities while training.
          init_scale: kernels from uniform(-init_scale, init_scale).
          attention_blocks: a window without a cache attends in this many query
            blocks that skip the masked keys (:func:`causal_attend`); 1 = one block;
            ``"auto"``: 4 from windows of 1024 positions.
          name: module name.

        Raises:
          ValueError: ``dim`` is not divisible by ``num_heads``, or a bad size or rate.
        """
        super().__init__(name=name)
        self.dim = check_positive_int("dim", dim)
        check_heads("dim", dim, num_heads)
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.dropout = check_rate("dropout", dropout)
        self.init_scale = check_positive_float("init_scale", init_scale)
        self.attention_blocks = check_attention_blocks(attention_blocks)
        with self.name_scope:
            self.qkv = Linear(input_size=dim, output_size=3 * dim, init_scale=init_scale, name="qkv")
            self.output = Linear(input_size=dim, output_size=dim, init_scale=init_scale, name="output")

    def initial_cache(self, batch_size: Union[int, tf.Tensor], max_length: int) -> AttentionCache:
        """An empty cache for ``max_length`` positions."""
        zeros = tf.zeros([batch_size, self.num_heads, max_length, self.head_dim], tf.float32)
        return AttentionCache(zeros, zeros)

    def __call__(self,
                 inputs: tf.Tensor,
                 training: Training = False,
                 cache: Optional[AttentionCache] = None,
                 positions: Optional[tf.Tensor] = None) -> Tuple[tf.Tensor, Optional[AttentionCache]]:
        """Attends from every position to itself and the positions before it.

        Args:
          inputs: [batch, time, dim] float32.
          training: apply dropout.
          cache: None for a self-contained window; otherwise the keys and
            values of the earlier positions, which this call extends.
          positions: with ``cache``: [batch] int32, where each row's window
            starts (the number of tokens already cached). Rows must satisfy
            ``positions + time <= max_length`` (on CPU a violation raises an
            error; on GPU the write would be dropped).

        Returns:
          ``(outputs [batch, time, dim], cache)``; the cache is None when
          none was given.

        Raises:
          ValueError: a cache without positions.
        """
        batch = tf.shape(inputs)[0]
        length = tf.shape(inputs)[1]
        qkv = self.qkv(inputs, training)  # [batch, time, 3 * dim]
        qkv = tf.reshape(qkv, [batch, length, 3, self.num_heads, self.head_dim])
        # each [batch, heads, time, head_dim]
        queries, keys, values = tf.unstack(tf.transpose(qkv, [2, 0, 3, 1, 4]))
        # Scaling the queries is cheaper than scaling the [time, keys] scores.
        queries = queries * (1.0 / math.sqrt(self.head_dim))

        if cache is None:  # query i sees keys 0..i
            context = causal_attend(queries, keys, values, self.attention_blocks, self.dropout, training)
        else:
            if positions is None:
                raise UsageError("positions is None but a cache was given; pass the [batch] int32 positions")
            positions = tf.cast(positions, tf.int32)
            query_positions = positions[:, tf.newaxis] + tf.range(length)[tf.newaxis, :]  # [batch, time]
            cache = write_cache(cache, keys, values, query_positions)
            keys, values = cache  # [batch, heads, max_length, head_dim]
            # [batch, 1, time, max_length]: slots after the query are future or unwritten.
            mask = causal_mask(query_positions, tf.range(tf.shape(keys)[2]))
            context = attend(queries, keys, values, mask, self.dropout, training)  # [batch, heads, time, head_dim]
        context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [batch, length, self.dim])
        return self.output(context, training), cache

    def get_config(self) -> Dict[str, Any]:
        return {"dim": self.dim, "num_heads": self.num_heads, "dropout": self.dropout,
                "init_scale": self.init_scale, "attention_blocks": self.attention_blocks, "name": self.name}


class ResidualLayer(Module):
    """What every transformer layer shares: an attention block and a feed-forward block (and, in
    subclasses, blocks between them), each with a residual connection.

    Pre-layer-norm (GPT-2): ``x + drop(f(norm(x)))``; post-layer-norm
    (Vaswani et al.): ``norm(x + drop(f(x)))``. A subclass names its
    attention (:meth:`_attention`) and any modules between the two blocks
    (:meth:`_middle`); the variables are created in the order attention,
    ``attention_norm``, the middle's, ``ffn_inner`` (Linear dim -> ffn_dim),
    ``ffn_outer`` (Linear ffn_dim -> dim), ``ffn_norm``.
    """

    def __init__(self,
                 *,
                 dim: int,
                 num_heads: int,
                 ffn_dim: int,
                 dropout: float = 0.0,
                 attention_dropout: Optional[float] = None,
                 pre_layer_norm: bool = True,
                 activation: str = "gelu",
                 init_scale: float = 0.1,
                 layer_norm_epsilon: float = 1e-5,
                 name: Optional[str] = None) -> None:
        """Creates the sub-modules.

        Args:
          dim: model size; a multiple of ``num_heads``.
          num_heads: attention heads.
          ffn_dim: inner size of the feed-forward block.
          dropout: residual dropout rate while training.
          attention_dropout: dropout on attention probabilities; ``dropout`` when None.
          pre_layer_norm: normalize before (True) or after (False) each block.
          activation: ``"gelu"`` or ``"relu"``.
          init_scale: kernels from uniform(-init_scale, init_scale).
          layer_norm_epsilon: added to the variance in every layer norm.
          name: module name.

        Raises:
          ValueError: bad sizes, rates or activation.
        """
        super().__init__(name=name)
        self.dim = check_positive_int("dim", dim)
        check_heads("dim", dim, num_heads)
        self.num_heads = num_heads
        self.ffn_dim = check_positive_int("ffn_dim", ffn_dim)
        self.dropout = check_rate("dropout", dropout)
        self.attention_dropout = check_rate(
            "attention_dropout", dropout if attention_dropout is None else attention_dropout)
        if activation not in ACTIVATIONS:
            raise UsageError(f"activation {activation!r} is not one of {', '.join(ACTIVATIONS)}")
        self.activation = activation
        self.pre_layer_norm = bool(pre_layer_norm)
        self.init_scale = check_positive_float("init_scale", init_scale)
        with self.name_scope:
            self.attention = self._attention()
            self.attention_norm = LayerNorm(dim=dim, epsilon=layer_norm_epsilon, name="attention_norm")
            self._middle()
            self.ffn_inner = Linear(input_size=dim, output_size=ffn_dim, init_scale=init_scale, name="ffn_inner")
            self.ffn_outer = Linear(input_size=ffn_dim, output_size=dim, init_scale=init_scale, name="ffn_outer")
            self.ffn_norm = LayerNorm(dim=dim, epsilon=layer_norm_epsilon, name="ffn_norm")

    def _attention(self) -> Module:
        """The first block's attention module (named ``attention``)."""
        raise NotImplementedError

    def _middle(self) -> None:
        """Creates the modules of any blocks between attention and feed-forward (none here)."""

    def _residual(self, x: tf.Tensor, norm: LayerNorm, block: Callable[[tf.Tensor], tf.Tensor],
                  training: Training) -> tf.Tensor:
        """``x + drop(block(norm(x)))`` (pre-LN) or ``norm(x + drop(block(x)))`` (post-LN)."""
        if self.pre_layer_norm:
            return x + dropout(block(norm(x)), self.dropout, training)
        return norm(x + dropout(block(x), self.dropout, training))

    def _feed_forward(self, x: tf.Tensor, training: Training = False) -> tf.Tensor:
        return self.ffn_outer(ACTIVATIONS[self.activation](self.ffn_inner(x, training)), training)  # [b, t, dim]

    def get_config(self) -> Dict[str, Any]:
        return {"dim": self.dim, "num_heads": self.num_heads, "ffn_dim": self.ffn_dim,
                "dropout": self.dropout, "attention_dropout": self.attention_dropout,
                "pre_layer_norm": self.pre_layer_norm, "activation": self.activation,
                "init_scale": self.init_scale, "layer_norm_epsilon": self.attention_norm.epsilon,
                "name": self.name}


class TransformerLayer(ResidualLayer):
    """Causal self-attention and a feed-forward block, each with a residual connection.

    Pre-layer-norm (GPT-2): ``x + drop(f(norm(x)))``; post-layer-norm
    (Vaswani et al.): ``norm(x + drop(f(x)))``. Arguments as :class:`ResidualLayer`.

    Variables: ``attention/...`` (:class:`MultiHeadAttention`),
    ``attention_norm/...``, ``ffn_inner`` (Linear dim -> ffn_dim),
    ``ffn_outer`` (Linear ffn_dim -> dim), ``ffn_norm/...``.

    ``attention_blocks``: the query blocks of a window's attention without a
    cache (:func:`causal_attend`); 1 = one block; ``"auto"``: 4 from windows of
    1024 positions.
    """

    def __init__(self, *, attention_blocks: Union[int, str] = "auto", **options: Any) -> None:
        self.attention_blocks = check_attention_blocks(attention_blocks)
        super().__init__(**options)

    def _attention(self) -> Module:
        return MultiHeadAttention(dim=self.dim, num_heads=self.num_heads, dropout=self.attention_dropout,
                                  init_scale=self.init_scale, attention_blocks=self.attention_blocks,
                                  name="attention")

    def get_config(self) -> Dict[str, Any]:
        return {**super().get_config(), "attention_blocks": self.attention_blocks}

    def __call__(self,
                 inputs: tf.Tensor,
                 training: Training = False,
                 cache: Optional[AttentionCache] = None,
                 positions: Optional[tf.Tensor] = None) -> Tuple[tf.Tensor, Optional[AttentionCache]]:
        """Applies the layer; arguments as in :meth:`MultiHeadAttention.__call__`.

        Returns:
          ``(outputs [batch, time, dim], cache)``.
        """
        x, cache = self._self_attention(inputs, training, cache, positions)
        return self._residual(x, self.ffn_norm, lambda h: self._feed_forward(h, training), training), cache

    def _self_attention(self, inputs: tf.Tensor, training: Training, cache: Optional[AttentionCache],
                        positions: Optional[tf.Tensor]) -> Tuple[tf.Tensor, Optional[AttentionCache]]:
        """The first block (residual included) and the extended cache."""
        extended = [cache]

        def attention(x: tf.Tensor) -> tf.Tensor:
            attended, extended[0] = self.attention(x, training, cache, positions)
            return attended

        return self._residual(inputs, self.attention_norm, attention, training), extended[0]


def default_ffn_dim(ffn_dim: int, dim: int) -> int:
    """A stack's feed-forward size: ``ffn_dim``, or ``4 * dim`` for 0."""
    if isinstance(ffn_dim, bool) or not isinstance(ffn_dim, int) or ffn_dim < 0:
        raise UsageError(f"ffn_dim {ffn_dim!r} must be an integer >= 0 (0 means 4 * dim = {4 * dim})")
    return ffn_dim or 4 * dim


def layer_stack(layer_class: Any, num_layers: int, **options: Any) -> Tuple[List[Any], Optional[LayerNorm]]:
    """``num_layers`` layers ``layer_<i>`` of ``layer_class`` and, with ``pre_layer_norm``, the final layer
    norm ``final_norm`` (None otherwise): the body of every transformer stack. Call it in the stack's name scope."""
    layers = [layer_class(name=f"layer_{i}", **options) for i in range(num_layers)]
    final_norm = (LayerNorm(dim=options["dim"], epsilon=options["layer_norm_epsilon"], name="final_norm")
                  if options["pre_layer_norm"] else None)
    return layers, final_norm


def empty_state(attentions: Sequence[Any], batch_size: Union[int, tf.Tensor], max_length: Optional[int],
                max_positions: int) -> TransformerState:
    """A :class:`TransformerState` at position 0 with an empty cache of ``max_length`` (default
    ``max_positions``) positions for each of ``attentions`` (modules with ``initial_cache``).

    Raises:
      UsageError: ``max_length`` is not in [1, max_positions].
    """
    if max_length is None:
        max_length = max_positions
    check_positive_int("max_length", max_length)
    if max_length > max_positions:
        raise UsageError(f"max_length {max_length} exceeds max_positions {max_positions}; "
                         f"use max_length <= {max_positions} or build with a larger max_positions")
    return TransformerState(positions=tf.zeros([batch_size], tf.int32),
                            caches=tuple(a.initial_cache(batch_size, max_length) for a in attentions))


class TransformerDecoder(Module):
    """A stack of causal :class:`TransformerLayer` s with a cached decoding step.

    Takes already-embedded inputs (token plus position embeddings: the
    language model adds them). With ``pre_layer_norm`` a final layer norm
    follows the last layer, as in GPT-2.

    Variables: ``layer_<i>/...`` per layer and, with ``pre_layer_norm``,
    ``final_norm/scale`` and ``final_norm/offset``.
    """

    def __init__(self,
                 *,
                 num_layers: int,
                 dim: int,
                 num_heads: int,
                 ffn_dim: int = 0,
                 dropout: float = 0.0,
                 attention_dropout: Optional[float] = None,
                 pre_layer_norm: bool = True,
                 max_positions: int = 512,
                 activation: str = "gelu",
                 init_scale: float = 0.1,
                 layer_norm_epsilon: float = 1e-5,
                 attention_blocks: Union[int, str] = "auto",
                 name: Optional[str] = None) -> None:
        """Creates the layers.

        Args:
          num_layers: number of layers.
          dim: model size; a multiple of ``num_heads``.
          num_heads: attention heads.
          ffn_dim: feed-forward inner size; 0 means ``4 * dim``.
          dropout: residual dropout rate while training.
          attention_dropout: dropout on attention probabilities; ``dropout`` when None.
          pre_layer_norm: GPT-2 style (True) or the original post-layer-norm.
          max_positions: default and largest cache length of ``initial_state``.
          activation: ``"gelu"`` or ``"relu"``.
          init_scale: kernels from uniform(-init_scale, init_scale).
          layer_norm_epsilon: added to the variance in every layer norm
            (GPT-2's ``layer_norm_epsilon``).
          attention_blocks: the query blocks of a window's attention without a
            cache (:func:`causal_attend`: the masked keys after each block are
            skipped); 1 = one block; ``"auto"`` (default): 4 blocks for windows of
            at least 1024 positions, else 1. Speed only: the results are the same.
          name: module name.

        Raises:
          ValueError: ``dim`` is not divisible by ``num_heads``, or a bad size,
            rate or activation.
        """
        super().__init__(name=name)
        self.num_layers = check_positive_int("num_layers", num_layers)
        self.dim = check_positive_int("dim", dim)
        check_heads("dim", dim, num_heads)
        self.num_heads = num_heads
        self.ffn_dim = default_ffn_dim(ffn_dim, dim)
        self.max_positions = check_positive_int("max_positions", max_positions)
        self.pre_layer_norm = bool(pre_layer_norm)
        with self.name_scope:
            self.layers, self.final_norm = layer_stack(
                TransformerLayer, num_layers, dim=dim, num_heads=num_heads, ffn_dim=self.ffn_dim, dropout=dropout,
                attention_dropout=attention_dropout, pre_layer_norm=pre_layer_norm, activation=activation,
                init_scale=init_scale, layer_norm_epsilon=layer_norm_epsilon, attention_blocks=attention_blocks)

    def initial_state(self, batch_size: Union[int, tf.Tensor],
                      max_length: Optional[int] = None) -> TransformerState:
        """An empty cache.

        Args:
          batch_size: rows.
          max_length: cache length (prompt plus generated tokens);
            ``max_positions`` when None.

        Returns:
          A :class:`TransformerState` with positions 0 and zeroed caches of
          [batch, heads, max_length, head_dim].

        Raises:
          ValueError: ``max_length`` is not in [1, max_positions].
        """
        return empty_state([layer.attention for layer in self.layers], batch_size, max_length, self.max_positions)

    def __call__(self,
                 inputs: tf.Tensor,
                 state: Optional[TransformerState] = None,
                 training: Training = False) -> Tuple[tf.Tensor, Optional[TransformerState]]:
        """Runs the stack over a window.

        Args:
          inputs: [batch, time, dim] float32 embedded tokens.
          state: None for a self-contained window (training); or a state from
            :meth:`initial_state` or an earlier call, whose cache this window
            extends (prompt prefill, chunked decoding).
          training: apply dropout.

        Returns:
          ``(outputs [batch, time, dim], state)``; the state is None when
          none was given, else advanced by ``time`` positions.
        """
        x, state = run_layers(self.layers, inputs, state, training)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, state

    def step(self,
             inputs: tf.Tensor,
             state: TransformerState,
             training: Training = False) -> Tuple[tf.Tensor, TransformerState]:
        """One cached decoding step.

        Args:
          inputs: [batch, dim] float32, the embedded token at ``state.positions``.
          state: the state after the previous tokens.
          training: apply dropout.

        Returns:
          ``(outputs [batch, dim], new_state)``.
        """
        outputs, state = self(inputs[:, tf.newaxis, :], state, training)
        return outputs[:, 0, :], state

    def get_config(self) -> Dict[str, Any]:
        layer = self.layers[0]
        return {"num_layers": self.num_layers, "dim": self.dim, "num_heads": self.num_heads,
                "ffn_dim": self.ffn_dim, "dropout": layer.dropout,
                "attention_dropout": layer.attention_dropout, "pre_layer_norm": self.pre_layer_norm,
                "layer_norm_epsilon": layer.attention_norm.epsilon,
                "max_positions": self.max_positions, "activation": layer.activation,
                "init_scale": layer.init_scale, "attention_blocks": layer.attention_blocks, "name": self.name}
