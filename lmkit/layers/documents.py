"""Packed windows: several examples (documents) in one window, each attending only to itself.

A packed training window (:mod:`lmkit.data.packing`) holds examples one
after the other. A model's teacher-forced call takes, per token, the
example it belongs to (``segment_ids`` [batch, time] int32: 1, 2, ... and 0
for padding) and its position in it (``positions`` [batch, time] int32,
restarting at 0 for each example), as one :class:`Documents`:

* attention is block-diagonal and causal: the query at ``q`` sees the key at
  ``k`` when ``k <= q`` (and within a sliding window) and both belong to the
  same example (:func:`within_documents`);
* rotary and learned position embeddings read ``positions``, so an example
  sees the positions it would see alone.

So each example's outputs equal those of the example run alone. A fused
attention kernel (:mod:`lmkit.layers.kernels`) that masks causally only
leaves such windows to the matmuls, and says so once
(:func:`leave_to_matmuls`: the trainer prints the kernel's ``declined``).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Tuple

import tensorflow as tf

from lmkit.core.errors import UsageError

__all__ = ["Documents", "documents_of", "leave_to_matmuls", "positions_in_documents", "within_documents"]


class Documents(NamedTuple):
    """Per token of a window: ``segment_ids`` (the example it belongs to; None: one example a row) and
    ``positions`` (its position in its example), each [batch, time] int32."""

    segment_ids: Optional[tf.Tensor]
    positions: tf.Tensor


def positions_in_documents(segment_ids: tf.Tensor) -> tf.Tensor:
    """Each token's position in its run of equal ``segment_ids`` [batch, time]: 0 where a run starts."""
    segment_ids = tf.convert_to_tensor(segment_ids)
    batch, length = tf.shape(segment_ids)[0], tf.shape(segment_ids)[1]
    index = tf.broadcast_to(tf.range(length)[tf.newaxis, :], [batch, length])
    starts = tf.concat([tf.ones([batch, 1], tf.bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
    runs = tf.cumsum(tf.cast(starts, tf.int32), axis=1) - 1 + tf.range(batch)[:, tf.newaxis] * length
    first = tf.math.unsorted_segment_min(tf.reshape(index, [-1]), tf.reshape(runs, [-1]), batch * length)
    return index - tf.gather(first, runs)


def documents_of(segment_ids: Any, positions: Any, state: Any) -> Optional[Documents]:
    """The :class:`Documents` of a teacher-forced call's ``segment_ids`` and ``positions`` (either may be
    None; ``positions`` default to :func:`positions_in_documents`); None when both are.

    Raises:
      UsageError: with a decoding state (packed windows are for the call without a cache).
    """
    if segment_ids is None and positions is None:
        return None
    if state is not None:
        raise UsageError("positions and segment_ids describe a packed training window, which is run without a "
                         "state; leave them out when decoding with a cache")
    if segment_ids is not None:
        segment_ids = tf.cast(segment_ids, tf.int32)
    positions = positions_in_documents(segment_ids) if positions is None else tf.cast(positions, tf.int32)
    return Documents(segment_ids, positions)


def within_documents(mask: tf.Tensor, segment_ids: Optional[tf.Tensor], queries: Tuple[int, Any] = (0, None),
                     keys: Tuple[int, Any] = (0, None)) -> tf.Tensor:
    """``mask`` [1 or batch, 1, time, keys] where the query and the key also belong to the same example.

    Args:
      mask: the causal mask of the queries ``queries`` and keys ``keys`` of the window.
      segment_ids: [batch, window] int32, or None (``mask`` unchanged).
      queries, keys: ``(start, end)`` of the window's positions the mask's rows and columns are.
    """
    if segment_ids is None:
        return mask
    rows = segment_ids[:, queries[0]:queries[1]]
    columns = segment_ids[:, keys[0]:keys[1]]
    same = tf.equal(rows[:, :, tf.newaxis], columns[:, tf.newaxis, :])  # [batch, time, keys]
    return tf.logical_and(mask, same[:, tf.newaxis])


def leave_to_matmuls(kernel: Any) -> None:
    """Notes on ``kernel`` (its ``declined``, printed once by the trainer) that packed windows keep the
    matmuls: it masks causally only."""
    declined = getattr(kernel, "declined", None)
    if isinstance(declined, dict):
        declined["packed windows (several examples a window)"] = (
            f"the {getattr(kernel, 'name', 'fused')} kernel masks causally only, and a packed window needs a "
            "block-diagonal mask; the matmuls compute them")
