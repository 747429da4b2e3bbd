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

Integer labels go through :func:`sparse_softmax_cross_entropy`, which gives
the values and gradient of ``tf.nn.sparse_softmax_cross_entropy_with_logits``
in about half its time on CPU (measured in ``docs/performance.md``).
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from lmkit.config.validation import LOSS_REDUCTIONS
from lmkit.core.errors import UsageError

__all__ = ["LOSS_REDUCTIONS", "sequence_softmax_cross_entropy", "sparse_softmax_cross_entropy", "window_loss"]

def sparse_softmax_cross_entropy(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """``-log softmax(logits)[label]`` for every row, with its gradient.

    The same values and gradient (``softmax - onehot``) as
    ``tf.nn.sparse_softmax_cross_entropy_with_logits``, computed differently
    because TensorFlow's fused kernel is slow on CPU (``docs/performance.md``
    compares the two). The forward pass is
    one ``tf.nn.softmax``; the loss is ``logsumexp(logits) - logits[label]``
    with the logsumexp read off the softmax (``max(logits) - log(max(probs))``:
    the largest probability is at least ``1 / vocab``, so this is exact for
    large and infinite losses too, where the label's own probability
    underflows), and there is no branch on the data. The backward pass
    scales the kept probabilities and subtracts at the labels in one
    XLA-compiled pass.

    Args:
      labels: int tensor [...] of ids in [0, vocab).
      logits: float32 [..., vocab].

    Returns:
      float32 losses of shape ``labels.shape``.

    Raises:
      tf.errors.InvalidArgumentError: (on CPU, when run) a label outside [0, vocab).
    """
    logits = tf.convert_to_tensor(logits)
    labels = tf.convert_to_tensor(labels)
    vocab = tf.shape(logits)[-1]
    flat_logits = tf.reshape(logits, [-1, vocab])  # [n, vocab]
    flat_labels = tf.reshape(labels, [-1])  # [n]

    @tf.custom_gradient
    def xent(flat_logits):
        probs = tf.nn.softmax(flat_logits)  # [n, vocab]
        # logsumexp - logit[label] with the softmax's own sum: the largest probability
        # is exp(x_max - logsumexp) >= 1 / vocab, so log(p_max) never underflows and
        # the loss is exact (also above 87, where the label's probability is subnormal)
        # with no branch, which would make the host wait for a GPU's predicate.
        losses = ((tf.reduce_max(flat_logits, axis=1) - tf.gather(flat_logits, flat_labels, batch_dims=1))
                  - tf.math.log(tf.reduce_max(probs, axis=1)))  # [n]

        def grad(d_losses):
            return _xent_gradient(probs, flat_labels, d_losses)

        return losses, grad

    return tf.reshape(xent(flat_logits), tf.shape(labels))


def _xent_gradient_impl(probs: tf.Tensor, labels: tf.Tensor, d_losses: tf.Tensor) -> tf.Tensor:
    """(probs - onehot(labels)) * d_losses: probs [n, vocab], labels and d_losses [n]."""
    d_logits = probs * d_losses[:, tf.newaxis]  # [n, vocab]
    rows = tf.range(tf.shape(labels)[0], dtype=labels.dtype)
    at_labels = tf.stack([rows, labels], axis=1)  # [n, 2]
    return tf.tensor_scatter_nd_sub(d_logits, at_labels, d_losses)


# Compiled with XLA: the scale and the scatter become one pass that writes the
# [n, vocab] gradient once (TensorFlow's kernels copy it in the scatter).
_xent_gradient = tf.function(_xent_gradient_impl, jit_compile=True, reduce_retracing=True)


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
        raise UsageError("average_across_timesteps and sum_over_timesteps are both True; "
                         "set one of them to False")
    if average_across_batch and sum_over_batch:
        raise UsageError("average_across_batch and sum_over_batch are both True; set one of them to False")
    with tf.name_scope(name or "sequence_softmax_cross_entropy"):
        losses, weights = _masked(_token_losses(labels, logits), sequence_length, mask)  # [batch, time] each

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


def _masked(losses: tf.Tensor, sequence_length: Optional[tf.Tensor],
            mask: Optional[tf.Tensor]) -> "tuple[tf.Tensor, Optional[tf.Tensor]]":
    """``(losses with masked steps at 0, the float32 weights or None)`` from the lengths and the mask."""
    weights = None
    if sequence_length is not None:
        weights = tf.sequence_mask(sequence_length, maxlen=tf.shape(losses)[1], dtype=tf.float32)
    if mask is not None:
        mask = tf.cast(mask, tf.float32)
        weights = mask if weights is None else weights * mask
    if weights is not None:
        # where(), not a product: a masked step with inf/NaN logits must not poison the sum.
        losses = tf.where(weights > 0, losses * weights, tf.zeros_like(losses))
    return losses, weights


def _token_losses(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """The float32 cross entropy [batch, time] of ids [batch, time] or distributions [batch, time, vocab]."""
    logits = tf.convert_to_tensor(logits)
    if logits.shape.rank is not None and logits.shape.rank != 3:
        raise UsageError(f"logits have shape {logits.shape} but must be [batch, time, vocab]")
    logits = tf.cast(logits, tf.float32)  # softmax in float32 for mixed-precision models
    labels = tf.convert_to_tensor(labels)
    if labels.dtype.is_integer:
        if labels.shape.rank is not None and labels.shape.rank != 2:
            raise UsageError(f"integer labels have shape {labels.shape} but must be [batch, time] ids")
        return sparse_softmax_cross_entropy(labels, logits)
    if labels.shape.rank is not None and labels.shape.rank != 3:
        raise UsageError(f"float labels have shape {labels.shape} but must be [batch, time, vocab] "
                         f"distributions (pass integer ids for [batch, time])")
    return tf.nn.softmax_cross_entropy_with_logits(labels=tf.cast(labels, tf.float32), logits=logits)


def window_loss(labels: tf.Tensor, logits: tf.Tensor, reduction: str = "sum") -> tf.Tensor:
    """The training and evaluation loss of one window of ``labels`` [batch, time].

    Cross-entropy averaged over the window's rows and, over its time steps,
    summed (``reduction="sum"``: what every step of the trainer reports by
    default; divide by the window length for the per-token loss whose
    exponential is the perplexity) or averaged (``"mean"``: the loss per
    token, as nanoGPT and Hugging Face train).

    The two differ by the factor ``time`` and so do their gradients: the same
    ``max_grad_norm`` clips a summed loss's gradients ``time`` times harder,
    and Adam's ``epsilon`` weighs ``time`` times less against them.

    Raises:
      UsageError: an unknown ``reduction``.
    """
    if reduction not in LOSS_REDUCTIONS:
        raise UsageError(f"loss_reduction = {reduction!r} is not one of {', '.join(LOSS_REDUCTIONS)} (sum: over "
                         "the window's positions; mean: per token)")
    mean = reduction == "mean"
    return sequence_softmax_cross_entropy(labels, logits, average_across_batch=True,
                                          average_across_timesteps=mean, sum_over_timesteps=not mean)
