"""Stochastic gradient descent with optional (Nesterov) momentum."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.optim.base import Optimizer, StepContext, WeightDecayFilter, check_number

__all__ = ["SGD"]


class SGD(Optimizer):
    """SGD, optionally with heavy-ball or Nesterov momentum.

    With gradient ``g``, weight decay ``wd`` (an L2 term added to the
    gradient: ``g <- g + wd * w``), momentum ``mu`` and learning rate ``lr``::

        momentum == 0:  w <- w - lr * g
        heavy ball:     m <- mu * m + g;   w <- w - lr * m
        Nesterov:       m <- mu * m + g;   w <- w - lr * (g + mu * m)

    (the ``tf.compat.v1.train.MomentumOptimizer`` / PyTorch form: ``lr`` stays
    outside the accumulator, so a new learning rate acts at once).

    ``IndexedSlices`` gradients: plain SGD on a variable without weight decay
    is a sparse ``scatter_sub`` of the touched rows (duplicate indices add up),
    the efficient path for embeddings. With momentum or weight decay every row
    changes, so the gradient is densified (exact, not "lazy" momentum).

    The slot is ``momentum`` (only when ``momentum > 0``).
    """

    def __init__(self, *, learning_rate: float = 0.01, momentum: float = 0.0,
                 nesterov: bool = False, weight_decay: float = 0.0,
                 exclude_from_weight_decay: WeightDecayFilter = None,
                 name: Optional[str] = None) -> None:
        """Creates the optimizer.

        Args:
          learning_rate: initial learning rate (>= 0).
          momentum: momentum coefficient in [0, 1); 0 means plain SGD.
          nesterov: use Nesterov momentum (needs ``momentum > 0``).
          weight_decay: L2 coefficient added to the gradient (>= 0).
          exclude_from_weight_decay: see :class:`lmkit.optim.Optimizer`.
          name: module name.

        Raises:
          UsageError: (a ValueError) a value is out of range or ``nesterov``
            is set without momentum.
        """
        super().__init__(learning_rate=learning_rate, weight_decay=weight_decay,
                         exclude_from_weight_decay=exclude_from_weight_decay, name=name)
        self.momentum = check_number("momentum", momentum, low=0.0, high=1.0, high_open=True,
                                     fix="typical values are 0 (plain SGD) or 0.9")
        if not isinstance(nesterov, bool):
            raise UsageError(f"nesterov = {nesterov!r} must be True or False")
        if nesterov and self.momentum == 0.0:
            raise UsageError("nesterov = True needs momentum > 0; set momentum (e.g. 0.9) "
                             "or nesterov = False")
        self.nesterov = nesterov

    def _slot_shapes(self, var: tf.Variable) -> List[Tuple[str, tf.TensorShape]]:
        return [("momentum", var.shape)] if self.momentum > 0.0 else []

    def _apply_dense(self, grad: tf.Tensor, var: tf.Variable, slots: Dict[str, tf.Variable],
                     ctx: StepContext) -> None:
        if self.decays(var):
            grad = grad + self.weight_decay * var
        if self.momentum == 0.0:
            ctx.assign_sub(var, ctx.lr * grad)
            return
        m = slots["momentum"]
        m_new = self.momentum * m + grad
        ctx.assign(m, m_new)
        step = grad + self.momentum * m_new if self.nesterov else m_new
        ctx.assign_sub(var, ctx.lr * step)

    def _apply_sparse(self, grad: tf.IndexedSlices, var: tf.Variable,
                      slots: Dict[str, tf.Variable], ctx: StepContext) -> None:
        if self.momentum == 0.0 and not self.decays(var):
            # scatter_sub adds the contributions of duplicate indices
            ctx.scatter_sub(var, tf.IndexedSlices(ctx.lr * grad.values, grad.indices, grad.dense_shape))
            return
        super()._apply_sparse(grad, var, slots, ctx)

    def get_config(self) -> Dict[str, object]:
        return {**super().get_config(), "momentum": self.momentum, "nesterov": self.nesterov}
