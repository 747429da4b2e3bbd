"""The learning rate of a run: workers' scaling, a linear warmup, then a schedule (:mod:`lmkit.optim.schedules`).

:class:`LearningRatePolicy` maps the global step (a Python int or an int
tensor, also inside ``tf.function``) to a float32 learning rate;
:meth:`LearningRatePolicy.from_config` reads a run's config, in epochs or in
steps (nanoGPT's ``get_lr``), and :func:`warmup_note` is the one line a run
prints when its warmup is as long as its plan, or longer.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.optim.base import check_number
from lmkit.optim.schedules import LinearWarmup, StepLike, as_step, check_int, make_schedule, scale_learning_rate

__all__ = ["LearningRatePolicy", "warmup_note"]


def _schedule_params(opt: Any) -> Dict[str, Any]:
    """The schedule's keys of a config's optimization section: ``schedule_params``, and for ``exponential``
    ``lr_decay`` and ``lr_decay_start_epoch``.

    Raises:
      UsageError: a decay key in ``schedule_params``, or ``lr_decay`` for another schedule.
    """
    params = dict(opt.schedule_params or {})
    if opt.schedule == "exponential":
        for key in ("lr_decay", "lr_decay_start_epoch"):
            if key in params:
                raise UsageError(f"schedule_params: {key!r} is a top-level config key; "
                                 f"set `{key} = ...` instead")
        params.update(lr_decay=opt.lr_decay, lr_decay_start_epoch=opt.lr_decay_start_epoch)
    elif opt.lr_decay != 1.0:
        raise UsageError(f"lr_decay = {opt.lr_decay!r} only applies to schedule "
                         f"'exponential' (schedule is {opt.schedule!r}); set lr_decay = 1.0")
    return params


def warmup_note(config: Any) -> str:
    """One line for a run planned in steps whose ``warmup_steps`` is as long as the plan or longer; "" otherwise.

    Such a run warms up over every one of its steps at the slope the warmup
    states, as nanoGPT's ``get_lr`` and Hugging Face's schedules do: the rate
    ends below its peak and the decay is never reached.
    """
    warmup, planned = config.optimization.warmup_steps, config.planned_steps
    if planned is None or warmup < planned:
        return ""
    return (f"note: warmup_steps {warmup} >= the plan's {planned} steps: warming up over the whole run, "
            f"to {planned}/{warmup + 1} of the peak learning rate at the last step, no decay; "
            f"--set warmup_steps=N (N < {planned}) to warm up and then decay")


class LearningRatePolicy:
    """Scaling by workers, linear warmup, then a schedule (see the module docstring).

    Example, config_small on 4 workers with linear scaling and one epoch of
    warmup: ``LearningRatePolicy(1.0, 4, 100, "linear", 1.0, "exponential",
    lr_decay=0.5, lr_decay_start_epoch=4)`` gives 1.0 at step 0, 2.5 at step
    50, 4.0 from step 100 to 399, 2.0 for epoch 4 (steps 400-499), ...

    Attributes:
      peak_lr: the scaled learning rate (float).
      warmup_steps: ``W``.
      warmup: the :class:`LinearWarmup`.
      schedule: the :class:`Schedule` used from step ``W`` on.
    """

    def __init__(self, base_lr: float, world_size: int, steps_per_epoch: int,
                 scaling: str = "none", warmup_epochs: float = 0.0,
                 schedule: str = "constant", warmup_start_factor: Optional[float] = None,
                 warmup_steps: Optional[int] = None, **params: Any) -> None:
        """Creates the policy.

        Args:
          base_lr: the single-worker learning rate (``TrainConfig.learning_rate``).
          world_size: number of workers ``N``.
          steps_per_epoch: updates per epoch (with the global batch), >= 1.
          scaling: one of :data:`LR_SCALINGS`.
          warmup_epochs: warmup length in epochs (may be fractional), >= 0.
          schedule: one of :data:`SCHEDULES`.
          warmup_start_factor: fraction of the peak at step 0; default ``1/N``
            (Goyal et al. / Horovod). Use e.g. 0.0 to warm up from zero even
            on one worker (transformers).
          warmup_steps: the warmup in steps, in place of ``warmup_epochs``.
          **params: the schedule's keys (see :func:`make_schedule`; polynomial and
            cosine take ``total_steps`` in place of ``total_epochs``).

        Raises:
          UsageError: (a ValueError) a bad name, key or value.
        """
        self.base_lr = check_number("base_lr", base_lr, low=0.0)
        self.world_size = check_int("world_size", world_size, 1)
        self.steps_per_epoch = check_int("steps_per_epoch", steps_per_epoch, 1)
        self.scaling = scaling
        self.peak_lr = scale_learning_rate(self.base_lr, self.world_size, scaling)
        self.warmup_epochs = check_number("warmup_epochs", warmup_epochs, low=0.0)
        self.warmup_steps = (int(round(self.warmup_epochs * self.steps_per_epoch)) if warmup_steps is None
                             else check_int("warmup_steps", warmup_steps, 0))
        start = 1.0 / self.world_size if warmup_start_factor is None else warmup_start_factor
        self.warmup = LinearWarmup(warmup_steps=self.warmup_steps, start_factor=start)
        self.schedule_name = schedule
        self.schedule = make_schedule(schedule, steps_per_epoch=self.steps_per_epoch,
                                      warmup_steps=self.warmup_steps, **params)

    @classmethod
    def from_config(cls, config: Any, world_size: int, steps_per_epoch: int) -> "LearningRatePolicy":
        """The policy of a :class:`lmkit.config.TrainConfig`.

        Uses ``learning_rate``, ``lr_scaling``, the warmup (``warmup_steps``, or
        ``warmup_epochs`` in steps of this data), ``schedule``, ``min_lr`` and
        ``schedule_params``; for ``exponential`` also ``lr_decay`` and
        ``lr_decay_start_epoch``. A polynomial or cosine decay ends at the
        plan's end: ``max_steps`` (or the steps of ``max_tokens``) in a run
        planned in steps, as :meth:`in_steps`, else ``total_epochs``
        (default ``num_epochs``). ``schedule_params`` may also hold
        ``warmup_start_factor`` (default: ``1/N`` in epochs, nanoGPT's
        ``1/(W+1)`` in steps). A warmup as long as a plan in steps, or longer,
        warms up over every step of the run at the slope it states, as
        nanoGPT's ``get_lr`` and Hugging Face's schedules do, and the decay is
        never reached (:func:`warmup_note` says so in one line).

        Raises:
          UsageError: (a ValueError) a bad key or value, or ``lr_decay`` set
            for a schedule other than ``exponential`` (it would be ignored).
        """
        opt = config.optimization
        params = _schedule_params(opt)
        start_factor = params.pop("warmup_start_factor", None)
        warmup = opt.warmup_steps if opt.warmup_steps else int(round(opt.warmup_epochs * steps_per_epoch))
        planned = config.planned_steps
        if opt.schedule in ("polynomial", "cosine"):
            if opt.min_lr:
                params["end_lr"] = opt.min_lr
            if planned is None:
                params.setdefault("total_epochs", opt.num_epochs)
            else:  # a warmup as long as a short run, or longer: it warms up over every step, no decay
                params["total_steps"] = max(planned, warmup + 1)
        if start_factor is None and planned is not None:
            start_factor = 1.0 / (warmup + 1)
        return cls(opt.learning_rate, world_size, steps_per_epoch, scaling=opt.lr_scaling,
                   warmup_steps=warmup, schedule=opt.schedule, warmup_start_factor=start_factor, **params)

    @classmethod
    def in_steps(cls, base_lr: float, *, total_steps: int, warmup_steps: int = 0, min_lr: float = 0.0,
                 schedule: str = "cosine", world_size: int = 1, scaling: str = "none") -> "LearningRatePolicy":
        """A run planned in steps, as nanoGPT's and transformers' recipes are written.

        A linear warmup over ``warmup_steps`` from ``peak / (W + 1)`` (step 0)
        to ``peak`` (step ``W``), then ``schedule`` from ``peak`` down to
        ``min_lr`` at ``total_steps``, held after it: at every step the rate of
        nanoGPT's ``get_lr`` with ``warmup_iters = W`` and ``lr_decay_iters =
        total_steps``. A config with ``max_steps`` gets it from :meth:`from_config`.

        Args:
          base_lr: the single-worker peak rate.
          total_steps: the step where the decay reaches ``min_lr`` (the run's ``max_steps``), > ``warmup_steps``.
          warmup_steps: ``W`` >= 0.
          min_lr: the floor, >= 0 (absolute).
          schedule: ``cosine``, ``polynomial`` (linear) or ``constant`` (no decay).
          world_size, scaling: as for the constructor.

        Raises:
          UsageError: (a ValueError) a bad value, named.
        """
        if schedule not in ("cosine", "polynomial", "constant"):
            raise UsageError(f"schedule = {schedule!r} cannot be planned in steps; use cosine, polynomial "
                             "or constant")
        total_steps = check_int("max_steps", total_steps, 1)
        warmup_steps = check_int("warmup_steps", warmup_steps, 0)
        if schedule != "constant" and total_steps <= warmup_steps:
            raise UsageError(f"max_steps = {total_steps} must be more than warmup_steps = {warmup_steps}: the "
                             "decay runs from the warmup's end to max_steps")
        params = {} if schedule == "constant" else {"total_steps": total_steps, "end_lr": min_lr}
        return cls(base_lr, world_size, 1, scaling=scaling, warmup_steps=warmup_steps, schedule=schedule,
                   warmup_start_factor=1.0 / (warmup_steps + 1), **params)

    def __call__(self, step: StepLike) -> tf.Tensor:
        """The learning rate (float32 scalar tensor) at global step ``step``.

        Args:
          step: 0-based update count, a Python int or an integer tensor
            (e.g. ``optimizer.iterations``; fine inside ``tf.function``).
        """
        step = as_step(step)
        after = self.schedule(step, self.peak_lr)
        if self.warmup_steps == 0:
            return tf.cast(after, tf.float32)
        during = self.warmup(step, self.peak_lr)
        return tf.cast(tf.where(step < self.warmup_steps, during, after), tf.float32)

    def get_config(self) -> Dict[str, Any]:
        """The settings, for logs."""
        return {"base_lr": self.base_lr, "world_size": self.world_size,
                "steps_per_epoch": self.steps_per_epoch, "scaling": self.scaling,
                "peak_lr": self.peak_lr, "warmup_steps": self.warmup_steps,
                "warmup_start_factor": self.warmup.start_factor, "schedule": self.schedule_name}
