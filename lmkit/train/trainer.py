"""A distributed trainer for language models.

The same code runs in one process (``python examples/lm_ptb.py``) and on N
workers (``mpirun -np N python examples/lm_ptb_distributed.py``):

* the global batch of ``config.batch_size`` rows is split across the workers;
  rank r trains on rows ``[r*B/N, (r+1)*B/N)`` of every BPTT batch;
* every variable of the model and the optimizer (slots included) is
  broadcast from rank 0 after start-up or a resume, so all ranks start equal;
* gradients are averaged over ranks (``dist.DistributedGradientTape``), then
  clipped, so every rank applies the same update;
* rank 0 alone evaluates, logs and writes checkpoints; that path holds no
  collective operation, the other ranks simply wait in the next one.

All collective operations sit inside the compiled training step, so every
rank issues them in the same order.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from lmkit import dist
from lmkit.config import TrainConfig
from lmkit.errors import CheckpointError, NonFiniteError, UsageError
from lmkit.losses import sequence_softmax_cross_entropy
from lmkit.train.checkpoint import (CHECKPOINT_DIR, CONFIG_FILE, VOCAB_FILE, CheckpointManager,
                                    read_config_dict, write_text_atomic)
from lmkit.train.metrics import ProgressBar, perplexity


@dataclass
class EpochStats:
    """What one epoch measured (rank 0's view; losses are averaged over ranks)."""

    epoch: int
    train_perplexity: float
    valid_perplexity: Optional[float]
    learning_rate: float
    words_per_sec: float
    epoch_time: float
    cumulative_time: float
    steps: int


@dataclass
class TrainResult:
    """The outcome of :meth:`Trainer.fit`."""

    epochs: List[EpochStats] = field(default_factory=list)
    test_perplexity: Optional[float] = None
    step_losses: List[float] = field(default_factory=list)
    global_step: int = 0
    resumed_from: Optional[str] = None

    def to_dict(self) -> Dict[str, Any]:
        return {
            "epochs": [vars(e) for e in self.epochs],
            "test_perplexity": self.test_perplexity,
            "global_step": self.global_step,
            "resumed_from": self.resumed_from,
            "final_train_perplexity": self.epochs[-1].train_perplexity if self.epochs else None,
            "final_valid_perplexity": self.epochs[-1].valid_perplexity if self.epochs else None,
        }


class _Progress(tf.Module):
    """Counters and the random state that a checkpoint must carry."""

    def __init__(self, seed: int) -> None:
        super().__init__(name="progress")
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.rng = tf.random.Generator.from_seed(seed, alg="philox")


def window_loss(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """The training and evaluation loss of one window of ``labels`` [batch, time].

    Cross-entropy summed over the window's time steps and averaged over its
    rows: what every step of the trainer reports (divide by the window
    length for the per-word loss whose exponential is the perplexity).
    """
    return sequence_softmax_cross_entropy(labels, logits, average_across_batch=True,
                                          average_across_timesteps=False, sum_over_timesteps=True)


def _scalar_summary(name: str, value: float) -> None:
    """What ``tf.summary.scalar`` writes, without needing TensorBoard installed.

    ``tf.summary.scalar`` lives in the TensorBoard package, which TensorFlow
    2.20+ no longer installs; ``tf.summary.write`` is TensorFlow's own, and the
    "scalars" plugin tag makes TensorBoard show the value as a scalar.
    """
    from tensorflow.core.framework import summary_pb2
    metadata = summary_pb2.SummaryMetadata()
    metadata.plugin_data.plugin_name = "scalars"
    tf.summary.write(name, tf.constant(value, tf.float32), metadata=metadata)


COLLECTIVE_TIMEOUT_ENV = "LMKIT_COLLECTIVE_TIMEOUT"
DEFAULT_COLLECTIVE_TIMEOUT = 300.0  # seconds without progress before a rank ends the job


class _Watchdog:
    """Ends this process when training makes no progress for ``limit`` seconds.

    A rank stuck outside the collectives (a deadlock, a hung file system)
    leaves the others waiting in the next collective forever: launchers end a
    job only when a process exits, and Horovod's stall check only warns.
    Training steps, evaluation batches and checkpoint saves report progress
    (:meth:`beat`); after ``limit`` seconds without any, this rank prints
    where it is stuck and exits with status 1, so the launcher stops the job.

    The first beat arms it (compiling the first step may take long);
    :meth:`pause` disarms it until the next beat (a rank waiting while rank
    0 alone evaluates and saves: rank 0's own watchdog covers that time). A
    rank waiting inside TensorFlow or Horovod (in a collective) gives the
    stuck rank a head start of ``max(5, limit / 5)`` seconds, so that the
    stuck rank is the one that reports.

    Args:
      rank: this process's rank, for the message.
      limit: seconds without progress; 0 turns the watchdog off.
    """

    def __init__(self, rank: int, limit: float) -> None:
        self.rank = rank
        self.limit = limit
        self._last: Optional[float] = None  # time of the last beat; None = not armed
        self._after: Any = "start-up"
        self._stop = threading.Event()
        if limit > 0:
            threading.Thread(target=self._watch, name="lmkit-watchdog", daemon=True).start()

    @classmethod
    def from_env(cls, rank: int, processes: int) -> "_Watchdog":
        """Reads ``LMKIT_COLLECTIVE_TIMEOUT``; off in a single process (no peer to wait for)."""
        raw = os.environ.get(COLLECTIVE_TIMEOUT_ENV, "").strip()
        try:
            limit = float(raw) if raw else DEFAULT_COLLECTIVE_TIMEOUT
        except ValueError:
            raise UsageError(f"{COLLECTIVE_TIMEOUT_ENV}={raw!r} is not a number of seconds; "
                             "set it to e.g. 600, or 0 to turn the watchdog off") from None
        return cls(rank, limit if processes > 1 else 0.0)

    def beat(self, after: Any) -> None:
        """Records progress: ``after`` is the global step just finished, or what just happened."""
        self._after = after
        self._last = time.monotonic()

    def pause(self) -> None:
        self._last = None

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        head_start = max(5.0, self.limit / 5)
        while not self._stop.wait(min(2.0, self.limit / 10)):
            last = self._last
            if last is None:
                continue
            idle = time.monotonic() - last
            if idle < self.limit or self._stop.is_set():
                continue
            # Where is the main thread? Inside a library means waiting in a collective.
            frame = sys._current_frames().get(threading.main_thread().ident)
            stack = traceback.extract_stack(frame) if frame is not None else []
            own = [f for f in stack if "site-packages" not in f.filename
                   and "dist-packages" not in f.filename]
            waiting = bool(own) and stack[-1] is not own[-1]
            if waiting and idle < self.limit + head_start:
                continue
            after = (f"training step {self._after} finished" if isinstance(self._after, int)
                     else self._after)
            where = (f"{own[-1].filename}:{own[-1].lineno} in {own[-1].name} ({own[-1].line})"
                     if own else "an unknown place")
            why = ("waiting inside TensorFlow/Horovod (a collective operation waits for every "
                   "rank): another rank is stuck or gone" if waiting else
                   "the other ranks wait for this one in the next collective operation")
            sys.stderr.write(
                f"rank {self.rank} failed: no progress for {idle:.0f} s since {after}; it is at "
                f"{where}, {why}. Ending this rank so that the launcher stops the job "
                f"({COLLECTIVE_TIMEOUT_ENV}={self.limit:g} s; raise it if a step, an evaluation "
                "or a checkpoint save may take longer, 0 turns this check off)\n")
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(1)


class Trainer:
    """Trains a language model (any object following docs/design.md) on id streams.

    Args:
      model: an ``lmkit.models`` language model or a user model with the same protocol.
      config: the training config (batch, schedule, optimizer, ...).
      model_dir: where checkpoints, the config, the vocabulary, TensorBoard
        summaries and ``results.json`` go (rank 0 writes); None keeps nothing.
      vocab: the vocabulary, stored with the checkpoints for generation.
      optimizer: an ``lmkit.optim`` optimizer; default built from the config.
      log: where rank 0 prints its lines (default: stdout).
      record_step_losses: keep the rank-averaged loss of every step in the
        result (one host sync per step: for tests).
      resume: restore the latest checkpoint of ``model_dir`` when there is one.
      lr_world_size: the number of workers the learning-rate scaling and
        warmup assume (default: the real number); lets one process reproduce
        the policy of N workers with the same global batch.
    """

    def __init__(self, model: tf.Module, config: TrainConfig, model_dir: Optional[str] = None,
                 vocab: Any = None, optimizer: Any = None,
                 log: Optional[Callable[[str], None]] = None,
                 record_step_losses: bool = False, resume: bool = True,
                 lr_world_size: Optional[int] = None) -> None:
        from lmkit.optim import build_optimizer

        self.model = model
        self.config = config
        self.model_dir = model_dir
        self.vocab = vocab
        self.world = dist.num_replicas()  # data-parallel replicas (= processes with Horovod)
        self.rank = dist.rank()
        self.chief = dist.is_chief()
        self._log = log or (lambda s: print(s, flush=True))
        self.record_step_losses = record_step_losses
        self.lr_world_size = lr_world_size or self.world
        self.resume = resume
        if config.batch_size % self.world:
            raise UsageError(
                f"batch_size {config.batch_size} is not divisible by {self.world} workers; "
                f"use a multiple of {self.world}")
        self.local_batch = config.batch_size // self.world
        with dist.scope():  # the native backend keeps one copy per replica
            self.optimizer = optimizer if optimizer is not None else build_optimizer(config)
        # Dropout of lmkit modules draws from the global generator: make it a
        # checkpointed one, different on every rank (each rank sees other rows).
        with dist.scope():
            self.progress = _Progress(config.seed * 1009 + self.rank)
        tf.random.set_global_generator(self.progress.rng)
        self._train_step = None
        self._eval_step = None
        self._compiled = False
        self.compile_time = 0.0
        self.policy = None
        self._watchdog = _Watchdog(self.rank, 0.0)  # armed by fit() when there are peers

    # ------------------------------------------------------------------ logging
    def log(self, text: str) -> None:
        if self.chief:
            self._log(text)

    # ------------------------------------------------------------ start-up checks
    def _check_agreement(self, steps_per_epoch: int, train_len: int) -> None:
        """All ranks must load the same config, vocabulary and data sizes."""
        vocab_fp = self.vocab.fingerprint() if hasattr(self.vocab, "fingerprint") else None
        mine = {"config": self.config.to_dict(), "vocab": vocab_fp,
                "train_ids": int(train_len), "steps_per_epoch": int(steps_per_epoch)}
        everyone = dist.allgather_object(mine)  # same call on every rank
        first = everyone[0]
        for r, theirs in enumerate(everyone):
            if theirs != first:
                # Name every value that differs; configs are compared key by key.
                keys = sorted(set(first["config"]) | set(theirs["config"]))
                diffs = [f"config key {k} (rank 0: {first['config'].get(k)!r}, rank {r}: "
                         f"{theirs['config'].get(k)!r})"
                         for k in keys if first["config"].get(k) != theirs["config"].get(k)]
                diffs += [f"{k} (rank 0: {first[k]!r}, rank {r}: {theirs[k]!r})"
                          for k in mine if k != "config" and theirs[k] != first[k]]
                raise UsageError(f"ranks disagree at start-up: rank {r} differs from rank 0 in "
                                 f"{'; '.join(diffs)}; make every rank read the same config and data files")

    def _prepare_model_dir(self) -> None:
        """Rank 0 checks the folder and the stored config/vocabulary; all ranks learn the outcome."""
        if self.model_dir is None:
            return

        def check() -> None:
            md = self.model_dir
            try:
                os.makedirs(md, exist_ok=True)
                probe = os.path.join(md, f".write-test-{os.getpid()}")
                with open(probe, "w") as f:
                    f.write("ok")
                os.remove(probe)
            except OSError as exc:
                raise UsageError(f"model directory {md} is not writable ({exc.strerror}); "
                                 "pass a --model_dir you can write to") from None
            cfg_path = os.path.join(md, CONFIG_FILE)
            if os.path.exists(cfg_path):
                stored = read_config_dict(md)
                mine = self.config.model_config()
                diff = {k: (stored.get(k), v) for k, v in mine.items() if stored.get(k) != v}
                if diff:
                    k, (old, new) = sorted(diff.items())[0]
                    raise CheckpointError(
                        f"{md} holds a model trained with {k} = {old!r}, but the config says {new!r}; "
                        "use the same config to resume, or another --model_dir")
            vocab_path = os.path.join(md, VOCAB_FILE)
            if self.vocab is not None and os.path.exists(vocab_path):
                from lmkit.data.vocab import Vocab
                stored_vocab = Vocab.load(vocab_path)
                if stored_vocab.fingerprint() != self.vocab.fingerprint():
                    raise CheckpointError(
                        f"{vocab_path} ({len(stored_vocab)} tokens) differs from the vocabulary of the "
                        f"data ({len(self.vocab)} tokens); resume with the same data, or use another --model_dir")
            write_text_atomic(cfg_path, self.config.to_json())
            if self.vocab is not None:
                self.vocab.save(vocab_path)

        dist.run_on_chief(check)

    # -------------------------------------------------------------- compiled steps
    def _trainable(self) -> List[tf.Variable]:
        return list(self.model.trainable_variables)

    def _build_steps(self) -> None:
        cfg = self.config
        model, opt, progress, policy = self.model, self.optimizer, self.progress, self.policy
        variables = self._trainable()
        from lmkit.optim import clip_by_global_norm, clip_by_layer_norm

        def train_step(x, y, state):
            with tf.GradientTape() as tape:
                logits, new_state = model(x, state, training=True)  # [b, t, vocab]
                loss = window_loss(y, logits)
            # Averaging over ranks happens here (allreduce / allgather).
            tape = dist.DistributedGradientTape(tape, sparse_as_dense=cfg.sparse_as_dense,
                                                compression=cfg.compression)
            grads = tape.gradient(loss, variables)
            # Clipping after the averaging: every rank applies the same update.
            if cfg.max_grad_norm_per_layer > 0:
                grads = clip_by_layer_norm(grads, cfg.max_grad_norm_per_layer)
            if cfg.max_grad_norm > 0:
                grads, norm = clip_by_global_norm(grads, cfg.max_grad_norm)
            else:
                norm = tf.linalg.global_norm([tf.convert_to_tensor(g) for g in grads if g is not None])
            mean_loss = dist.allreduce(loss, op="average", name="lmkit.train_loss")
            finite = tf.math.logical_and(tf.math.is_finite(mean_loss), tf.math.is_finite(norm))
            opt.learning_rate.assign(policy(progress.global_step))

            def apply():
                opt.apply_gradients(zip(grads, variables))
                return tf.constant(True)

            # A non-finite step is not applied; the host stops training.
            tf.cond(finite, apply, lambda: tf.constant(False))
            progress.global_step.assign_add(1)
            return mean_loss, new_state, finite

        def eval_step(x, y, state):
            logits, new_state = model(x, state, training=False)
            return window_loss(y, logits), new_state

        self._compiled = False
        def replicated_step(x, y, state):
            # Each local replica trains on its rows; the loss agrees on all of them.
            loss, new_state, finite = dist.run(train_step, (x, y, state))
            return dist.first(loss), new_state, dist.first(finite)

        self._train_step = tf.function(replicated_step, jit_compile=cfg.jit_compile and self.world == 1)
        self._eval_step = tf.function(eval_step)

    # ----------------------------------------------------------------- training
    def _initial_state(self, batch: int):
        return self.model.initial_state(batch) if getattr(self.model, "stateful", False) else None

    def evaluate(self, ids: np.ndarray, batch_size: Optional[int] = None) -> float:
        """Perplexity of ``ids`` on this process alone (no collective: rank 0 only)."""
        from lmkit.data.batching import bptt_arrays
        batch = batch_size or self.config.eval_batch_size or self.config.batch_size
        inputs, targets = bptt_arrays(ids, batch, self.config.num_steps)
        if self._eval_step is None:
            raise RuntimeError("call fit() first")
        state = self._initial_state(batch)
        total = 0.0
        for i in range(inputs.shape[0]):
            loss, state = self._eval_step(tf.constant(inputs[i]), tf.constant(targets[i]), state)
            total += float(loss)
            self._watchdog.beat("an evaluation batch finished")
        return perplexity(total / (inputs.shape[0] * self.config.num_steps))

    def fit(self, train_ids: np.ndarray, valid_ids: Optional[np.ndarray] = None,
            test_ids: Optional[np.ndarray] = None, max_steps: Optional[int] = None,
            num_epochs: Optional[int] = None) -> TrainResult:
        """Trains for the config's epochs (or until ``max_steps``), evaluating on rank 0.

        Args:
          train_ids: the training id stream (every rank passes the whole
            stream; each takes its rows).
          valid_ids: evaluated by rank 0 after every epoch.
          test_ids: evaluated by rank 0 at the end.
          max_steps: stop after this many global steps (tests, benchmarks).
          num_epochs: overrides ``config.num_epochs``.

        Returns:
          The per-epoch statistics (meaningful on rank 0) and, when asked
          for, the rank-averaged loss of every step.

        Raises:
          UsageError: bad batch size, data too small, ranks disagree, or a
            model directory that does not fit this config.
          NonFiniteError: a loss or gradient became NaN/Inf.
        """
        # With peers, a watchdog ends this process when training stops making
        # progress (LMKIT_COLLECTIVE_TIMEOUT), instead of waiting forever.
        self._watchdog = _Watchdog.from_env(self.rank, dist.size())
        try:
            return self._fit(train_ids, valid_ids, test_ids, max_steps, num_epochs)
        finally:
            self._watchdog.stop()

    def _fit(self, train_ids: np.ndarray, valid_ids: Optional[np.ndarray],
             test_ids: Optional[np.ndarray], max_steps: Optional[int],
             num_epochs: Optional[int]) -> TrainResult:
        from lmkit.data.batching import bptt_arrays
        from lmkit.optim import LearningRatePolicy

        cfg = self.config
        epochs = num_epochs or cfg.num_epochs
        inputs, targets = bptt_arrays(train_ids, cfg.batch_size, cfg.num_steps,
                                      rank=self.rank, size=dist.size())  # this process's rows
        steps_per_epoch = int(inputs.shape[0])
        self._check_agreement(steps_per_epoch, len(train_ids))
        self._prepare_model_dir()
        self.policy = LearningRatePolicy.from_config(cfg, world_size=self.lr_world_size,
                                                     steps_per_epoch=steps_per_epoch)
        with dist.scope():
            self.optimizer.build(self._trainable())

        result = TrainResult()
        manager = None
        ckpt = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, progress=self.progress)
        if self.model_dir is not None:
            manager = CheckpointManager(os.path.join(self.model_dir, CHECKPOINT_DIR), ckpt,
                                        keep=cfg.keep_checkpoints)
        if manager is not None and self.resume:
            def restore() -> Optional[str]:
                latest = manager.latest()
                if latest is not None:
                    manager.restore(latest)
                return latest
            result.resumed_from = dist.run_on_chief(restore)
        # Rank 0's variables (fresh or restored) go to every rank.
        dist.broadcast_variables(list(self.model.variables) + list(self.optimizer.variables)
                                 + [self.progress.epoch, self.progress.global_step])
        if self.rank > 0:  # other ranks continue a distinct random stream
            self.progress.rng.reset_from_seed(
                int(self.progress.global_step.numpy()) * 7919 + cfg.seed * 1009 + self.rank)
        if result.resumed_from:
            self.log(f"resumed from {result.resumed_from} (epoch {int(self.progress.epoch.numpy())}, "
                     f"step {int(self.progress.global_step.numpy())}) on {self.world} worker(s)")
        self._build_steps()
        writer = None
        if self.chief and self.model_dir is not None:
            writer = tf.summary.create_file_writer(os.path.join(self.model_dir, "tensorboard"))

        words_per_step = cfg.batch_size * cfg.num_steps
        start_epoch = int(self.progress.epoch.numpy())
        cumulative = 0.0
        self.log(f"training {type(self.model).__name__} on {self.world} worker(s): global batch "
                 f"{cfg.batch_size} ({self.local_batch} per worker) x {cfg.num_steps} steps, "
                 f"{steps_per_epoch} steps/epoch, epochs {start_epoch + 1}..{epochs}")
        stop = False
        step_count = int(self.progress.global_step.numpy())
        for epoch in range(start_epoch, epochs):
            state = dist.per_replica(lambda: self._initial_state(self.local_batch))  # reset each epoch
            bar = ProgressBar(steps_per_epoch, f"epoch {epoch + 1}/{epochs}", enabled=self.chief,
                              every=cfg.log_every_steps)
            loss_sum = 0.0
            pending: List[Any] = []  # (loss, finite) tensors not yet read back
            steps_done = 0
            timed_from = 0  # steps before this one are not in the epoch's words/sec
            t0 = time.perf_counter()
            for i in range(steps_per_epoch):
                if max_steps is not None and step_count >= max_steps:
                    stop = True
                    break
                if i == 0 and not self.chief:  # waits for rank 0's evaluation and save (watched there)
                    self._watchdog.pause()
                loss, state, finite = self._train_step(tf.constant(inputs[i]), tf.constant(targets[i]), state)
                self._watchdog.beat(step_count + 1)
                pending.append((loss, finite))
                steps_done += 1
                step_count += 1
                if not self._compiled:  # the first call traces and compiles: not training speed
                    values = self._drain(pending, epoch, i)
                    if self.record_step_losses:
                        result.step_losses.extend(values)
                    loss_sum += sum(values)
                    self.compile_time = time.perf_counter() - t0
                    self._compiled = True
                    self.log(f"compiled the training step in {self.compile_time:.1f} s")
                    t0 = time.perf_counter()
                    timed_from = steps_done
                # Reading values back costs a host sync: only every few steps.
                if len(pending) >= bar.every or i == steps_per_epoch - 1 or self.record_step_losses:
                    values = self._drain(pending, epoch, i)
                    if self.record_step_losses:
                        result.step_losses.extend(values)
                    loss_sum += sum(values)
                    elapsed = time.perf_counter() - t0
                    bar.update(i + 1, f"ppl {perplexity(loss_sum / ((i + 1) * cfg.num_steps)):.2f} "
                               f"{words_per_step * (steps_done - timed_from) / max(elapsed, 1e-9):.0f} wps")
            if pending:
                loss_sum += sum(self._drain(pending, epoch, steps_done - 1))
            bar.close()
            epoch_time = time.perf_counter() - t0
            cumulative += epoch_time
            if steps_done == 0:
                break
            lr = float(self.optimizer.learning_rate.numpy())
            train_ppl = perplexity(loss_sum / (steps_done * cfg.num_steps))
            completed = not stop
            if completed:
                self.progress.epoch.assign(epoch + 1)
            valid_ppl = None
            if self.chief and valid_ids is not None:  # rank 0 only: no collective here
                valid_ppl = self.evaluate(valid_ids)
            stats = EpochStats(epoch=epoch + 1, train_perplexity=train_ppl, valid_perplexity=valid_ppl,
                               learning_rate=lr,
                               words_per_sec=words_per_step * (steps_done - timed_from) / max(epoch_time, 1e-9),
                               epoch_time=epoch_time, cumulative_time=cumulative, steps=steps_done)
            result.epochs.append(stats)
            self.log(f"Epoch {epoch + 1}/{epochs}: lr {lr:.4g} | train ppl {train_ppl:.2f} | valid ppl "
                     f"{'-' if valid_ppl is None else f'{valid_ppl:.2f}'} | {stats.words_per_sec:.0f} words/sec "
                     f"({self.world} worker(s)) | epoch time {epoch_time:.1f} s | "
                     f"cumulative training time {cumulative:.1f} s")
            if writer is not None:
                with writer.as_default(step=int(self.progress.global_step.numpy())):
                    _scalar_summary("train/perplexity", train_ppl)
                    _scalar_summary("train/learning_rate", lr)
                    _scalar_summary("train/words_per_sec", stats.words_per_sec)
                    if valid_ppl is not None:
                        _scalar_summary("valid/perplexity", valid_ppl)
                writer.flush()
            if (self.chief and manager is not None and completed
                    and ((epoch + 1) % cfg.checkpoint_every_epochs == 0 or epoch + 1 == epochs)):
                self._watchdog.beat("a checkpoint save began")
                path = manager.save(int(self.progress.global_step.numpy()),
                                    meta={"epoch": epoch + 1, "world_size": self.world,
                                          "train_perplexity": train_ppl, "valid_perplexity": valid_ppl})
                self.log(f"saved checkpoint {path}")
            if stop:
                break
        result.global_step = int(self.progress.global_step.numpy())
        if self.chief and test_ids is not None:
            result.test_perplexity = self.evaluate(test_ids)
            self.log(f"Test perplexity: {result.test_perplexity:.2f}")
        if self.chief and self.model_dir is not None:
            summary = {"config": cfg.to_dict(), "world_size": self.world, **result.to_dict()}
            write_text_atomic(os.path.join(self.model_dir, "results.json"),
                              json.dumps(summary, indent=2, sort_keys=True))
        return result

    @staticmethod
    def _drain(pending: List[Any], epoch: int, last_index: int) -> List[float]:
        """Reads the pending step results; raises on the first non-finite one."""
        values = []
        for k, (loss, finite) in enumerate(pending):
            value = float(loss)
            if not bool(finite) or not math.isfinite(value):
                step_in_epoch = last_index - len(pending) + 1 + k
                pending.clear()
                raise NonFiniteError(
                    f"non-finite loss or gradient (loss {value}) at epoch {epoch + 1}, step "
                    f"{step_in_epoch + 1}; the update was not applied and the last good checkpoint "
                    "stays the latest. Lower the learning rate or max_grad_norm, or check the data")
            values.append(value)
        pending.clear()
        return values
