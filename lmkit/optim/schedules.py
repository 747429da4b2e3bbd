"""Learning-rate policy for large batches, as composable pieces.

The learning rate at global step ``s`` (0-based count of updates already
applied, i.e. ``optimizer.iterations``) is built from three pieces:

1. **Scaling by the number of workers** ``N`` (:func:`scale_learning_rate`):
   ``none``: ``lr``; ``linear``: ``lr * N`` (Goyal et al., 2017);
   ``sqrt``: ``lr * sqrt(N)`` (Krizhevsky, 2014; Hoffer et al., 2017).
   Call the result ``peak``.
2. **Linear warmup per step** (:class:`LinearWarmup`) over
   ``W = round(warmup_epochs * steps_per_epoch)`` steps, as Horovod's
   ``LearningRateWarmupCallback``: from ``peak / N`` (the single-worker rate
   under linear scaling) rising linearly to ``peak``::

       lr(s) = peak / N * (1 + (N - 1) * s / W)        for s < W

   It is a no-op for ``N = 1`` unless ``warmup_start_factor`` says otherwise.
   (Horovod reaches ``peak`` on the last warmup step; here step ``W``, the
   first step after the warmup, is the first at ``peak``, so step 0 is
   exactly ``peak / N``.)
3. **A schedule** for ``s >= W`` (the hand-over is at step ``W``):

   * ``exponential`` (:class:`ExponentialDecay`), the PTB/Zaremba policy by
     epoch: ``peak * lr_decay ** max(e - lr_decay_start_epoch + 1, 0)`` where
     ``e = s // steps_per_epoch`` is the 0-based epoch index, so epochs
     ``e >= lr_decay_start_epoch`` are decayed;
   * ``piecewise`` (:class:`PiecewiseConstant`): ``peak * values[i]`` where
     ``i`` is the number of ``boundaries`` (in epochs) already reached;
   * ``polynomial`` (:class:`PolynomialDecay`) and ``cosine``
     (:class:`CosineDecay`) from ``peak`` at step ``W`` to ``end_lr`` at
     ``total_epochs * steps_per_epoch``, then constant;
   * ``constant`` (:class:`ConstantSchedule`).

   Epoch-based schedules count epochs from the start of training, so a
   decay boundary inside the warmup takes effect at the hand-over.

:class:`lmkit.optim.policy.LearningRatePolicy` combines them; it maps a
Python int or an int tensor (also inside ``tf.function``) to a float32
tensor, with the same value either way (all arithmetic is float64 TensorFlow
ops, cast at the end).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Sequence, Union

import tensorflow as tf

from lmkit.core.checks import did_you_mean
from lmkit.core.errors import UsageError
from lmkit.optim.base import check_number

__all__ = [
    "LR_SCALINGS",
    "SCHEDULES",
    "scale_learning_rate",
    "Schedule",
    "ConstantSchedule",
    "ExponentialDecay",
    "PiecewiseConstant",
    "PolynomialDecay",
    "CosineDecay",
    "LinearWarmup",
    "make_schedule",
]

LR_SCALINGS = ("none", "linear", "sqrt")
SCHEDULES = ("exponential", "piecewise", "polynomial", "cosine", "constant")
StepLike = Union[int, tf.Tensor]


def check_int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise UsageError(f"{name} = {value!r} must be an integer >= {low}")
    return value


def scale_learning_rate(base_lr: float, world_size: int, scaling: str) -> float:
    """The learning rate for ``world_size`` workers.

    Args:
      base_lr: the single-worker learning rate.
      world_size: number of workers ``N`` >= 1.
      scaling: ``"none"`` (``base_lr``), ``"linear"`` (``base_lr * N``) or
        ``"sqrt"`` (``base_lr * sqrt(N)``).

    Returns:
      The scaled learning rate.

    Raises:
      UsageError: (a ValueError) an unknown ``scaling`` or bad numbers.
    """
    base_lr = check_number("base_lr", base_lr, low=0.0)
    world_size = check_int("world_size", world_size, 1)
    if scaling == "none":
        return base_lr
    if scaling == "linear":
        return base_lr * world_size
    if scaling == "sqrt":
        return base_lr * math.sqrt(world_size)
    raise UsageError(f"lr_scaling = {scaling!r} is not one of {', '.join(LR_SCALINGS)}")


def as_step(step: StepLike) -> tf.Tensor:
    """The step as an int64 scalar tensor (Python ints and int32/int64 tensors)."""
    if isinstance(step, bool):
        raise UsageError(f"step = {step!r} must be an integer or an integer tensor")
    step = tf.convert_to_tensor(step)
    if not step.dtype.is_integer:
        raise UsageError(f"step has dtype {step.dtype.name}; pass an integer step "
                         f"(e.g. optimizer.iterations)")
    return tf.cast(step, tf.int64)


class Schedule:
    """Maps a step (int64 tensor) and the peak rate to the rate after warmup.

    Subclasses implement :meth:`__call__`; values are float64 tensors.
    """

    def __call__(self, step: tf.Tensor, peak_lr: float) -> tf.Tensor:
        raise NotImplementedError


class ConstantSchedule(Schedule):
    """``lr = peak``."""

    def __call__(self, step: tf.Tensor, peak_lr: float) -> tf.Tensor:
        del step
        return tf.constant(peak_lr, tf.float64)


class ExponentialDecay(Schedule):
    """``peak * lr_decay ** max(epoch - lr_decay_start_epoch + 1, 0)``, by epoch.

    With ``lr_decay = 0.5``, ``lr_decay_start_epoch = 4`` this is Zaremba et
    al.'s small PTB policy: epochs 0-3 at ``peak``, epoch 4 at ``peak / 2``,
    epoch 5 at ``peak / 4``, ...
    """

    def __init__(self, *, steps_per_epoch: int, lr_decay: float = 1.0,
                 lr_decay_start_epoch: int = 0) -> None:
        """Creates the schedule.

        Args:
          steps_per_epoch: updates per epoch, >= 1.
          lr_decay: multiplier per decayed epoch, in (0, 1] for a decay.
          lr_decay_start_epoch: first 0-based epoch index that is decayed.

        Raises:
          UsageError: (a ValueError) a bad value.
        """
        self.steps_per_epoch = check_int("steps_per_epoch", steps_per_epoch, 1)
        self.lr_decay = check_number("lr_decay", lr_decay, low=0.0, low_open=True,
                                     fix="use 1.0 for no decay")
        self.lr_decay_start_epoch = check_int("lr_decay_start_epoch", lr_decay_start_epoch, 0)

    def __call__(self, step: tf.Tensor, peak_lr: float) -> tf.Tensor:
        epoch = step // self.steps_per_epoch  # completed epochs = 0-based epoch index
        exponent = tf.maximum(epoch - self.lr_decay_start_epoch + 1, 0)
        return peak_lr * tf.pow(tf.constant(self.lr_decay, tf.float64),
                                tf.cast(exponent, tf.float64))


class PiecewiseConstant(Schedule):
    """``peak * values[i]``, ``i`` = number of epoch ``boundaries`` reached.

    ``boundaries = [5, 8]``, ``values = [1.0, 0.1, 0.01]``: epochs [0, 5) at
    ``peak``, [5, 8) at ``peak / 10``, from 8 on at ``peak / 100``. A boundary
    may be fractional; it is reached at step ``round(boundary * steps_per_epoch)``.
    """

    def __init__(self, *, steps_per_epoch: int, boundaries: Sequence[float],
                 values: Sequence[float]) -> None:
        """Creates the schedule.

        Args:
          steps_per_epoch: updates per epoch, >= 1.
          boundaries: increasing epochs (>= 0) where the multiplier changes.
          values: multipliers, one more than ``boundaries``.

        Raises:
          UsageError: (a ValueError) bad lengths, order or values.
        """
        self.steps_per_epoch = check_int("steps_per_epoch", steps_per_epoch, 1)
        if isinstance(boundaries, (str, bytes)) or not isinstance(boundaries, Sequence):
            raise UsageError(f"boundaries = {boundaries!r} must be a list of epochs")
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise UsageError(f"values = {values!r} must be a list of multipliers")
        self.boundaries = [check_number("boundaries[]", b, low=0.0) for b in boundaries]
        self.values = [check_number("values[]", v, low=0.0) for v in values]
        if len(self.values) != len(self.boundaries) + 1:
            raise UsageError(f"piecewise schedule: {len(self.values)} values for "
                             f"{len(self.boundaries)} boundaries; give one more value than "
                             f"boundaries (the first applies before the first boundary)")
        if any(b >= c for b, c in zip(self.boundaries, self.boundaries[1:])):
            raise UsageError(f"boundaries = {list(boundaries)!r} must be strictly increasing")
        self.boundary_steps = [int(round(b * self.steps_per_epoch)) for b in self.boundaries]

    def __call__(self, step: tf.Tensor, peak_lr: float) -> tf.Tensor:
        reached = tf.zeros([], tf.int32)
        for b in self.boundary_steps:
            reached += tf.cast(step >= b, tf.int32)
        return peak_lr * tf.gather(tf.constant(self.values, tf.float64), reached)


class _DecayToEnd(Schedule):
    """Shared set-up of the decays from ``peak`` at ``start_step`` to ``end_lr``."""

    def __init__(self, *, start_step: int, total_steps: int, end_lr: float) -> None:
        self.start_step = check_int("start_step", start_step, 0)
        self.total_steps = check_int("total_steps", total_steps, 1)
        if self.total_steps <= self.start_step:
            raise UsageError(f"the decay ends at step {total_steps} (total_epochs * "
                             f"steps_per_epoch) but starts after the warmup at step "
                             f"{start_step}; raise total_epochs or shorten warmup_epochs")
        self.end_lr = check_number("end_lr", end_lr, low=0.0)

    def _progress(self, step: tf.Tensor) -> tf.Tensor:
        done = tf.cast(step - self.start_step, tf.float64)
        return tf.clip_by_value(done / float(self.total_steps - self.start_step), 0.0, 1.0)


class PolynomialDecay(_DecayToEnd):
    """``end_lr + (peak - end_lr) * (1 - p) ** power``, ``p`` = progress in [0, 1]."""

    def __init__(self, *, start_step: int, total_steps: int, power: float = 1.0,
                 end_lr: float = 0.0) -> None:
        """Creates the schedule.

        Args:
          start_step: first step of the decay (the end of the warmup).
          total_steps: step at which ``end_lr`` is reached (held afterwards).
          power: exponent, > 0 (1 = linear decay).
          end_lr: final learning rate, >= 0 (absolute, not a multiplier).

        Raises:
          UsageError: (a ValueError) a bad value.
        """
        super().__init__(start_step=start_step, total_steps=total_steps, end_lr=end_lr)
        self.power = check_number("power", power, low=0.0, low_open=True, fix="1.0 is linear")

    def __call__(self, step: tf.Tensor, peak_lr: float) -> tf.Tensor:
        p = self._progress(step)
        return self.end_lr + (peak_lr - self.end_lr) * tf.pow(1.0 - p, self.power)


class CosineDecay(_DecayToEnd):
    """``end_lr + (peak - end_lr) * (1 + cos(pi * p)) / 2``, ``p`` = progress in [0, 1]."""

    def __init__(self, *, start_step: int, total_steps: int, end_lr: float = 0.0) -> None:
        """Creates the schedule.

        Args:
          start_step: first step of the decay (the end of the warmup).
          total_steps: step at which ``end_lr`` is reached (held afterwards).
          end_lr: final learning rate, >= 0 (absolute).

        Raises:
          UsageError: (a ValueError) a bad value.
        """
        super().__init__(start_step=start_step, total_steps=total_steps, end_lr=end_lr)

    def __call__(self, step: tf.Tensor, peak_lr: float) -> tf.Tensor:
        p = self._progress(step)
        return self.end_lr + (peak_lr - self.end_lr) * 0.5 * (1.0 + tf.cos(math.pi * p))


class LinearWarmup:
    """``peak * (f + (1 - f) * s / W)`` for ``s < W``; ``f`` = start factor (default ``1/N``)."""

    def __init__(self, *, warmup_steps: int, start_factor: float) -> None:
        """Creates the warmup.

        Args:
          warmup_steps: ``W`` >= 0 (0 = no warmup).
          start_factor: fraction of the peak rate at step 0, in [0, 1].

        Raises:
          UsageError: (a ValueError) a bad value.
        """
        self.warmup_steps = check_int("warmup_steps", warmup_steps, 0)
        self.start_factor = check_number("warmup_start_factor", start_factor, low=0.0, high=1.0)

    def __call__(self, step: tf.Tensor, peak_lr: float) -> tf.Tensor:
        frac = tf.cast(step, tf.float64) / float(max(self.warmup_steps, 1))
        return peak_lr * (self.start_factor + (1.0 - self.start_factor) * frac)


_SCHEDULE_PARAMS: Dict[str, Dict[str, Any]] = {
    # name -> {param: default}; a default of None marks a required key
    "exponential": {"lr_decay": 1.0, "lr_decay_start_epoch": 0},
    "piecewise": {"boundaries": None, "values": None},
    "polynomial": {"total_epochs": None, "power": 1.0, "end_lr": 0.0},
    "cosine": {"total_epochs": None, "end_lr": 0.0},
    # (polynomial and cosine also take total_steps, the end in steps, in place of total_epochs)
    "constant": {},
}


def make_schedule(name: str, *, steps_per_epoch: int, warmup_steps: int = 0,
                  **params: Any) -> Schedule:
    """Builds a schedule by name from ``schedule_params``-style keys.

    Args:
      name: one of :data:`SCHEDULES`.
      steps_per_epoch: updates per epoch, >= 1.
      warmup_steps: where polynomial and cosine decays start.
      **params: ``exponential``: ``lr_decay``, ``lr_decay_start_epoch``;
        ``piecewise``: ``boundaries`` (epochs), ``values`` (multipliers);
        ``polynomial``: ``total_epochs``, ``power``, ``end_lr``;
        ``cosine``: ``total_epochs``, ``end_lr``; ``constant``: none.

    Returns:
      The schedule.

    Raises:
      UsageError: (a ValueError) an unknown name, an unknown or missing key.
    """
    if name not in _SCHEDULE_PARAMS:
        raise UsageError(f"schedule = {name!r} is not one of {', '.join(SCHEDULES)}")
    known = _SCHEDULE_PARAMS[name]
    total_steps = params.pop("total_steps", None) if name in ("polynomial", "cosine") else None
    if total_steps is not None:  # a plan in steps: the end is a step, not a number of epochs
        params["total_epochs"] = 1.0
    for key in params:
        if key not in known:
            raise UsageError(f"schedule_params: unknown key {key!r} for schedule {name!r}; "
                             f"{did_you_mean(key, known, listing='known keys')}")
    args = {k: params.get(k, default) for k, default in known.items()}
    for key, value in args.items():
        if value is None:
            raise UsageError(f"schedule_params: schedule {name!r} needs {key!r}")
    steps_per_epoch = check_int("steps_per_epoch", steps_per_epoch, 1)
    if name == "exponential":
        return ExponentialDecay(steps_per_epoch=steps_per_epoch, **args)
    if name == "piecewise":
        return PiecewiseConstant(steps_per_epoch=steps_per_epoch, **args)
    if name == "constant":
        return ConstantSchedule()
    total_epochs = check_number("total_epochs", args.pop("total_epochs"), low=0.0, low_open=True)
    if total_steps is None:
        total_steps = int(round(total_epochs * steps_per_epoch))
    if name == "polynomial":
        return PolynomialDecay(start_step=warmup_steps, total_steps=total_steps, **args)
    return CosineDecay(start_step=warmup_steps, total_steps=total_steps, **args)
