"""Gradient clipping by global norm and by per-variable (per-layer) norm.

The trainer clips AFTER averaging the gradients over the workers, so every
rank clips the same gradient by the same factor and the replicas stay equal.

``IndexedSlices`` gradients (embedding lookups) stay sparse: their norm is
that of the dense gradient they stand for, i.e. duplicate indices are summed
first (``tf.clip_by_global_norm`` takes the norm of the raw values, which is
wrong when an index repeats), and the clipped result is the same slices with
scaled values.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import tensorflow as tf

from lmkit.optim.base import GradientOrNone, check_number

__all__ = [
    "summed_rows",
    "gradient_norm",
    "global_norm",
    "scale_gradient",
    "clip_by_global_norm",
    "clip_by_layer_norm",
    "clip_gradients",
]


def summed_rows(grad: tf.IndexedSlices) -> tf.Tensor:
    """The rows of the dense gradient that ``grad`` touches, duplicates summed.

    Sorting keeps every shape static (``tf.unique``'s output size depends on
    the data), which suits XLA (``jit_compile=True``).

    Args:
      grad: slices whose ``indices`` may repeat, values ``[n, ...]``.

    Returns:
      ``[n, ...]``: one row per distinct index (the sum of its slices), then
      zero rows; the same norm as the dense gradient.
    """
    # int64 throughout: TensorFlow keeps int32 tensors in host memory on a GPU, so int32
    # index arithmetic here would copy the indices to the host and back every step.
    indices = tf.cast(grad.indices, tf.int64)  # [n]
    order = tf.argsort(indices)  # [n]
    indices = tf.gather(indices, order)  # [n] sorted
    values = tf.gather(grad.values, order)  # [n, ...]
    previous = tf.concat([indices[:1] - 1, indices[:-1]], axis=0)  # [n]; first row always new
    segment = tf.cumsum(tf.cast(tf.not_equal(indices, previous), tf.int64)) - 1  # [n]
    return tf.math.unsorted_segment_sum(values, segment, tf.shape(indices, out_type=tf.int64)[0])


def gradient_norm(grad: GradientOrNone) -> tf.Tensor:
    """The L2 norm (float32 scalar) of one gradient; 0 for None.

    For ``IndexedSlices`` this is the norm of the dense gradient (duplicate
    indices summed), computed without densifying.
    """
    if grad is None:
        return tf.constant(0.0, tf.float32)
    if isinstance(grad, tf.IndexedSlices):
        grad = summed_rows(grad)
    return tf.norm(tf.cast(grad, tf.float32))


def global_norm(grads: Sequence[GradientOrNone]) -> tf.Tensor:
    """``sqrt(sum_i ||g_i||^2)`` over the gradients (None entries ignored)."""
    squares = [tf.square(gradient_norm(g)) for g in grads if g is not None]
    if not squares:
        return tf.constant(0.0, tf.float32)
    return tf.sqrt(tf.add_n(squares))


def scale_gradient(grad: GradientOrNone, factor: tf.Tensor) -> GradientOrNone:
    """``factor * grad``, keeping ``IndexedSlices`` sparse and None as None."""
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * tf.cast(factor, grad.values.dtype), grad.indices,
                                grad.dense_shape)
    return grad * tf.cast(factor, grad.dtype)


def _clip_factor(norm: tf.Tensor, max_norm: float) -> tf.Tensor:
    """``max_norm / max(norm, max_norm)``; NaN when ``norm`` is not finite.

    A NaN factor turns every gradient into NaN (as ``tf.clip_by_global_norm``
    does), so a non-finite gradient cannot slip through half-clipped.
    """
    factor = max_norm / tf.maximum(norm, max_norm)
    return tf.where(tf.math.is_finite(norm), factor, tf.constant(float("nan"), tf.float32))


def clip_by_global_norm(grads: Sequence[GradientOrNone],
                        max_norm: float) -> Tuple[List[GradientOrNone], tf.Tensor]:
    """Scales all gradients by ``max_norm / max(global_norm, max_norm)``.

    Args:
      grads: gradients (tensors, ``IndexedSlices`` or None), e.g. aligned with
        ``model.trainable_variables``.
      max_norm: the largest global norm let through, > 0.

    Returns:
      ``(clipped, norm)``: the clipped gradients in the same order (same
      types, None kept) and the global norm BEFORE clipping (float32 scalar).

    Raises:
      UsageError: (a ValueError) ``max_norm`` is not > 0.
    """
    max_norm = check_number("max_norm", max_norm, low=0.0, low_open=True,
                            fix="pass a positive norm, or skip clipping")
    grads = list(grads)
    norm = global_norm(grads)
    factor = _clip_factor(norm, max_norm)
    return [scale_gradient(g, factor) for g in grads], norm


def clip_by_layer_norm(grads: Sequence[GradientOrNone],
                       max_norm: float) -> List[GradientOrNone]:
    """Scales each gradient on its own by ``max_norm / max(||g_i||, max_norm)``.

    "Layer" means one variable: every gradient is clipped to ``max_norm``
    independently (``TrainConfig.max_grad_norm_per_layer``).

    Args:
      grads: gradients (tensors, ``IndexedSlices`` or None).
      max_norm: the largest norm let through per variable, > 0.

    Returns:
      The clipped gradients in the same order (same types, None kept); use
      :func:`gradient_norm` for the norms themselves.

    Raises:
      UsageError: (a ValueError) ``max_norm`` is not > 0.
    """
    max_norm = check_number("max_norm", max_norm, low=0.0, low_open=True,
                            fix="pass a positive norm, or skip clipping")
    return [scale_gradient(g, _clip_factor(gradient_norm(g), max_norm)) if g is not None else None
            for g in grads]


def clip_gradients(grads: Sequence[GradientOrNone], max_grad_norm: float = 0.0,
                   max_grad_norm_per_layer: float = 0.0) -> Tuple[List[GradientOrNone], tf.Tensor]:
    """Applies the clipping a ``TrainConfig`` asks for (0 turns a kind off).

    Per-variable clipping runs first, then global-norm clipping, so the
    result satisfies both limits.

    Args:
      grads: the averaged gradients.
      max_grad_norm: ``TrainConfig.max_grad_norm``; 0 = no global clipping.
      max_grad_norm_per_layer: ``TrainConfig.max_grad_norm_per_layer``; 0 = off.

    Returns:
      ``(clipped, norm)``: the gradients and the global norm of the gradients
      as passed in (before any clipping), for logging.

    Raises:
      UsageError: (a ValueError) a limit is negative.
    """
    check_number("max_grad_norm", max_grad_norm, low=0.0, fix="use 0 to turn clipping off")
    check_number("max_grad_norm_per_layer", max_grad_norm_per_layer, low=0.0,
                 fix="use 0 to turn clipping off")
    grads = list(grads)
    if max_grad_norm_per_layer > 0:
        norm = global_norm(grads)
        grads = clip_by_layer_norm(grads, max_grad_norm_per_layer)
        if max_grad_norm > 0:
            grads, _ = clip_by_global_norm(grads, max_grad_norm)
    elif max_grad_norm > 0:
        grads, norm = clip_by_global_norm(grads, max_grad_norm)
    else:
        norm = global_norm(grads)
    return grads, norm
