"""Where training stands inside an epoch, and when it stops to save: exact mid-epoch resume.

A checkpoint taken inside an epoch must carry what the variables alone do
not: the position in the data (the epoch and the steps done in it; the
window order of the epoch follows from ``(seed, epoch)``), the recurrent
state of every row of the global batch, and every rank's dropout generator.
:func:`gather_position` collects them from all ranks (a collective: every
rank calls it at the same step) for rank 0 to save; :func:`restore_position`
hands each rank its part back, also on another number of workers:

* the data position and the RNN state are global (rows of the global batch),
  so each rank takes its rows of the new layout and training continues
  exactly;
* the dropout generators are per rank, restored exactly when the number of
  ranks is the same; on another number each rank reseeds from
  ``(seed, step, rank)``, so dropout masks differ from an uninterrupted run
  (with dropout off the resumed run is still exact).

:class:`Boundaries` decides, at every step boundary and the same way on
every rank, whether to save (every ``checkpoint_every_steps`` steps, when
rank 0's ``checkpoint_every_minutes`` clock is due, or when a callback asks),
to stop (a preemption signal on any rank) or to end the run (a callback on
any rank asks: :mod:`lmkit.train.callbacks`). The requests travel as flags
inside the compiled step, with the loss's all-reduce, and are read one step
later, so the host never waits for the step it just started.
With ``device_prefetch`` a job of several processes reads them on a thread
of its own and decides two steps later (``lag``): on a GPU a read waits for
every step queued when it was made, and the thread keeps that wait off the
thread that starts the steps.

A loop of your own uses the same parts (examples/lm_ptb_distributed.py):
:meth:`Checkpointer.for_run` and :meth:`Checkpointer.restore_latest` to
continue where the last run stopped, :class:`Boundaries` around the step
with a :class:`~lmkit.core.preemption.PreemptionWatcher`, and
:func:`preempted` to leave with exit status 75.
"""

from __future__ import annotations

import collections
import concurrent.futures
import io
import os
import time
from dataclasses import dataclass
from typing import Any, Deque, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from lmkit import distributed as dist
from lmkit.core.errors import CheckpointError, PreemptedError
from lmkit.core.layout import CHECKPOINT_DIR
from lmkit.train.checkpoint import CheckpointManager, CorruptCheckpointError

__all__ = ["Boundaries", "Checkpointer", "Position", "STATE_FILE", "gather_position", "preempted",
           "restore_position"]

STATE_FILE = "rnn_state.npz"  # inside a checkpoint folder: the carried state of every row


def _read_state(path: str) -> Optional[bytes]:
    """A checkpoint's ``rnn_state.npz`` (None without one), checked to read back in full.

    Raises:
      CorruptCheckpointError: the file is damaged.
    """
    state_path = os.path.join(path, STATE_FILE)
    if not os.path.isfile(state_path):
        return None
    try:
        with open(state_path, "rb") as f:
            data = f.read()
        with np.load(io.BytesIO(data)) as saved:
            for name in saved.files:
                saved[name]  # decompresses and checks the member's CRC
    except Exception as exc:  # noqa: BLE001 - whatever the damage, the file is unusable
        why = f"{type(exc).__name__}: {exc}".splitlines()[0]
        raise CorruptCheckpointError(f"checkpoint {path} is corrupt ({STATE_FILE}: {why})") from exc
    return data


def _to_numpy(state: Any) -> Any:
    return None if state is None else tf.nest.map_structure(lambda t: np.asarray(t), dist.local_rows(state))


def gather_position(state: Any, rng: tf.random.Generator) -> Optional[Tuple[Dict[str, bytes], Dict[str, Any]]]:
    """Collects the carried state of every row and every rank's generator (call on every rank).

    Args:
      state: this process's carried model state (None for stateless models).
      rng: this process's dropout generator.

    Returns:
      On rank 0, ``(files, meta)`` for the checkpoint: the state of every
      row of the global batch as ``rnn_state.npz`` (rank order is row
      order), and ``{"rng_states": [...], "world_size": N}``; None elsewhere.
    """
    mine = {"state": _to_numpy(state), "rng": np.asarray(rng.state).tolist()}
    everyone = dist.allgather_object(mine)  # same call, same step, on every rank
    if not dist.is_chief():
        return None
    meta = {"rng_states": [e["rng"] for e in everyone], "world_size": dist.size()}
    if everyone[0]["state"] is None:
        return {}, meta
    flat = [tf.nest.flatten(e["state"]) for e in everyone]
    rows = [np.concatenate(parts, axis=0) for parts in zip(*flat)]  # [global batch, ...] each
    buffer = io.BytesIO()
    np.savez(buffer, *rows)
    return {STATE_FILE: buffer.getvalue()}, meta


@dataclass
class Position:
    """What a rank resumes from inside an epoch."""

    state: Any  # this process's rows of the carried state (plain tensors), or None
    steps_in_epoch: int


def restore_position(meta: Optional[Dict[str, Any]], state_bytes: Optional[bytes], steps_in_epoch: int,
                     template: Any, rng: tf.random.Generator, seed: int, step: int) -> Position:
    """This rank's part of a restored position (no collective).

    Args:
      meta: the checkpoint's ``meta.json`` as rank 0 read it, or None without a checkpoint.
      state_bytes: its ``rnn_state.npz``, or None.
      steps_in_epoch: steps already done in the checkpoint's epoch.
      template: this process's initial state (gives the nest structure), or None.
      rng: this process's dropout generator, set here.
      seed: the config's seed (reseeding on another number of ranks).
      step: the restored global step.
    """
    rank, size = dist.rank(), dist.size()
    rng_states = (meta or {}).get("rng_states")
    if rng_states and len(rng_states) == size:
        rng.reset(tf.constant(rng_states[rank], dtype=rng.state.dtype))
    elif rank > 0:  # another layout: a distinct stream per rank, from the step on
        rng.reset_from_seed(step * 7919 + seed * 1009 + rank)
    state = None
    if state_bytes and template is not None and steps_in_epoch > 0:
        with np.load(io.BytesIO(state_bytes)) as saved:
            rows = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        per = rows[0].shape[0] // size
        mine = [tf.constant(r[rank * per:(rank + 1) * per]) for r in rows]  # this process's rows
        state = tf.nest.pack_sequence_as(tf.nest.map_structure(lambda t: 0, dist.local_rows(template)), mine)
    return Position(state=state, steps_in_epoch=steps_in_epoch)


class Boundaries:
    """When to save, stop or end, decided the same way on every rank.

    Args:
      watcher: the preemption watcher (its flag is this rank's stop request).
      every_steps: save every this many global steps (0 = off).
      every_minutes: rank 0 asks for a save this often (0 = off).
      lag: a step's agreed flags are decided on this many steps later (>= 1), on every rank alike.
      background: read the agreed flags on a thread of their own, as soon as each step is started
        (a read waits for the device; the thread that starts the steps then does not). Call
        :meth:`close` when done.
      control: this rank's other requests, an object with ``should_save`` and ``should_stop``
        (:class:`lmkit.train.callbacks.TrainerControl`): each is sent once, then cleared.
    """

    def __init__(self, watcher: Any, every_steps: int, every_minutes: float, lag: int = 1,
                 background: bool = False, control: Any = None) -> None:
        if lag < 1:
            raise ValueError(f"lag {lag!r} must be >= 1")
        self.watcher = watcher
        self.every_steps = every_steps
        self.every_seconds = every_minutes * 60.0
        self.lag = lag
        self.control = control
        self._last_save = time.monotonic()
        self._pending: Deque[Any] = collections.deque()  # the agreed flags of the last steps, oldest first
        self._reader = (concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmkit-flags")
                        if background else None)

    def flags(self) -> Tuple[float, float, float]:
        """This rank's ``(stop, save, end)`` requests for the step about to start."""
        save = end = 0.0
        if self.every_seconds > 0 and dist.is_chief() and time.monotonic() - self._last_save >= self.every_seconds:
            save = 1.0
            self._last_save = time.monotonic()  # one request per period: a pulse, not a level
        control = self.control
        if control is not None and (control.should_save or control.should_stop):
            save, end = max(save, float(control.should_save)), float(control.should_stop)
            control.should_save = control.should_stop = False  # sent: the step's all-reduce carries it
        return (1.0 if self.watcher.requested else 0.0), save, end

    def after_step(self, agreed: Any, global_step: int) -> List[str]:
        """What to do now that a step started: ``"stop"``, ``"end"`` or ``"save"`` (or nothing).

        ``agreed`` are that step's flags averaged over the ranks (the step's
        output), or, in a job of one process, its own ``(stop, save, end)``:
        the same values, known without waiting for the device. The flags of
        the step ``lag`` steps before are decided on, so every rank decides on
        the same values at the same step. A stop (a preemption) comes before
        an end, an end before a save (both save).
        """
        self._pending.append(self._reader.submit(_read_flags, agreed) if self._reader else agreed)
        actions = []
        if len(self._pending) > self.lag:
            actions = _decide([_read_flags(self._pending.popleft())])
        if not actions and self.every_steps and global_step % self.every_steps == 0:
            actions.append("save")
        return actions

    def flush(self) -> List[str]:
        """At the end of an epoch: the decision on the flags not decided yet (no step follows)."""
        read = [_read_flags(entry) for entry in self._pending]
        self._pending.clear()
        return _decide(read)

    def saved(self) -> None:
        self._last_save = time.monotonic()

    def close(self) -> None:
        """Waits for the reads under way and ends the reading thread."""
        if self._reader is not None:
            self._reader.shutdown(wait=True)
            self._reader = None


def _decide(read: List[Tuple[bool, bool, bool]]) -> List[str]:
    """The one action that flags read (``(stop, save, end)`` each) ask for: stop, else end, else save."""
    for index, action in ((0, "stop"), (2, "end"), (1, "save")):
        if any(flags[index] for flags in read):
            return [action]
    return []


def _read_flags(agreed: Any) -> Tuple[bool, bool, bool]:
    """``(stop, save, end)`` of a step's agreed flags (values, a tensor, or a pending read of them)."""
    if isinstance(agreed, concurrent.futures.Future):
        return agreed.result()
    values = [float(v) > 0 for v in np.asarray(agreed)]
    stop, save, end = (values + [False] * 3)[:3]
    return stop, save, end


class Checkpointer:
    """The checkpoints of a run: rank 0 writes and reads them, every rank takes part.

    Args:
      manager: rank 0's :class:`~lmkit.train.checkpoint.CheckpointManager`
        (every rank builds one; only rank 0 writes), or None without a model folder.
      progress: the run's counters and generator (``epoch``, ``global_step``,
        ``steps_in_epoch``, ``rng``: :class:`~lmkit.train.records.Progress`).
      world: replicas of the job (stored in every checkpoint; default: this job's).
      log: rank 0's logger (default: print on rank 0).
      beat: the watchdog's progress call (default: none).
      loss_scale: the run's :class:`~lmkit.train.loss_scale.DynamicLossScale`
        (mixed_float16), saved in and restored from the checkpoint's meta data.
    """

    def __init__(self, manager: Any, progress: Any, world: Optional[int] = None, log: Any = None,
                 beat: Any = None, loss_scale: Any = None) -> None:
        self.manager = manager
        self.progress = progress
        self.world = dist.num_replicas() if world is None else world
        self.log = log or _print_on_chief
        self.beat = beat or (lambda after: None)
        self.loss_scale = loss_scale
        self._write_failed = False

    @classmethod
    def for_run(cls, model_dir: Optional[str], model: Any, optimizer: Any, progress: Any, keep: int = 3,
                **options: Any) -> "Checkpointer":
        """The checkpoints of a run in ``<model_dir>/checkpoints``: ``model``, ``optimizer`` and ``progress``.

        Args:
          model_dir: the run's folder (None: nothing is kept).
          model: what the checkpoints hold of the model (a LoRA run's adapters alone).
          optimizer: the optimizer (its slots and counters).
          progress: the run's :class:`~lmkit.train.records.Progress`.
          keep: how many checkpoints to keep (``checkpoints.keep_checkpoints``).
          **options: ``world``, ``log``, ``beat``, ``loss_scale`` (see the class).
        """
        manager = None
        if model_dir is not None:
            ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, progress=progress)
            manager = CheckpointManager(os.path.join(model_dir, CHECKPOINT_DIR), ckpt, keep=keep)
        return cls(manager, progress, **options)

    def save(self, state: Any, meta: Dict[str, Any]) -> Optional[str]:
        """A checkpoint of this step, with the carried state of every row (call on every rank).

        Returns:
          The checkpoint's folder (rank 0; None elsewhere and without a model folder).

        Raises:
          CheckpointError: on every rank, when rank 0 could not write it (a full disk).
        """
        if self.manager is None:
            return None
        gathered = gather_position(state, self.progress.rng)  # a collective: every rank, same step
        files, position = gathered if gathered is not None else ({}, {})
        # Every rank learns how rank 0's write went (run_on_chief is a collective: every rank calls it
        # here), so a full disk ends every rank with rank 0's one message rather than leaving the others
        # in the next step's collective. They wait for the save here, watched as rank 0 is.
        self.beat("rank 0's checkpoint save began")
        path = dist.run_on_chief(lambda: self.save_on_chief({**meta, **position}, files))
        return path if dist.is_chief() else None

    def save_on_chief(self, meta: Dict[str, Any], files: Optional[Dict[str, bytes]] = None) -> Optional[str]:
        """Rank 0 alone writes a checkpoint (no collective: also on an error path).

        After a failed write (a full disk) it writes nothing more: the error
        that ends the run is that write's, not a second attempt's.
        """
        if self.manager is None or not dist.is_chief() or self._write_failed:
            return None
        self.beat("a checkpoint save began")
        if self.loss_scale is not None:
            meta = {**meta, "loss_scale": self.loss_scale.to_meta()}
        try:
            path = self.manager.save(int(self.progress.global_step.numpy()), files=files, meta={
                "epoch": int(self.progress.epoch.numpy()), "steps_in_epoch": int(self.progress.steps_in_epoch.numpy()),
                "world_size": self.world, **meta})
        except CheckpointError:
            self._write_failed = True
            raise
        self.log(f"saved checkpoint {path}")
        return path

    def restore_latest(self, variables: List[tf.Variable], template: Any,
                       seed: int) -> Tuple[Optional[str], Position]:
        """Rank 0 restores the newest checkpoint that reads back; every rank gets its variables and its position.

        Call it on every rank (it broadcasts), after the optimizer's slots
        exist; without a checkpoint every rank starts from rank 0's values.

        A corrupt newer checkpoint is named in rank 0's log and skipped
        (:meth:`~lmkit.train.checkpoint.CheckpointManager.restore_latest`); rank
        0 alone chooses and reads, and every rank takes its choice.

        Args:
          variables: every variable training updates (broadcast from rank 0).
          template: this process's initial model state (its structure), or None.
          seed: the config's seed.

        Returns:
          ``(the restored checkpoint or None, this rank's position)``: resume the epoch
          ``progress.epoch`` at ``position.steps_in_epoch`` with ``position.state``.
        """
        found: Tuple[Optional[str], Optional[Dict[str, Any]], Optional[bytes]] = (None, None, None)
        if self.manager is not None:
            def read() -> Tuple[Optional[str], Optional[Dict[str, Any]], Optional[bytes]]:
                self.manager.recover()  # a killed re-save's only copy back in place, leftovers removed
                # The newest checkpoint that reads back (a corrupt one is named in the log and skipped),
                # chosen by rank 0 alone: every rank gets that one's path, meta and state.
                return self.manager.restore_latest(self.log, read_more=_read_state)
            found = dist.run_on_chief(read)  # every rank: rank 0's path, meta and state
        path, meta, data = found
        if self.loss_scale is not None and meta and "loss_scale" in meta:  # every rank has rank 0's meta
            self.loss_scale.from_meta(meta["loss_scale"])
        counters = [self.progress.epoch, self.progress.global_step, self.progress.steps_in_epoch]
        dist.broadcast_variables(list(variables) + counters)  # rank 0's values, fresh or restored
        position = restore_position(meta, data, int(self.progress.steps_in_epoch.numpy()), template,
                                    self.progress.rng, seed, int(self.progress.global_step.numpy()))
        return path, position


def _print_on_chief(text: str) -> None:
    if dist.is_chief():
        print(text, flush=True)


def preempted(watcher: Any, progress: Any, checkpoint: Optional[str]) -> PreemptedError:
    """Every rank, after the stop's checkpoint: the error to leave with (exit status 75), saying where it stopped.

    Every rank waits here for rank 0's checkpoint (a broadcast: call it on
    every rank), so no rank's exit stops a save in progress; then the grace
    timer of ``watcher`` has nothing left to do.

    Args:
      watcher: the run's :class:`~lmkit.core.preemption.PreemptionWatcher`.
      progress: the run's counters, as saved.
      checkpoint: rank 0's last checkpoint (None elsewhere).
    """
    path = dist.broadcast_object(checkpoint, 0)  # DIST: every rank waits for rank 0's save
    watcher.stopped()
    step, epoch = int(progress.global_step.numpy()), int(progress.epoch.numpy())
    step_in_epoch = int(progress.steps_in_epoch.numpy())
    where = (f"step {step} (epoch {epoch + 1}, {step_in_epoch} steps into it)" if step_in_epoch else
             f"step {step} (the end of epoch {epoch})")
    signal_name = watcher.signal_name or "a signal on another rank"
    return PreemptedError(f"stopped by {signal_name} at {where}; checkpoint {path}; "
                          "rerun the same command to continue from there")
