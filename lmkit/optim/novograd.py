"""NovoGrad (Ginsburg et al., 2019): layer-wise normalised gradients + momentum."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import tensorflow as tf

from lmkit.core.checks import check_bool
from lmkit.optim.adam import check_betas
from lmkit.optim.base import Optimizer, StepContext, WeightDecayFilter

__all__ = ["NovoGrad"]


class NovoGrad(Optimizer):
    """NovoGrad as defined by OpenSeq2Seq's ``optimizers/novograd.py``.

    The second moment is one scalar per variable (per "layer"): a moving
    average of the squared gradient norm. For each variable ``w`` with
    gradient ``g``::

        n = ||g||_2^2
        v <- n                                  if v == 0 (first step)
        v <- beta2 * v + (1 - beta2) * n        otherwise
        d = g / sqrt(v + epsilon) + weight_decay * w
        d <- (1 - beta1) * d                    if grad_averaging
        m <- beta1 * m + d
        w <- w - lr * m

    The weight-decay term is added after the normalisation, so its strength
    does not depend on the gradient scale. Two details follow OpenSeq2Seq
    rather than the paper: epsilon sits inside the square root, and ``lr``
    multiplies ``m`` (a momentum optimizer) instead of entering ``m``.
    Unlike OpenSeq2Seq's TF1 code, whose moving average was rebound to a
    tensor and therefore never stored (``v`` was ``n`` at every step), ``v``
    is kept in a variable, as the paper intends.

    ``IndexedSlices`` gradients are densified: the norm must count duplicate
    indices once summed, and the momentum of every row decays.

    Slots: ``m`` (the variable's shape) and ``v`` (a scalar).
    """

    def __init__(self, *, learning_rate: float = 1.0, beta1: float = 0.95, beta2: float = 0.98,
                 epsilon: float = 1e-8, weight_decay: float = 0.0, grad_averaging: bool = False,
                 exclude_from_weight_decay: WeightDecayFilter = None,
                 name: Optional[str] = None) -> None:
        """Creates the optimizer (defaults as in OpenSeq2Seq).

        Args:
          learning_rate: initial learning rate (>= 0).
          beta1: momentum, in [0, 1).
          beta2: decay of the per-variable squared gradient norm, in [0, 1).
          epsilon: added to ``v`` under the square root, > 0.
          weight_decay: coefficient of ``w`` added to the normalised gradient.
          grad_averaging: multiply the momentum input by ``1 - beta1`` (an
            exponential average, as in Adam) instead of summing (momentum).
          exclude_from_weight_decay: see :class:`lmkit.optim.Optimizer`.
          name: module name.

        Raises:
          UsageError: (a ValueError) a value is out of range.
        """
        super().__init__(learning_rate=learning_rate, weight_decay=weight_decay,
                         exclude_from_weight_decay=exclude_from_weight_decay, name=name)
        self.beta1, self.beta2, self.epsilon = check_betas(beta1, beta2, epsilon)
        self.grad_averaging = check_bool("grad_averaging", grad_averaging)

    def _slot_shapes(self, var: tf.Variable) -> List[Tuple[str, tf.TensorShape]]:
        return [("m", var.shape), ("v", tf.TensorShape([]))]

    def _apply_dense(self, grad: tf.Tensor, var: tf.Variable, slots: Dict[str, tf.Variable],
                     ctx: StepContext) -> None:
        m, v = slots["m"], slots["v"]
        norm_sq = tf.reduce_sum(tf.square(grad))  # [] one second moment per variable
        v_new = tf.where(tf.equal(v, 0.0), norm_sq, self.beta2 * v + (1.0 - self.beta2) * norm_sq)
        direction = grad / tf.sqrt(v_new + self.epsilon)
        if self.decays(var):
            direction = direction + self.weight_decay * var
        if self.grad_averaging:
            direction = (1.0 - self.beta1) * direction
        m_new = self.beta1 * m + direction
        ctx.assign(v, v_new)
        ctx.assign(m, m_new)
        ctx.assign_sub(var, ctx.lr * m_new)

    def get_config(self) -> Dict[str, object]:
        return {**super().get_config(), "beta1": self.beta1, "beta2": self.beta2,
                "epsilon": self.epsilon, "grad_averaging": self.grad_averaging}
