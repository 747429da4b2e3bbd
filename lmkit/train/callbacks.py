"""Callbacks: user code that watches a run and may stop it or ask for a checkpoint, without subclassing.

    class StopBelow(Callback):
        def __init__(self, perplexity):
            self.perplexity = perplexity

        def on_eval_end(self, info, control):
            if info.perplexity < self.perplexity:
                control.should_stop = True  # every rank ends the run at the same step, with a checkpoint

    Trainer(model, config, model_dir, callbacks=[StopBelow(60.0)]).fit(train_ids, valid_ids)

As Keras' callbacks and Hugging Face's ``TrainerCallback`` do, a
:class:`Callback` overrides the hooks it needs; each hook gets what
happened and a :class:`TrainerControl`, whose flags it sets:

* ``control.should_stop``: end the run (a checkpoint is written where it
  stops; ``fit`` returns normally, as after ``max_steps``);
* ``control.should_save``: write a checkpoint at the next step boundary.

Which rank calls what: :meth:`Callback.on_step_end` and
:meth:`Callback.on_train_end` run on every rank, :meth:`Callback.on_eval_end`
on rank 0 alone (rank 0 alone evaluates). Log from rank 0 (``info.rank ==
0``). A request is this rank's: it rides in the next step's all-reduce with
the other ranks' (the flags of :class:`lmkit.train.resume.Boundaries`), so a
callback on any one rank stops every rank, at the same step, with no
collective of its own and no hang. The run stops within two steps of the
request (the flags are read one step late, so the host never waits for the
device); after the last step of the run a request has nothing left to stop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, List, Optional

__all__ = ["Callback", "CallbackList", "EvalInfo", "StepInfo", "TrainerControl"]


@dataclass
class TrainerControl:
    """What the callbacks ask of the run; the trainer sends each request once, then clears it."""

    should_stop: bool = False  # end the run at the next step boundary the ranks agree on (with a checkpoint)
    should_save: bool = False  # write a checkpoint at the next step boundary


@dataclass(frozen=True)
class StepInfo:
    """What :meth:`Callback.on_step_end` learns about the step that just ran.

    Attributes:
      step: the global step (1-based: the steps done).
      epoch: the epoch (0-based) the step belongs to.
      step_in_epoch: steps done in that epoch.
      loss: the ranks' mean loss per token of this step, when the trainer read it back at this step (every
        ``log_every_steps`` steps, and at every step with ``record_step_losses``; reading it back waits for
        the device), else None; NaN for a step that was skipped (``mixed_float16``).
      rank: this process's rank.
    """

    step: int
    epoch: int
    step_in_epoch: int
    loss: Optional[float]
    rank: int


@dataclass(frozen=True)
class EvalInfo:
    """What :meth:`Callback.on_eval_end` learns about an evaluation of the validation data (rank 0).

    Attributes:
      step: the global step after which it was evaluated.
      epoch: the epoch (1-based) it ends, or None for an evaluation every ``eval_every_steps``.
      loss: the mean loss per token.
      perplexity: ``exp(loss)``.
      rank: 0.
    """

    step: int
    epoch: Optional[int]
    loss: float
    perplexity: float
    rank: int = 0


class Callback:
    """A hook on the trainer's loop; every method is a no-op until overridden."""

    def on_step_end(self, info: StepInfo, control: TrainerControl) -> None:
        """After every optimizer step, on every rank."""

    def on_eval_end(self, info: EvalInfo, control: TrainerControl) -> None:
        """After each evaluation of the validation data, on rank 0."""

    def on_train_end(self, result: Any, control: TrainerControl) -> None:
        """At the end of ``fit`` (after the test evaluation and ``results.json``), on every rank.

        ``result`` is the :class:`~lmkit.train.records.TrainResult` (its statistics are rank 0's);
        a request here has no step left to act on.
        """


class CallbackList:
    """The run's callbacks, called in order, sharing one :class:`TrainerControl`."""

    def __init__(self, callbacks: Optional[Iterable[Callback]] = None) -> None:
        self.callbacks: List[Callback] = list(callbacks or [])
        for callback in self.callbacks:
            if not isinstance(callback, Callback):
                raise TypeError(f"callbacks= takes lmkit.train.callbacks.Callback objects, not "
                                f"{type(callback).__name__}: subclass Callback and override its on_* methods")
        self.control = TrainerControl()

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def step_end(self, info: StepInfo) -> None:
        for callback in self.callbacks:
            callback.on_step_end(info, self.control)

    def eval_end(self, info: EvalInfo) -> None:
        for callback in self.callbacks:
            callback.on_eval_end(info, self.control)

    def train_end(self, result: Any) -> None:
        for callback in self.callbacks:
            callback.on_train_end(result, self.control)
