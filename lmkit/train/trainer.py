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
import time
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


def fingerprint(*parts: Any) -> str:
    """A short, order-sensitive hash of JSON-able parts (config, sizes, vocab)."""
    import hashlib
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


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
    """

    def __init__(self, model: tf.Module, config: TrainConfig, model_dir: Optional[str] = None,
                 vocab: Any = None, optimizer: Any = None,
                 log: Optional[Callable[[str], None]] = None,
                 record_step_losses: bool = False, resume: bool = True) -> None:
        from lmkit.optim import build_optimizer

        self.model = model
        self.config = config
        self.model_dir = model_dir
        self.vocab = vocab
        self.world = dist.size()
        self.rank = dist.rank()
        self.chief = dist.is_chief()
        self._log = log or (lambda s: print(s, flush=True))
        self.record_step_losses = record_step_losses
        self.resume = resume
        if config.batch_size % self.world:
            raise UsageError(
                f"batch_size {config.batch_size} is not divisible by {self.world} workers; "
                f"use a multiple of {self.world}")
        self.local_batch = config.batch_size // self.world
        self.optimizer = optimizer if optimizer is not None else build_optimizer(config)
        # Dropout of lmkit modules draws from the global generator: make it a
        # checkpointed one, different on every rank (each rank sees other rows).
        self.progress = _Progress(config.seed * 1009 + self.rank)
        tf.random.set_global_generator(self.progress.rng)
        self._train_step = None
        self._eval_step = None
        self._compiled = False
        self.compile_time = 0.0
        self.policy = None

    # ------------------------------------------------------------------ logging
    def log(self, text: str) -> None:
        if self.chief:
            self._log(text)

    # ------------------------------------------------------------ start-up checks
    def _check_agreement(self, steps_per_epoch: int, train_len: int) -> None:
        """All ranks must load the same config, vocabulary and data sizes."""
        vocab_fp = self.vocab.fingerprint() if hasattr(self.vocab, "fingerprint") else None
        mine = {"config": fingerprint(self.config.to_dict()), "vocab": vocab_fp,
                "train_ids": int(train_len), "steps_per_epoch": int(steps_per_epoch)}
        everyone = dist.allgather_object(mine)  # same call on every rank
        for r, theirs in enumerate(everyone):
            if theirs != everyone[0]:
                diff = sorted(k for k in mine if theirs[k] != everyone[0][k])
                raise UsageError(
                    f"ranks disagree at start-up: rank {r} differs from rank 0 in {', '.join(diff)} "
                    f"(rank 0: {[everyone[0][k] for k in diff]}, rank {r}: {[theirs[k] for k in diff]}); "
                    "make every rank read the same config and data files")

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
                loss = sequence_softmax_cross_entropy(
                    y, logits, average_across_batch=True, average_across_timesteps=False,
                    sum_over_timesteps=True)
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
            loss = sequence_softmax_cross_entropy(
                y, logits, average_across_batch=True, average_across_timesteps=False,
                sum_over_timesteps=True)
            return loss, new_state

        self._compiled = False
        self._train_step = tf.function(train_step, jit_compile=cfg.jit_compile and self.world == 1)
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
        from lmkit.data.batching import bptt_arrays
        from lmkit.optim import LearningRatePolicy

        cfg = self.config
        epochs = num_epochs or cfg.num_epochs
        inputs, targets = bptt_arrays(train_ids, cfg.batch_size, cfg.num_steps,
                                      rank=self.rank, size=self.world)
        steps_per_epoch = int(inputs.shape[0])
        self._check_agreement(steps_per_epoch, len(train_ids))
        self._prepare_model_dir()
        self.policy = LearningRatePolicy.from_config(cfg, world_size=self.world,
                                                     steps_per_epoch=steps_per_epoch)
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
            state = self._initial_state(self.local_batch)  # reset each epoch
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
                loss, state, finite = self._train_step(tf.constant(inputs[i]), tf.constant(targets[i]), state)
                pending.append((loss, finite))
                steps_done += 1
                step_count += 1
                if not self._compiled:  # the first call traces and compiles: not training speed
                    loss_sum += sum(self._drain(pending, epoch, i))
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
                    tf.summary.scalar("train/perplexity", train_ppl)
                    tf.summary.scalar("train/learning_rate", lr)
                    tf.summary.scalar("train/words_per_sec", stats.words_per_sec)
                    if valid_ppl is not None:
                        tf.summary.scalar("valid/perplexity", valid_ppl)
                writer.flush()
            if (self.chief and manager is not None and completed
                    and ((epoch + 1) % cfg.checkpoint_every_epochs == 0 or epoch + 1 == epochs)):
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
