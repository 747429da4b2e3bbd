"""What training records: per-epoch statistics, the result of a run, the counters a checkpoint carries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, NamedTuple, Optional

import tensorflow as tf

__all__ = ["EpochRun", "EpochStats", "Progress", "StepResult", "TrainResult"]


@dataclass
class EpochStats:
    """What one epoch measured (rank 0's view; losses are averaged over ranks).

    Perplexities are per token; the ``*_word_perplexity`` ones, per
    whitespace-separated word of the same text (None unless the data gave
    word counts: subword, char and byte tokenizers).
    """

    epoch: int
    train_perplexity: float
    valid_perplexity: Optional[float]
    learning_rate: float
    tokens_per_sec: float
    epoch_time: float
    cumulative_time: float
    steps: int
    train_word_perplexity: Optional[float] = None
    valid_word_perplexity: Optional[float] = None
    skipped_steps: int = 0  # mixed_float16: steps of this epoch skipped (not applied, not in the perplexity)
    loss_scale: Optional[float] = None  # mixed_float16: the loss scale at the epoch's end
    model_tflops: Optional[float] = None  # model FLOPs per second of all workers (lmkit.train.flops)
    mfu: Optional[float] = None  # model_tflops over the devices' peak, when it is known


@dataclass
class TrainResult:
    """The outcome of :meth:`Trainer.fit`."""

    epochs: List[EpochStats] = field(default_factory=list)
    test_perplexity: Optional[float] = None
    test_word_perplexity: Optional[float] = None
    step_losses: List[float] = field(default_factory=list)
    global_step: int = 0
    resumed_from: Optional[str] = None
    checkpoint: Optional[str] = None  # the last checkpoint this run wrote
    skipped_steps: int = 0  # mixed_float16: steps skipped for non-finite gradients (whole run)
    loss_scale: Optional[float] = None  # mixed_float16: the loss scale at the end
    # eval_every_steps: {"step", "valid_loss", "valid_perplexity"} of each evaluation (rank 0)
    validations: List[Dict[str, float]] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        last = self.epochs[-1] if self.epochs else None
        return {
            "epochs": [vars(e) for e in self.epochs],
            "test_perplexity": self.test_perplexity,
            "test_word_perplexity": self.test_word_perplexity,
            "global_step": self.global_step,
            "resumed_from": self.resumed_from,
            "checkpoint": self.checkpoint,
            "skipped_steps": self.skipped_steps,
            "loss_scale": self.loss_scale,
            "validations": list(self.validations),
            "final_train_perplexity": last.train_perplexity if last else None,
            "final_valid_perplexity": last.valid_perplexity if last else None,
            "final_train_word_perplexity": last.train_word_perplexity if last else None,
            "final_valid_word_perplexity": last.valid_word_perplexity if last else None,
        }


def dropout_generator(seed: int, rank: int = 0) -> tf.random.Generator:
    """The random generator of rank ``rank``'s dropout masks for the config's ``seed``.

    One stream per rank (each rank drops other units of other rows), the same
    for the same seed. :class:`~lmkit.train.Trainer` draws from it and
    checkpoints it; a loop of your own gets lmkit train's masks with
    ``tf.random.set_global_generator(dropout_generator(seed, rank))``.
    """
    return tf.random.Generator.from_seed(seed * 1009 + rank, alg="philox")


class Progress(tf.Module):
    """Counters and the random state that a checkpoint must carry (``rng``: :func:`dropout_generator`)."""

    def __init__(self, seed: int, rank: int = 0) -> None:
        super().__init__(name="progress")
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        # Steps done in the current epoch: 0 at an epoch's start (a mid-epoch checkpoint's position).
        self.steps_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps_in_epoch")
        self.rng = dropout_generator(seed, rank)


@dataclass
class EpochRun:
    """What one epoch's loop measured (:meth:`lmkit.train.loop.TrainingLoop.run_epoch`)."""

    loss_sum: float = 0.0  # summed window losses (rank-averaged) of the applied steps
    steps: int = 0
    skipped: int = 0  # steps not applied (mixed_float16 overflow): not in loss_sum
    timed_from: int = 0  # steps before this one were compiling, not training
    seconds: float = 0.0
    stopped: bool = False  # the epoch stopped before its end (max_steps, a stop or end inside it): position saved
    preempted: bool = False  # the ranks agreed to stop (a signal): checkpoint written
    ended: bool = False  # the ranks agreed to end the run (a callback asked): checkpoint written
    save_at_end: bool = False  # a save, stop or end fell on the epoch's last step
    tokens_per_step: float = 0.0  # (mean) tokens a global step trains on

    def token_loss(self, loss_tokens: int) -> float:
        """Mean loss per token of the applied steps so far (a step's loss over ``loss_tokens`` is per token:
        a window's ``num_steps``, 1 for pairs)."""
        return self.loss_sum / max((self.steps - self.skipped) * loss_tokens, 1)


class StepResult(NamedTuple):
    """What :meth:`Trainer.train_step` returns."""

    loss: tf.Tensor  # averaged over the ranks
    state: Any  # the carried model state after the step
    finite: tf.Tensor  # False: training cannot go on (a non-finite step it cannot recover from)
    agreed: tf.Tensor  # [stop, save, end] averaged over the ranks: > 0 when some rank asked
    applied: tf.Tensor  # False: the update was not applied (a non-finite step)
