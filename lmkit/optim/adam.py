"""Adam (Kingma & Ba, 2015) and AdamW (Loshchilov & Hutter, 2019)."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import tensorflow as tf

from lmkit.optim.base import Optimizer, StepContext, WeightDecayFilter, check_number

__all__ = ["Adam", "AdamW", "check_betas"]


def check_betas(beta1: float, beta2: float, epsilon: float) -> Tuple[float, float, float]:
    """Checks the Adam-family hyper-parameters; returns them as floats.

    Raises:
      UsageError: (a ValueError) a value is out of range.
    """
    b1 = check_number("beta1", beta1, low=0.0, high=1.0, high_open=True, fix="typical: 0.9")
    b2 = check_number("beta2", beta2, low=0.0, high=1.0, high_open=True, fix="typical: 0.999")
    eps = check_number("epsilon", epsilon, low=0.0, low_open=True, fix="typical: 1e-8")
    return b1, b2, eps


def adam_direction(grad: tf.Tensor, slots: Dict[str, tf.Variable], ctx: StepContext, beta1: float,
                   beta2: float, epsilon: float, bias_correction: bool = True) -> tf.Tensor:
    """Updates Adam's moments ``slots["m"]``, ``slots["v"]`` and returns its direction.

    ``m <- beta1 m + (1 - beta1) g``, ``v <- beta2 v + (1 - beta2) g^2``, and
    the direction ``m_hat / (sqrt(v_hat) + epsilon)`` with the bias-corrected
    moments (``m / (1 - beta1^step)``) or, without ``bias_correction``, the
    raw ones (``ctx.step`` is the 1-based update number). Shared by :class:`Adam`, :class:`AdamW` and ``LAMB``.
    """
    m, v = slots["m"], slots["v"]
    m_new = beta1 * m + (1.0 - beta1) * grad
    v_new = beta2 * v + (1.0 - beta2) * tf.square(grad)
    m_hat, v_hat = m_new, v_new
    if bias_correction:
        m_hat = m_new / (1.0 - tf.pow(beta1, ctx.step))
        v_hat = v_new / (1.0 - tf.pow(beta2, ctx.step))
    ctx.assign(m, m_new)
    ctx.assign(v, v_new)
    return m_hat / (tf.sqrt(v_hat) + epsilon)


class Adam(Optimizer):
    """Adam with bias correction; optional L2 weight decay in the gradient.

    At update ``t = iterations + 1``, with gradient ``g`` (plus ``wd * w`` when
    weight decay applies to the variable: "coupled" L2 decay)::

        m <- beta1 * m + (1 - beta1) * g
        v <- beta2 * v + (1 - beta2) * g^2
        m_hat = m / (1 - beta1^t);   v_hat = v / (1 - beta2^t)
        w <- w - lr * m_hat / (sqrt(v_hat) + epsilon)

    (epsilon outside the square root of the corrected ``v``, as in the paper
    and PyTorch; ``tf.compat.v1.train.AdamOptimizer`` puts it on the
    uncorrected ``v``). ``IndexedSlices`` gradients are densified (duplicates
    summed), so the update equals the dense one: moments of absent rows decay.

    Slots: ``m``, ``v``.
    """

    #: True in :class:`AdamW`: weight decay acts on the weights, not the gradient.
    decoupled_weight_decay = False

    def __init__(self, *, learning_rate: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8, weight_decay: float = 0.0,
                 exclude_from_weight_decay: WeightDecayFilter = None,
                 name: Optional[str] = None) -> None:
        """Creates the optimizer.

        Args:
          learning_rate: initial learning rate (>= 0).
          beta1: decay of the first moment, in [0, 1).
          beta2: decay of the second moment, in [0, 1).
          epsilon: added to ``sqrt(v_hat)``, > 0.
          weight_decay: decay coefficient (>= 0); see the class docstring.
          exclude_from_weight_decay: see :class:`lmkit.optim.Optimizer`.
          name: module name.

        Raises:
          UsageError: (a ValueError) a value is out of range.
        """
        super().__init__(learning_rate=learning_rate, weight_decay=weight_decay,
                         exclude_from_weight_decay=exclude_from_weight_decay, name=name)
        self.beta1, self.beta2, self.epsilon = check_betas(beta1, beta2, epsilon)

    def _slot_shapes(self, var: tf.Variable) -> List[Tuple[str, tf.TensorShape]]:
        return [("m", var.shape), ("v", var.shape)]

    def _apply_dense(self, grad: tf.Tensor, var: tf.Variable, slots: Dict[str, tf.Variable],
                     ctx: StepContext) -> None:
        decay = self.decays(var)
        if decay and not self.decoupled_weight_decay:
            grad = grad + self.weight_decay * var
        update = adam_direction(grad, slots, ctx, self.beta1, self.beta2, self.epsilon)
        if decay and self.decoupled_weight_decay:
            update = update + self.weight_decay * var
        ctx.assign_sub(var, ctx.lr * update)

    def get_config(self) -> Dict[str, object]:
        return {**super().get_config(), "beta1": self.beta1, "beta2": self.beta2,
                "epsilon": self.epsilon}


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter, 2019).

    Same moments as :class:`Adam`, but the decay acts on the weights and is
    not rescaled by ``v``::

        w <- w - lr * (m_hat / (sqrt(v_hat) + epsilon) + weight_decay * w)

    i.e. the decay is multiplied by the learning rate (PyTorch's convention),
    so it follows warmup and the schedule. Typical ``weight_decay``: 0.01,
    with ``exclude_from_weight_decay=["bias", "layer_norm"]``.
    """

    decoupled_weight_decay = True

    def __init__(self, *, learning_rate: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8, weight_decay: float = 0.01,
                 exclude_from_weight_decay: WeightDecayFilter = None,
                 name: Optional[str] = None) -> None:
        """Creates the optimizer; arguments as in :class:`Adam` (default decay 0.01)."""
        super().__init__(learning_rate=learning_rate, beta1=beta1, beta2=beta2, epsilon=epsilon,
                         weight_decay=weight_decay,
                         exclude_from_weight_decay=exclude_from_weight_decay, name=name)
