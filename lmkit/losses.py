"""Sequence losses with Texar's reduction semantics.

:func:`sequence_softmax_cross_entropy` computes the cross entropy of every
[batch, time] position, zeroes the positions outside the mask, then reduces
time and batch as asked, following ``texar.tf.losses`` (``mask_and_reduce`` /
``reduce_batch_time``):

* time: ``sum_over_timesteps`` sums; ``average_across_timesteps`` divides each
  row's sum by its number of unmasked steps (its ``sequence_length``, or the
  row sum of ``mask``), or takes the plain mean when there is no mask;
* batch (after time): ``sum_over_batch`` sums; ``average_across_batch`` takes
  the plain mean over rows (masked-out rows count, as in Texar);
* averaging and summing the same axis is a ``ValueError``; with neither the
  axis is kept.

The default (sum over time, mean over batch) is the Zaremba et al. training
loss. Softmax runs in float32 whatever the logits' dtype.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

__all__ = ["sequence_softmax_cross_entropy"]


def sequence_softmax_cross_entropy(labels: tf.Tensor,
                                   logits: tf.Tensor,
                                   sequence_length: Optional[tf.Tensor] = None,
                                   mask: Optional[tf.Tensor] = None,
                                   average_across_batch: bool = True,
                                   average_across_timesteps: bool = False,
                                   sum_over_batch: bool = False,
                                   sum_over_timesteps: bool = True,
                                   name: Optional[str] = None) -> tf.Tensor:
    """Softmax cross entropy of every time step, masked and reduced.

    Args:
      labels: target ids [batch, time] (any int dtype), or target
        distributions [batch, time, vocab] (a float tensor, as Texar's
        function takes).
      logits: [batch, time, vocab] unscaled log probabilities.
      sequence_length: optional [batch] ints; steps at or after a row's
        length get zero loss.
      mask: optional [batch, time] weights (bool or float; 1 keeps a step, 0
        drops it), multiplied with the length mask when both are given.
      average_across_batch: mean over the batch axis.
      average_across_timesteps: mean over each row's unmasked steps (a fully
        masked row gives 0, not NaN).
      sum_over_batch: sum over the batch axis.
      sum_over_timesteps: sum over the time axis.
      name: name scope.

    Returns:
      float32 loss: a scalar when both axes are reduced, [time] when only the
      batch is, [batch] when only time is, else [batch, time].

    Raises:
      ValueError: both averaging and summing one axis, or logits not of rank 3
        (or labels of the wrong rank).
    """
    if average_across_timesteps and sum_over_timesteps:
        raise ValueError("average_across_timesteps and sum_over_timesteps are both True; "
                         "set one of them to False")
    if average_across_batch and sum_over_batch:
        raise ValueError("average_across_batch and sum_over_batch are both True; set one of them to False")
    with tf.name_scope(name or "sequence_softmax_cross_entropy"):
        logits = tf.convert_to_tensor(logits)
        if logits.shape.rank is not None and logits.shape.rank != 3:
            raise ValueError(f"logits have shape {logits.shape} but must be [batch, time, vocab]")
        logits = tf.cast(logits, tf.float32)  # softmax in float32 for mixed-precision models
        labels = tf.convert_to_tensor(labels)
        if labels.dtype.is_integer:
            if labels.shape.rank is not None and labels.shape.rank != 2:
                raise ValueError(f"integer labels have shape {labels.shape} but must be [batch, time] ids")
            losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        else:
            if labels.shape.rank is not None and labels.shape.rank != 3:
                raise ValueError(f"float labels have shape {labels.shape} but must be [batch, time, vocab] "
                                 f"distributions (pass integer ids for [batch, time])")
            losses = tf.nn.softmax_cross_entropy_with_logits(labels=tf.cast(labels, tf.float32), logits=logits)
        # losses: [batch, time]

        weights = None
        if sequence_length is not None:
            weights = tf.sequence_mask(sequence_length, maxlen=tf.shape(losses)[1], dtype=tf.float32)
        if mask is not None:
            mask = tf.cast(mask, tf.float32)
            weights = mask if weights is None else weights * mask
        if weights is not None:
            # where(), not a product: a masked step with inf/NaN logits must not poison the sum.
            losses = tf.where(weights > 0, losses * weights, tf.zeros_like(losses))

        if sum_over_timesteps:
            losses = tf.reduce_sum(losses, axis=1)  # [batch]
        elif average_across_timesteps:
            if weights is None:
                losses = tf.reduce_mean(losses, axis=1)
            else:
                losses = tf.math.divide_no_nan(tf.reduce_sum(losses, axis=1), tf.reduce_sum(weights, axis=1))

        if sum_over_batch:
            losses = tf.reduce_sum(losses, axis=0)
        elif average_across_batch:
            losses = tf.reduce_mean(losses, axis=0)
        return losses
