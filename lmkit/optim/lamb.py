"""LAMB (You et al., 2019): Adam with a per-layer trust ratio."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import tensorflow as tf

from lmkit.errors import UsageError
from lmkit.optim.adam import check_betas
from lmkit.optim.base import Optimizer, StepContext, WeightDecayFilter

__all__ = ["LAMB"]


class LAMB(Optimizer):
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
        """Creates the optimizer.

        Args:
          learning_rate: initial learning rate (>= 0).
          beta1: decay of the first moment, in [0, 1).
          beta2: decay of the second moment, in [0, 1).
          epsilon: added to ``sqrt(v_hat)``, > 0.
          weight_decay: coefficient of ``w`` added to the update before the
            trust ratio (>= 0; the paper uses 0.01).
          bias_correction: divide the moments by ``1 - beta^t`` (as Adam).
          exclude_from_weight_decay: see :class:`lmkit.optim.Optimizer`.
          name: module name.

        Raises:
          UsageError: (a ValueError) a value is out of range.
        """
        super().__init__(learning_rate=learning_rate, weight_decay=weight_decay,
                         exclude_from_weight_decay=exclude_from_weight_decay, name=name)
        self.beta1, self.beta2, self.epsilon = check_betas(beta1, beta2, epsilon)
        if not isinstance(bias_correction, bool):
            raise UsageError(f"bias_correction = {bias_correction!r} must be True or False")
        self.bias_correction = bias_correction

    def _slot_shapes(self, var: tf.Variable) -> List[Tuple[str, tf.TensorShape]]:
        return [("m", var.shape), ("v", var.shape)]

    def _apply_dense(self, grad: tf.Tensor, var: tf.Variable, slots: Dict[str, tf.Variable],
                     ctx: StepContext) -> None:
        m, v = slots["m"], slots["v"]
        m_new = self.beta1 * m + (1.0 - self.beta1) * grad
        v_new = self.beta2 * v + (1.0 - self.beta2) * tf.square(grad)
        m_hat, v_hat = m_new, v_new
        if self.bias_correction:
            m_hat = m_new / (1.0 - tf.pow(self.beta1, ctx.step))
            v_hat = v_new / (1.0 - tf.pow(self.beta2, ctx.step))
        update = m_hat / (tf.sqrt(v_hat) + self.epsilon)
        if self.decays(var):
            update = update + self.weight_decay * var
        w_norm = tf.norm(var)
        u_norm = tf.norm(update)
        usable = tf.logical_and(w_norm > 0.0, u_norm > 0.0)
        # the safe denominator keeps a 0/0 NaN out of the discarded branch too
        ratio = tf.where(usable, w_norm / tf.where(usable, u_norm, 1.0), 1.0)
        m.assign(m_new)
        v.assign(v_new)
        var.assign_sub(ctx.lr * ratio * update)

    def get_config(self) -> Dict[str, object]:
        return {**super().get_config(), "beta1": self.beta1, "beta2": self.beta2,
                "epsilon": self.epsilon, "bias_correction": self.bias_correction}
