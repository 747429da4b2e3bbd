"""LAMB (You et al., 2019): Adam with a per-layer trust ratio."""

from __future__ import annotations

from typing import Dict, Optional

import tensorflow as tf

from lmkit.core.checks import check_bool
from lmkit.optim.adam import Adam, adam_direction
from lmkit.optim.base import StepContext, WeightDecayFilter

__all__ = ["LAMB"]


class LAMB(Adam):
    """Layer-wise Adaptive Moments for Batch training (You et al., 2019).

    At update ``t = iterations + 1``, for each variable ``w`` with gradient ``g``::

        m <- beta1 * m + (1 - beta1) * g
        v <- beta2 * v + (1 - beta2) * g^2
        m_hat = m / (1 - beta1^t);   v_hat = v / (1 - beta2^t)   (if bias_correction)
        u = m_hat / (sqrt(v_hat) + epsilon) + weight_decay * w
        r = ||w|| / ||u||     (r = 1 when ||w|| = 0 or ||u|| = 0)
        w <- w - lr * r * u

    The trust ratio ``r`` makes each layer's step proportional to its weight
    norm, so layers of very different scales train at the same relative
    speed. ``IndexedSlices`` gradients are densified (the norms need the
    whole update).

    Slots: ``m``, ``v``.
    """

    def __init__(self, *, learning_rate: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-6, weight_decay: float = 0.0, bias_correction: bool = True,
                 exclude_from_weight_decay: WeightDecayFilter = None,
                 name: Optional[str] = None) -> None:
        """Creates the optimizer; arguments as in :class:`~lmkit.optim.Adam`, plus:

        Args:
          weight_decay: coefficient of ``w`` added to the update before the
            trust ratio (>= 0; the paper uses 0.01).
          bias_correction: divide the moments by ``1 - beta^t`` (as Adam).

        Raises:
          UsageError: (a ValueError) a value is out of range.
        """
        super().__init__(learning_rate=learning_rate, beta1=beta1, beta2=beta2, epsilon=epsilon,
                         weight_decay=weight_decay,
                         exclude_from_weight_decay=exclude_from_weight_decay, name=name)
        self.bias_correction = check_bool("bias_correction", bias_correction)

    def _apply_dense(self, grad: tf.Tensor, var: tf.Variable, slots: Dict[str, tf.Variable],
                     ctx: StepContext) -> None:
        update = adam_direction(grad, slots, ctx, self.beta1, self.beta2, self.epsilon,
                                self.bias_correction)
        if self.decays(var):
            update = update + self.weight_decay * var
        w_norm = tf.norm(var)
        u_norm = tf.norm(update)
        usable = tf.logical_and(w_norm > 0.0, u_norm > 0.0)
        # the safe denominator keeps a 0/0 NaN out of the discarded branch too
        ratio = tf.where(usable, w_norm / tf.where(usable, u_norm, 1.0), 1.0)
        ctx.assign_sub(var, ctx.lr * ratio * update)

    def get_config(self) -> Dict[str, object]:
        return {**super().get_config(), "bias_correction": self.bias_correction}
