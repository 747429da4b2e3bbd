"""Dynamic loss scaling for float16 training, decided the same way on every rank.

float16 keeps 10 bits of mantissa and flushes magnitudes below about 6e-8
to zero, so many gradients of a language model vanish in a float16 backward
pass. Multiplying the loss by a scale S (2**15 to start) moves them into
range; the gradients are divided by S again before anything uses them. Too
large an S overflows to Inf; the scale adapts:

* a step whose averaged gradients are all finite is applied; after
  ``growth_interval`` such steps in a row S doubles;
* a step with an Inf or NaN gradient is skipped (no update, the optimizer's
  slots untouched), S halves, and the skip is counted;
* ``max_consecutive_skips`` skips in a row mean the trouble is not the scale
  (S has fallen by 2**max_consecutive_skips): training stops as any
  non-finite loss does (exit status 3).

The check reads the gradients *after* they are averaged over the ranks, and
an Inf or NaN on one rank makes the average non-finite on all, so every rank
takes the same decision without another collective. The scale and its
counters are variables of this module, which the trainer checkpoints: a
resumed run continues with the scale it stopped at.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

import tensorflow as tf

from lmkit.core.checks import check_positive_float, check_positive_int

__all__ = ["DynamicLossScale"]


class DynamicLossScale(tf.Module):
    """The loss scale and its counters (all checkpointed).

    Args:
      initial_scale: the scale of the first step (``loss_scale`` in the config).
      growth_interval: finite steps in a row before the scale doubles.
      max_consecutive_skips: skipped steps in a row before training stops.
    """

    def __init__(self, initial_scale: float = 2.0 ** 15, growth_interval: int = 2000,
                 max_consecutive_skips: int = 20) -> None:
        super().__init__(name="loss_scale")
        self.initial_scale = check_positive_float("loss_scale", initial_scale)
        self.growth_interval = check_positive_int("loss_scale_growth_interval", growth_interval)
        self.max_consecutive_skips = check_positive_int("max_consecutive_skips", max_consecutive_skips)
        self.scale = tf.Variable(float(initial_scale), dtype=tf.float32, trainable=False, name="scale")
        self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="good_steps")
        self.skipped_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_steps")
        self.consecutive_skips = tf.Variable(0, dtype=tf.int64, trainable=False, name="consecutive_skips")

    def scale_loss(self, loss: tf.Tensor) -> tf.Tensor:
        """``loss * scale`` (float32)."""
        return loss * self.scale

    def unscale(self, grads: Sequence[Any]) -> List[Any]:
        """Gradients divided by the scale (``IndexedSlices`` stay sparse)."""
        inverse = 1.0 / self.scale
        out: List[Any] = []
        for g in grads:
            if g is None:
                out.append(None)
            elif isinstance(g, tf.IndexedSlices):
                out.append(tf.IndexedSlices(g.values * inverse, g.indices, g.dense_shape))
            else:
                out.append(g * inverse)
        return out

    def update(self, finite: tf.Tensor) -> tf.Tensor:
        """Adapts the scale after a step; returns False once training cannot recover.

        Args:
          finite: whether this step's averaged gradients (and loss) were finite.

        Returns:
          A bool tensor: False after ``max_consecutive_skips`` skips in a row.
        """
        # Selects, not a tf.cond: the decision stays on the device (no host wait on a GPU).
        finite = tf.convert_to_tensor(finite)
        good = tf.where(finite, self.good_steps + 1, tf.constant(0, tf.int64))
        grow = good >= self.growth_interval  # False after a skip (good = 0)
        self.scale.assign(tf.where(finite, tf.where(grow, self.scale * 2.0, self.scale),
                                   tf.maximum(self.scale * 0.5, 1e-30)))
        self.good_steps.assign(tf.where(grow, tf.constant(0, tf.int64), good))
        self.skipped_steps.assign_add(tf.where(finite, tf.constant(0, tf.int64), tf.constant(1, tf.int64)))
        consecutive = tf.where(finite, tf.constant(0, tf.int64), self.consecutive_skips + 1)
        self.consecutive_skips.assign(consecutive)
        return consecutive < self.max_consecutive_skips

    # The checkpoint's meta.json carries these (a checkpoint of another
    # precision then still loads: a missing entry leaves the initial scale).
    def to_meta(self) -> Dict[str, Any]:
        """The scale and counters as JSON values."""
        return {"scale": float(self.scale.numpy()), "good_steps": int(self.good_steps.numpy()),
                "skipped_steps": int(self.skipped_steps.numpy()),
                "consecutive_skips": int(self.consecutive_skips.numpy())}

    def from_meta(self, values: Dict[str, Any]) -> None:
        """Sets the scale and counters from :meth:`to_meta`'s dict."""
        self.scale.assign(float(values["scale"]))
        self.good_steps.assign(int(values["good_steps"]))
        self.skipped_steps.assign(int(values["skipped_steps"]))
        self.consecutive_skips.assign(int(values["consecutive_skips"]))
