"""The functions attention computes with: scaled dot-product attention, its masks and softmax, grouped heads,
and a causal window in query blocks (or a fused kernel of :mod:`lmkit.layers.kernels`).

:class:`lmkit.layers.attention.Attention` calls them; they take and give
plain tensors, queries, keys and values each [batch, heads, time, head_dim].
"""

from __future__ import annotations

import numbers
from typing import Any, Optional, Union

import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.layers import kernels as attention_kernels
from lmkit.layers.base import Training, dropout
from lmkit.layers.documents import leave_to_matmuls, within_documents
from lmkit.layers.precision import cast_like

__all__ = ["AUTO_BLOCKS", "AUTO_BLOCKS_FROM", "attend", "attention_blocks_for", "causal_attend", "causal_mask",
           "check_attention_blocks", "grouped_attend", "masked_softmax"]

# Added to masked scores; exp() of it underflows to exactly 0 in float32.
_MASK_VALUE = -1.0e9

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
                  training: Training, window: Optional[int] = None,
                  segment_ids: Optional[tf.Tensor] = None) -> tf.Tensor:
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
      segment_ids: None, or [batch, time] int32: a packed window, where a query sees only the keys of
        its own example (:mod:`lmkit.layers.documents`; the matmuls compute it).

    Returns:
      [batch, heads, time, head_dim]; a fused kernel in :func:`lmkit.layers.kernels.scope`
      (``attention_kernel = "cudnn"``) computes the calls it applies to.
    """
    kernel = attention_kernels.active()
    if kernel is not None and kernel.applies(queries, keys, values, rate, training, window):
        if segment_ids is None:
            return kernel(queries, keys, values)
        leave_to_matmuls(kernel)
    length = queries.shape[2]
    blocks = attention_blocks_for(blocks, length)
    if blocks <= 1:  # the whole window, unsliced
        positions = tf.range(tf.shape(queries)[2])
        mask = within_documents(causal_mask(positions, positions, window), segment_ids)
        return grouped_attend(queries, keys, values, mask, rate, training)
    ends = [length * i // blocks for i in range(blocks + 1)]
    outputs = []
    for start, end in zip(ends[:-1], ends[1:]):
        first_key = max(0, start - window + 1) if window else 0
        mask = within_documents(causal_mask(tf.range(start, end), tf.range(first_key, end), window), segment_ids,
                                (start, end), (first_key, end))
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
      mask: bool, broadcastable to [batch, 1, time, keys] (a [batch, 1, 1, keys] padding mask
        serves every query), or None.
      rate, training: as :func:`attend`.

    Returns:
      [batch, heads, time, head_dim].
    """
    group = queries.shape[1] // keys.shape[1]
    if group == 1:
        return attend(queries, keys, values, mask, rate, training)
    batch, head_dim = tf.shape(queries)[0], tf.shape(queries)[3]
    rows = tf.reshape(queries, [batch, keys.shape[1], -1, head_dim])  # [batch, kv_heads, group * time, head_dim]
    if mask is not None and mask.shape[2] != 1:  # one mask row per query: repeated for each head of the group
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
