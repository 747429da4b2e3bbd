"""The training loop: the epochs (or steps) of one ``Trainer.fit``, with its checkpoints, stops and evaluations.

Each step boundary, on every rank alike:

1. the compiled step (:class:`lmkit.train.step.TrainStep`) runs on this
   process's rows and carries this rank's requests ``[stop, save, end]``
   (a preemption signal, rank 0's checkpoint clock, a callback) in its
   all-reduce;
2. every few steps the losses are read back (:class:`lmkit.train.health.PendingSteps`:
   a non-finite or diverging loss stops the run on every rank at once) and
   reported (:class:`lmkit.train.reporting.Reporter`);
3. the callbacks see the step (:mod:`lmkit.train.callbacks`);
4. :class:`lmkit.train.resume.Boundaries` decides, from the agreed flags,
   whether every rank saves a checkpoint, stops (a preemption: exit status
   75, rerun to continue) or ends the run.

An epoch ends with a checkpoint (every rank takes part), then rank 0 alone
evaluates, logs and writes summaries: no collective on that path; the
other ranks wait for it in the next step's collective, their watchdog paused.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import tensorflow as tf

from lmkit import distributed as dist
from lmkit.core.errors import UsageError
from lmkit.core.preemption import PreemptionWatcher
from lmkit.data.batching import Batches
from lmkit.layers import kernels as attention_kernels
from lmkit.train.callbacks import CallbackList, EvalInfo, StepInfo
from lmkit.train.feed import window_feed
from lmkit.train.health import PendingSteps
from lmkit.train.metrics import perplexity
from lmkit.train.records import EpochRun, TrainResult
from lmkit.train.reporting import Reporter
from lmkit.train.resume import Boundaries, Checkpointer, Position, preempted
from lmkit.train.startup import check_agreement, prepare_model_dir
from lmkit.train.step import eval_batch_size

__all__ = ["RunData", "TrainingLoop"]


@dataclass
class RunData:
    """What one ``fit`` trains and evaluates on (every rank passes the whole of each)."""

    train: Any
    valid: Optional[Any] = None
    test: Optional[Any] = None
    words: Dict[str, int] = field(default_factory=dict)  # whitespace-separated words of each split


class TrainingLoop:
    """One run of a :class:`~lmkit.train.Trainer`'s parts over its data.

    It calls the trainer's ``train_step``, ``evaluate_loss``, ``epoch_batches``
    and ``initial_state``, so a subclass that overrides them is obeyed.

    Args:
      trainer: the trainer whose model, optimizer, progress and step it drives.
      callbacks: the run's callbacks.
    """

    def __init__(self, trainer: Any, callbacks: CallbackList) -> None:
        self.trainer, self.config, self.callbacks = trainer, trainer.config, callbacks
        # The run's log lines, summaries and results.json (the FLOPs figures once the step is built).
        self.reporter = Reporter(trainer.config, trainer.log, trainer.world, trainer.task.loss_tokens, trainer.flops)
        self.result = TrainResult()
        self.pending = PendingSteps(trainer.config, trainer.task.loss_tokens, trainer.loss_scale)
        self.checkpoints: Checkpointer = Checkpointer(None, trainer.progress, trainer.world, trainer.log)
        self.boundaries: Optional[Boundaries] = None
        self.valid_sample: Any = None  # what the evaluations every eval_every_steps read
        self.compiled = False  # whether the first step (which traces and compiles) has run
        self.last_read: Optional[tuple] = None  # ((epoch, step index), loss per token) of the last step read back

    # ------------------------------------------------------------------ the run
    def run(self, data: RunData, max_steps: Optional[int], num_epochs: Optional[int]) -> TrainResult:
        """Trains for the config's plan (or ``num_epochs``, until ``max_steps``); see ``Trainer.fit``."""
        t, cfg = self.trainer, self.config
        t.task.reset()
        t.task.check_eval_data(eval_batch_size(cfg), valid=data.valid, test=data.test)
        steps_per_epoch = len(t.epoch_batches(data.train, 0))
        # A plan in steps (or tokens) runs the epochs its steps need and stops at its last step.
        epochs = num_epochs or cfg.epochs_to_run(steps_per_epoch)
        planned = cfg.planned_steps
        max_steps = planned if max_steps is None else min(max_steps, planned or max_steps)
        check_agreement(cfg, t.vocab, {"train_ids": int(len(data.train)), "steps_per_epoch": steps_per_epoch})
        prepare_model_dir(t.model_dir, cfg, t.vocab)
        t.build(steps_per_epoch)
        self.reporter.flops = t.flops  # the device's peak is known now
        position = self._restore()
        self.reporter.open(t.model_dir, t.chief, {"train": data.train, "valid": data.valid, "test": data.test},
                           data.words)
        self.valid_sample = self._eval_sample(data.valid)
        start_epoch = int(t.progress.epoch.numpy())
        self.reporter.announce(t.model, {"local_batch": t.local_batch, "micro_batch": t.micro_batch,
                                         "unit": t.task.batch_unit}, steps_per_epoch, start_epoch, epochs)
        with PreemptionWatcher(t.rank, cfg.checkpoints.preemption_grace_seconds) as watcher:
            self._train(data, range(start_epoch, epochs), max_steps, position, watcher)
        self._finish(data.test)
        return self.result

    def _restore(self) -> Position:
        """Every rank gets rank 0's variables: the newest checkpoint's (``resume``), else rank 0's initial ones."""
        t = self.trainer
        self.checkpoints = Checkpointer.for_run(
            t.model_dir, t.saved_model, t.optimizer, t.progress, keep=self.config.checkpoints.keep_checkpoints,
            world=t.world, log=t.log, beat=t.watchdog.beat, loss_scale=t.loss_scale)
        source = self.checkpoints if t.resume else Checkpointer(None, t.progress, t.world, t.log)
        variables = list(t.saved_model.variables) + list(t.optimizer.variables)
        self.result.resumed_from, position = source.restore_latest(  # DIST: rank 0 reads, every rank receives
            variables, t.initial_state(), self.config.run.seed)
        if self.result.resumed_from:
            self.reporter.resumed(self.result.resumed_from, t.progress, position.steps_in_epoch)
        return position

    def _train(self, data: RunData, epochs: range, max_steps: Optional[int], position: Optional[Position],
               watcher: PreemptionWatcher) -> None:
        """The epochs, inside the preemption watcher; a usage error after the first step keeps what was trained."""
        cfg = self.config
        # Several processes with device_prefetch read the flags they agreed on a thread, two steps late
        # (lmkit.train.resume): the read waits for the device, and the steps keep being started meanwhile.
        threaded = dist.size() > 1 and cfg.compute.device_prefetch > 0
        self.boundaries = Boundaries(watcher, cfg.checkpoints.checkpoint_every_steps,
                                     cfg.checkpoints.checkpoint_every_minutes, lag=2 if threaded else 1,
                                     background=threaded, control=self.callbacks.control)
        trained, cumulative = 0, 0.0  # steps of this call (a usage error after the first one saves them)
        try:
            for epoch in epochs:
                batches = self.trainer.epoch_batches(data.train, epoch)
                run = self.run_epoch(epoch, epochs.stop, batches, max_steps, self.result, position)
                position = None  # only the first epoch resumes inside
                trained, cumulative = trained + run.steps, cumulative + run.seconds
                if run.steps == 0 and not run.preempted:
                    break
                self._end_epoch(epoch, epochs.stop, run, cumulative, data.valid)
                if run.preempted:
                    self._leave_preempted(watcher)
                if run.stopped or run.ended:
                    break
        except UsageError:
            if trained:  # keep what was trained (rank 0 alone: no collective on this path)
                self.result.checkpoint = self.checkpoints.save_on_chief({"stopped_by": "a usage error"})
            raise
        finally:
            self.boundaries.close()

    def _finish(self, test_ids: Optional[Any]) -> None:
        """The test split (rank 0), ``results.json``, every rank leaving together, the callbacks' end."""
        t = self.trainer
        self._record_counters()
        if t.chief and test_ids is not None:
            self.reporter.test(t.evaluate_loss(test_ids), self.result)
        self.reporter.write_results(t.model_dir, self.result)
        t._leave_together()
        self.callbacks.train_end(self.result)

    def _record_counters(self) -> None:
        t = self.trainer
        if t.loss_scale is not None:
            self.result.skipped_steps = int(t.loss_scale.skipped_steps.numpy())
            self.result.loss_scale = float(t.loss_scale.scale.numpy())
        self.result.global_step = int(t.progress.global_step.numpy())

    def _leave_preempted(self, watcher: PreemptionWatcher) -> None:
        """Every rank leaves after rank 0's checkpoint: the job can be rerun to continue."""
        error = preempted(watcher, self.trainer.progress, self.result.checkpoint)  # DIST: waits for rank 0's save
        self._record_counters()
        self.reporter.write_results(self.trainer.model_dir, self.result)
        raise error

    # ---------------------------------------------------------------- an epoch
    def run_epoch(self, epoch: int, epochs: int, batches: Batches, max_steps: Optional[int],
                  result: TrainResult, position: Optional[Position] = None) -> EpochRun:
        """Trains on one epoch's batches (or until ``max_steps``, a stop or an end); reports on rank 0.

        ``position`` resumes inside the epoch: its first steps are skipped
        and its carried state continues.
        """
        t, steps_per_epoch = self.trainer, len(batches)
        start = position.steps_in_epoch if position is not None else 0
        state = position.state if position is not None and position.state is not None else t.initial_state()
        bar = self.reporter.progress_bar(epoch, epochs, steps_per_epoch, t.chief)
        run = EpochRun(tokens_per_step=t.task.tokens_per_step(batches))
        step = int(t.progress.global_step.numpy())
        clock = _Clock()
        feed = window_feed(batches, self.config.compute.device_prefetch)  # None without device_prefetch
        try:
            for i in range(start, steps_per_epoch):
                if max_steps is not None and step >= max_steps:
                    self._stop_at_max_steps(epoch, i, state, run, result)
                    break
                if i == start and not t.chief:  # waits for rank 0's evaluation and save (watched there)
                    t.watchdog.pause()
                inputs, targets = feed.get(i) if feed else tf.nest.map_structure(tf.constant, batches[i])
                flags = self.boundaries.flags()
                out = t.train_step(inputs, targets, state, *flags)
                state, step = out.state, step + 1
                t.watchdog.beat(step)
                self.pending.add(out)
                run.steps += 1
                self._after_step(epoch, i, step, run, clock, bar, result)
                # One process agrees with itself: its own flags, read without waiting for the device. (Reading
                # out.agreed waits for every step queued, this one included: the GPU would idle each step while
                # the host starts the next.) Several processes read the flags they averaged in the step (with
                # device_prefetch on a thread of their own, decided two steps later).
                actions = self.boundaries.after_step(out.agreed if dist.size() > 1 else flags, step)
                if actions:
                    self._read(epoch, i, run, result)
                    self._act(actions, i + 1, steps_per_epoch, state, run, result)
                    if run.preempted or run.ended:
                        break
                if self.config.run.eval_every_steps and step % self.config.run.eval_every_steps == 0:
                    self._evaluate_at(step, lambda: self._read(epoch, i, run, result))
            else:  # the last step's flags: no step follows
                self._act(self.boundaries.flush(), steps_per_epoch, steps_per_epoch, state, run, result)
        finally:
            if feed:
                feed.close()
        self._read(epoch, run.steps - 1, run, result)
        bar.close()
        run.seconds = clock.seconds()
        return run

    def _after_step(self, epoch: int, index: int, step: int, run: EpochRun, clock: "_Clock", bar: Any,
                    result: TrainResult) -> None:
        """The first step's compile time; every few steps the losses read back and reported; the callbacks."""
        if not self.compiled:  # the first call traces and compiles: not training speed
            self._read(epoch, index, run, result)
            self._compiled_in(clock.restart())
            run.timed_from = run.steps
        # Reading values back costs a host sync: only every few steps.
        lines = self.reporter.step_lines
        due = lines.due(step) if lines else len(self.pending) >= bar.every or index == bar.total - 1
        if due or self.trainer.record_step_losses:
            self._read(epoch, index, run, result)
            if lines is None or due:
                self.reporter.progress(bar, run, {"done_in_epoch": index + 1, "step": step}, clock.seconds(),
                                       lambda: float(self.trainer.optimizer.learning_rate.numpy()))
        if self.callbacks:
            loss = self.last_read[1] if self.last_read and self.last_read[0] == (epoch, index) else None
            self.callbacks.step_end(StepInfo(step=step, epoch=epoch, step_in_epoch=index + 1, loss=loss,
                                             rank=self.trainer.rank))

    def _read(self, epoch: int, index: int, run: EpochRun, result: TrainResult) -> None:
        """Reads the pending steps back (the last is step ``index`` of the epoch) into the epoch's sums."""
        if not len(self.pending):
            return
        values = self.pending.read(epoch, index)
        if self.trainer.record_step_losses:  # NaN marks a skipped step
            result.step_losses.extend(float("nan") if v is None else v for v in values)
        applied = [v for v in values if v is not None]
        self.reporter.losses_read(sum(applied), len(applied))
        run.skipped += len(values) - len(applied)
        run.loss_sum += sum(applied)
        last = values[-1]
        self.last_read = ((epoch, index), float("nan") if last is None else last / self.trainer.task.loss_tokens)

    def _compiled_in(self, seconds: float) -> None:
        """Notes that the first step traced and compiled in ``seconds`` (not training speed) and says so."""
        t = self.trainer
        t.compile_time, self.compiled = seconds, True
        self.reporter.compiled(seconds, t.compilation, attention_kernels.declined(t.compilation.attention_kernel))

    def _stop_at_max_steps(self, epoch: int, index: int, state: Any, run: EpochRun, result: TrainResult) -> None:
        """``max_steps`` reached at step ``index`` of the epoch: every rank saves the position there."""
        run.stopped = True
        self.trainer.progress.steps_in_epoch.assign(index)
        self._read(epoch, index - 1, run, result)
        result.checkpoint = self.checkpoints.save(state, {"stopped_by": "max_steps"}) or result.checkpoint

    def _act(self, actions: List[str], done_in_epoch: int, steps_per_epoch: int, state: Any, run: EpochRun,
             result: TrainResult) -> None:
        """Carries out what the ranks agreed after a step (``"stop"``, ``"end"``, ``"save"``): inside an epoch, a
        checkpoint of ``state``; at its end, :meth:`_end_epoch` saves."""
        run.preempted = run.preempted or "stop" in actions
        run.ended = run.ended or "end" in actions
        run.save_at_end = run.save_at_end or (bool(actions) and done_in_epoch == steps_per_epoch)
        if actions and done_in_epoch < steps_per_epoch:
            self.trainer.progress.steps_in_epoch.assign(done_in_epoch)
            run.stopped = run.preempted or run.ended  # the epoch stops here: its position is this checkpoint's
            result.checkpoint = self.checkpoints.save(state, _stop_meta(run) or {"saved_by": "schedule"}) \
                or result.checkpoint
            self.boundaries.saved()

    # ---------------------------------------------------------------- evaluations
    def _end_epoch(self, epoch: int, epochs: int, run: EpochRun, cumulative: float, valid_ids: Optional[Any]) -> None:
        """Every rank takes part in the epoch's checkpoint; rank 0 evaluates, logs and writes summaries.

        A checkpoint follows every ``checkpoint_every_epochs`` epochs, the last
        epoch, and a stop, end or save at the epoch's end (stops inside an
        epoch saved their own in :meth:`run_epoch`).
        """
        t, every = self.trainer, self.config.checkpoints.checkpoint_every_epochs
        lr = float(t.optimizer.learning_rate.numpy())
        train_perplexity = perplexity(run.token_loss(t.task.loss_tokens))
        if not run.stopped:  # the epoch completed
            t.progress.epoch.assign(epoch + 1)
            t.progress.steps_in_epoch.assign(0)
            if epoch + 1 == epochs or (every > 0 and (epoch + 1) % every == 0) or run.save_at_end:
                # Before rank 0's evaluation: the save gathers from every rank.
                self.result.checkpoint = self.checkpoints.save(
                    None, {"train_perplexity": train_perplexity, **_stop_meta(run)}) or self.result.checkpoint
                self.boundaries.saved()
        valid_loss = None
        # Rank 0 only: no collective here. A preemption leaves the evaluation to the rerun.
        if t.chief and valid_ids is not None and run.steps and not run.preempted:
            valid_loss = t.evaluate_loss(valid_ids)
        scale = None if t.loss_scale is None else float(t.loss_scale.scale.numpy())
        stats = self.reporter.epoch_stats(epoch, run, cumulative, valid_loss, lr, scale)
        self.reporter.epoch_end(stats, epochs, int(t.progress.global_step.numpy()), self.result)
        if valid_loss is not None and self.callbacks:
            self.callbacks.eval_end(EvalInfo(step=int(t.progress.global_step.numpy()), epoch=epoch + 1,
                                             loss=valid_loss, perplexity=perplexity(valid_loss)))

    def _eval_sample(self, ids: Any) -> Any:
        """What the evaluations every ``eval_every_steps`` read: the first ``eval_steps`` batches (0: all)."""
        cfg = self.config
        if ids is None or not cfg.run.eval_steps:
            return ids
        return self.trainer.task.eval_sample(ids, cfg.run.eval_steps, eval_batch_size(cfg))

    def _evaluate_at(self, step: int, read: Callable[[], None]) -> None:
        """Rank 0 evaluates the validation sample after global step ``step`` and logs it; the other ranks go on
        to the next step's collective, where they wait for it (their watchdog paused: rank 0's beats).

        ``read`` reads the steps not yet read back first, so their lines come before this one."""
        if self.valid_sample is None:
            return
        read()
        t = self.trainer
        if not t.chief:
            t.watchdog.pause()
            return
        loss = t.evaluate_loss(self.valid_sample)
        self.reporter.validation(step, loss, self.result)
        if self.callbacks:
            self.callbacks.eval_end(EvalInfo(step=step, epoch=None, loss=loss, perplexity=perplexity(loss)))


def _stop_meta(run: EpochRun) -> Dict[str, str]:
    """What a checkpoint's ``meta.json`` says about a stop: a preemption's, or the end a callback asked for."""
    if run.preempted:
        return {"stopped_by": "preemption"}
    return {"stopped_by": "a callback"} if run.ended else {}


class _Clock:
    """The seconds an epoch trains, restarted after the first step (which compiles)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def seconds(self) -> float:
        return time.perf_counter() - self.start

    def restart(self) -> float:
        """The seconds so far; counts from now on."""
        elapsed, self.start = self.seconds(), time.perf_counter()
        return elapsed
