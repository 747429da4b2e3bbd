"""LARC: layer-wise adaptive rate control around any optimizer (OpenSeq2Seq).

Configured as in OpenSeq2Seq (``optimizers/optimizers.py``,
``post_process_gradients``)::

    larc_params = {"larc_eta": 0.002, "larc_mode": "clip", "min_update": 1e-7, "epsilon": 1e-7}

For each variable ``w`` with gradient ``g`` (after averaging and clipping)
and the current learning rate ``lr``, the gradient is multiplied by::

    scale mode:  f = max(eta * ||w|| / (||g|| + epsilon), min_update)
    clip mode:   f = min(max(eta * ||w|| / (lr * (||g|| + epsilon)), min_update), 1)

before the wrapped optimizer sees it. In scale mode every layer's step
becomes about ``lr * eta * ||w||`` (LARS); in clip mode the local rate
``eta * ||w|| / ||g||`` only caps the global ``lr``: layers whose step
``lr * ||g||`` would exceed ``eta * ||w||`` are slowed down, the others keep
``lr``. The factors use float32 norms of the dense gradient (``IndexedSlices``
duplicates summed) and the scaled gradient keeps its type, so sparse SGD stays
sparse.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

import tensorflow as tf

from lmkit.core.checks import did_you_mean
from lmkit.core.errors import UsageError
from lmkit.optim.base import GradientOrNone, Optimizer, check_number
from lmkit.optim.clipping import gradient_norm, scale_gradient

__all__ = ["LARC", "LARC_MODES", "LARC_PARAMS", "larc_factor"]

LARC_MODES = ("clip", "scale")
#: The keys of ``larc_params`` and their defaults (``larc_eta`` is required).
LARC_PARAMS: Dict[str, Any] = {"larc_eta": None, "larc_mode": "clip", "min_update": 1e-7,
                               "epsilon": 1e-7}


def larc_factor(grad_norm: tf.Tensor, var_norm: tf.Tensor, lr: tf.Tensor, *, larc_eta: float,
                larc_mode: str = "clip", min_update: float = 1e-7,
                epsilon: float = 1e-7) -> tf.Tensor:
    """The LARC multiplier of one gradient (formulas in the module docstring).

    Args:
      grad_norm: float32 scalar ``||g||``.
      var_norm: float32 scalar ``||w||``.
      lr: float32 scalar learning rate (used in clip mode only).
      larc_eta: trust coefficient ``eta``.
      larc_mode: ``"clip"`` or ``"scale"``.
      min_update: lower bound of the factor.
      epsilon: added to ``||g||``.

    Returns:
      float32 scalar factor.
    """
    if larc_mode == "clip":
        factor = tf.maximum(larc_eta * var_norm / (lr * (grad_norm + epsilon)), min_update)
        return tf.minimum(factor, 1.0)
    return tf.maximum(larc_eta * var_norm / (grad_norm + epsilon), min_update)


class LARC(Optimizer):
    """Wraps an optimizer and rescales each gradient by its LARC factor.

    The wrapper shares the wrapped optimizer's ``learning_rate`` and
    ``iterations`` variables and slots, so the trainer, the broadcast and the
    checkpoint treat it like any optimizer::

        opt = LARC(SGD(learning_rate=1.0), larc_eta=0.002, larc_mode="clip")

    Differences from OpenSeq2Seq: OpenSeq2Seq refuses LARC together with
    gradient clipping; lmkit allows both (clipping runs first, in the
    trainer). Weight decay of the wrapped optimizer is added after the LARC
    factor (OpenSeq2Seq's weight decay was a loss term, hence before it).

    Attributes:
      optimizer: the wrapped optimizer.
      larc_eta, larc_mode, min_update, epsilon: the LARC settings.
    """

    def __init__(self, optimizer: Optimizer, *, larc_eta: float, larc_mode: str = "clip",
                 min_update: float = 1e-7, epsilon: float = 1e-7,
                 name: Optional[str] = None) -> None:
        """Wraps ``optimizer``.

        Args:
          optimizer: any :class:`lmkit.optim.Optimizer` (not already LARC).
          larc_eta: trust coefficient ``eta`` > 0 (OpenSeq2Seq uses 0.002).
          larc_mode: ``"clip"`` (default) or ``"scale"``.
          min_update: lower bound of the factor, >= 0.
          epsilon: added to the gradient norm, >= 0.
          name: module name; default ``larc``.

        Raises:
          UsageError: (a ValueError) a bad value or a non-optimizer argument.
        """
        # Not Optimizer.__init__: the wrapper must not own a second learning
        # rate or step counter, it reuses those of the wrapped optimizer.
        tf.Module.__init__(self, name=name or "larc")
        if not isinstance(optimizer, Optimizer) or isinstance(optimizer, LARC):
            raise UsageError(f"optimizer = {optimizer!r} must be an lmkit.optim.Optimizer "
                             f"that is not itself LARC-wrapped")
        if larc_mode not in LARC_MODES:
            raise UsageError(f"larc_mode = {larc_mode!r} is not one of {', '.join(LARC_MODES)}")
        self.larc_eta = check_number("larc_eta", larc_eta, low=0.0, low_open=True,
                                     fix="OpenSeq2Seq uses 0.002")
        self.larc_mode = larc_mode
        self.min_update = check_number("min_update", min_update, low=0.0, fix="default 1e-7")
        self.epsilon = check_number("epsilon", epsilon, low=0.0, fix="default 1e-7")
        self.optimizer = optimizer
        self.learning_rate = optimizer.learning_rate
        self.iterations = optimizer.iterations

    @classmethod
    def from_params(cls, optimizer: Optimizer, larc_params: Mapping[str, Any]) -> "LARC":
        """Wraps ``optimizer`` with a ``TrainConfig.larc_params`` dict.

        Raises:
          UsageError: (a ValueError) an unknown key, a missing ``larc_eta`` or
            a bad value.
        """
        if not isinstance(larc_params, Mapping):
            raise UsageError(f"larc_params = {larc_params!r} must be a dict such as "
                             f"{{'larc_eta': 0.002, 'larc_mode': 'clip'}}")
        for key in larc_params:
            if key not in LARC_PARAMS:
                raise UsageError(f"larc_params: unknown key {key!r}; "
                                 f"{did_you_mean(key, LARC_PARAMS, listing='known keys')}")
        if "larc_eta" not in larc_params:
            raise UsageError("larc_params: missing required key 'larc_eta'; add e.g. "
                             "'larc_eta': 0.002")
        return cls(optimizer, **dict(larc_params))

    # The wrapper's state is the wrapped optimizer's.
    def build(self, var_list: Iterable[tf.Variable]) -> None:
        """Builds the wrapped optimizer's slots."""
        self.optimizer.build(var_list)

    @property
    def variables(self) -> List[tf.Variable]:
        """The wrapped optimizer's variables (LARC has no state of its own)."""
        return self.optimizer.variables

    @property
    def built_variables(self) -> int:
        """Number of model variables whose slots exist."""
        return self.optimizer.built_variables

    @property
    def weight_decay(self) -> float:  # type: ignore[override]
        return self.optimizer.weight_decay

    def slots(self, var: tf.Variable) -> Dict[str, tf.Variable]:
        """The wrapped optimizer's slots of ``var``."""
        return self.optimizer.slots(var)

    def decays(self, var: tf.Variable) -> bool:
        """Whether the wrapped optimizer decays ``var``."""
        return self.optimizer.decays(var)

    def factors(self, grads_and_vars: Iterable[Tuple[GradientOrNone, tf.Variable]]
                ) -> List[Optional[tf.Tensor]]:
        """The LARC factor of each pair at the current learning rate (None for a None gradient)."""
        lr = tf.identity(self.learning_rate)
        out: List[Optional[tf.Tensor]] = []
        for grad, var in grads_and_vars:
            if grad is None:
                out.append(None)
                continue
            out.append(larc_factor(gradient_norm(grad), tf.norm(tf.cast(var, tf.float32)), lr,
                                   larc_eta=self.larc_eta, larc_mode=self.larc_mode,
                                   min_update=self.min_update, epsilon=self.epsilon))
        return out

    def apply_gradients(self, grads_and_vars: Iterable[Tuple[GradientOrNone, tf.Variable]],
                        apply_if: Optional[tf.Tensor] = None) -> None:
        """Rescales each gradient by its LARC factor, then applies the wrapped optimizer.

        Args:
          grads_and_vars: ``(gradient, variable)`` pairs (None gradients skipped).
          apply_if: as in :meth:`lmkit.optim.Optimizer.apply_gradients`.
        """
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        factors = self.factors(pairs)
        self.optimizer.apply_gradients(
            [(scale_gradient(g, f), v) for (g, v), f in zip(pairs, factors)], apply_if=apply_if)

    def get_config(self) -> Dict[str, object]:
        return {"optimizer": type(self.optimizer).__name__, **self.optimizer.get_config(),
                "larc_eta": self.larc_eta, "larc_mode": self.larc_mode,
                "min_update": self.min_update, "epsilon": self.epsilon}
