"""A distributed trainer for language models and encoder-decoders.

The same code runs in one process (``python examples/lm_ptb.py``) and on N
workers (``mpirun -np N python examples/lm_ptb_distributed.py``):

* the global batch of ``config.batch_size`` rows is split across the workers;
  rank r trains on rows ``[r*B/N, (r+1)*B/N)`` of every batch (BPTT rows,
  windows, or source/target pairs: :mod:`lmkit.train.tasks` turns the data
  into batches and a batch into a loss);
* every variable of the model and the optimizer (slots included) is
  broadcast from rank 0 after start-up or a resume, so all ranks start equal;
* each replica computes its gradients (with ``grad_accum_steps`` = k, the
  mean of k micro-batches: :mod:`lmkit.train.accumulation`), they are
  averaged over the replicas once (``dist.average_gradients``), then
  clipped, so every rank applies the same update;
* the steps are XLA-compiled where that is faster (``jit_compile = "auto"``:
  on GPUs; :mod:`lmkit.core.xla`); with several replicas the gradients and the
  update are compiled apart and the collectives run between them;
* a non-finite step is not applied; on GPUs and under XLA that is decided
  on the device without a branch (``Optimizer.apply_gradients(apply_if=...)``),
  so the host never waits for the GPU inside a step;
* the arithmetic runs in ``config.precision`` (:mod:`lmkit.layers.precision`);
  ``mixed_float16`` scales the loss (:mod:`lmkit.train.loss_scale`) and
  skips a step whose averaged gradients overflowed, on every rank alike;
* rank 0 alone evaluates, logs and writes checkpoints; that path holds no
  collective operation: the other ranks wait for the outcome of rank 0's
  checkpoint write (one broadcast, ``Checkpointer.save``), or in the next
  collective.

All collective operations sit inside the compiled training step, so every
rank issues them in the same order.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np
import tensorflow as tf

from lmkit import distributed as dist
from lmkit.config import TrainConfig
from lmkit.core.checks import check_divisible
from lmkit.core.errors import NonFiniteError, PreemptedError, UsageError
from lmkit.core.fileio import atomic_write_text
from lmkit.core.layout import CHECKPOINT_DIR, RESULTS_FILE, TENSORBOARD_DIR
from lmkit.core.preemption import PreemptionWatcher
from lmkit.core.xla import use_autograph, use_xla
from lmkit.data.batching import Batches
from lmkit.layers import kernels as attention_kernels
from lmkit.layers import precision
from lmkit.layers.lora import lora_of
from lmkit.optim import LearningRatePolicy, build_optimizer, clip_gradients
from lmkit.train.accumulation import accumulate_gradients, micro_batch_rows
from lmkit.train.checkpoint import CheckpointManager
from lmkit.train.evaluation import Evaluator
from lmkit.train.feed import feed_device, flag_tensors, host_flags, window_feed
from lmkit.train.flops import device_peak_tflops, flops_per_token
from lmkit.train.loss_scale import DynamicLossScale
from lmkit.train.metrics import ProgressBar, StepLines, Summaries, perplexity
from lmkit.train.records import EpochRun, EpochStats, Progress, StepResult, TrainResult
from lmkit.train.resume import Boundaries, Checkpointer, Position
from lmkit.train.startup import check_agreement, prepare_model_dir
from lmkit.train.tasks import task_for
from lmkit.train.watchdog import Watchdog


class Trainer:
    """Trains a language model on id streams, or an encoder-decoder on source/target pairs.

    The loop is a thin layer over public pieces: the batches and the loss
    (:mod:`lmkit.train.tasks`), gradient averaging (:mod:`lmkit.distributed`),
    clipping (:func:`lmkit.optim.clip_gradients`), the learning-rate policy
    (:class:`lmkit.optim.LearningRatePolicy`), checkpoints
    (:class:`~lmkit.train.checkpoint.CheckpointManager`), start-up checks
    (:mod:`lmkit.train.startup`), the watchdog (:mod:`lmkit.train.watchdog`)
    and summaries (:mod:`lmkit.train.metrics`).

    Args:
      model: an ``lmkit.models`` model or a user model with the same protocol
        (docs/design.md); one with ``conditional = True`` trains on
        :class:`~lmkit.data.paired.Pairs`.
      config: the training config (batch, schedule, optimizer, ...).
      model_dir: where checkpoints, the config, the vocabulary, TensorBoard
        summaries and ``results.json`` go (rank 0 writes); None keeps nothing.
      vocab: the vocabulary, stored with the checkpoints for generation (an
        encoder-decoder's target tokenizer: its start, end and padding ids frame the targets).
      optimizer: an ``lmkit.optim`` optimizer; default built from the config.
      log: where rank 0 prints its lines (default: stdout).
      record_step_losses: keep the rank-averaged loss of every step in the
        result (one host sync per step: for tests); NaN for a step skipped
        by ``mixed_float16`` loss scaling.
      resume: restore the latest checkpoint of ``model_dir`` when there is one.
      lr_world_size: the number of workers the learning-rate scaling and
        warmup assume (default: the real number); lets one process reproduce
        the policy of N workers with the same global batch.

    Raises:
      UsageError: ``batch_size`` not divisible by the number of replicas
        times ``grad_accum_steps``, or an unknown ``precision``.
    """

    def __init__(self, model: tf.Module, config: TrainConfig, model_dir: Optional[str] = None,
                 vocab: Any = None, optimizer: Any = None,
                 log: Optional[Callable[[str], None]] = None,
                 record_step_losses: bool = False, resume: bool = True,
                 lr_world_size: Optional[int] = None) -> None:
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
        self.local_batch = check_divisible("batch_size", config.data.batch_size, self.world, "workers")
        self.micro_batch = micro_batch_rows(config.data.batch_size, self.world, config.optimization.grad_accum_steps)
        self.precision = precision.get(config.compute.precision)
        with dist.scope():  # the native backend keeps one copy per replica
            self.optimizer = optimizer if optimizer is not None else build_optimizer(config)
            self.loss_scale: Optional[DynamicLossScale] = DynamicLossScale(
                config.compute.loss_scale, config.compute.loss_scale_growth_interval,
                config.compute.max_consecutive_skips
            ) if self.precision.loss_scaling else None
            # Dropout of lmkit modules draws from the global generator: make it a
            # checkpointed one, different on every rank (each rank sees other rows).
            self.progress = Progress(config.run.seed, self.rank)
        tf.random.set_global_generator(self.progress.rng)
        self._compiled_train_step: Optional[Callable[..., Any]] = None
        self._evaluator: Optional[Evaluator] = None
        self._compiled = False
        self.xla = False  # whether the steps are XLA-compiled (config.jit_compile, decided by build())
        self.attention_kernel = "matmul"  # config.attention_kernel as resolved by build() (lmkit.layers.kernels)
        self.branch_free = False  # whether a non-finite step is skipped without a tf.cond (build())
        self.compile_time = 0.0
        self.policy: Optional[LearningRatePolicy] = None
        self._watchdog = Watchdog(self.rank, 0.0)  # armed by fit() when there are peers
        self.task = task_for(model, config, vocab, self.rank, dist.size())  # the data's batches and loss
        self._tokens_per_word: Dict[str, float] = {}
        # Model FLOPs per token (None for encoder-decoders) and one device's peak (None when unknown).
        self.flops_per_token = flops_per_token(model, config.data.num_steps)
        self.peak_tflops: Optional[float] = None
        self.peak_source = ""
        self._step_lines: Optional[StepLines] = None  # a run planned in steps prints these (fit)
        self._valid_sample: Any = None  # what the evaluations every eval_every_steps read (fit)

    @property
    def _saved_model(self) -> tf.Module:
        """What the checkpoints hold of the model: the LoRA adapters alone (the base is its own folder), or
        all of it."""
        lora = lora_of(self.model)
        return self.model if lora is None else lora

    def log(self, text: str) -> None:
        """Prints ``text`` on rank 0."""
        if self.chief:
            self._log(text)

    # -------------------------------------------------------------- compiled steps
    def build(self, steps_per_epoch: int) -> None:
        """Creates the optimizer slots and the learning-rate policy, and compiles the steps.

        :meth:`fit` calls it; call it yourself only to drive :meth:`train_step`
        without ``fit`` (benchmarks).
        """
        self.policy = LearningRatePolicy.from_config(self.config, world_size=self.lr_world_size,
                                                     steps_per_epoch=steps_per_epoch)
        with dist.scope():
            self.optimizer.build(list(self.model.trainable_variables))
        self.peak_tflops, self.peak_source = device_peak_tflops(self.config.run.peak_tflops,
                                                                self.config.compute.precision)
        self._build_steps()

    def _build_steps(self) -> None:
        """Traces nothing yet: builds the compiled training step and the evaluator for this run."""
        cfg = self.config
        variables = list(self.model.trainable_variables)
        self._choose_compilation(dist.device_type())
        autograph = self.autograph
        # With more than one replica the collectives stay outside XLA (Horovod's cannot be
        # compiled): the replica's gradients and the update are compiled apart.
        split = self.xla and self.world > 1
        local_gradients = self._local_gradients_fn(variables)
        update = self._update_fn(variables)
        # Pairs come in a few padded lengths: one trace serves them all (XLA compiles each shape).
        if split:
            local_gradients = tf.function(local_gradients, jit_compile=True, reduce_retracing=True,
                                          autograph=autograph)
            update = tf.function(update, jit_compile=True, autograph=autograph)

        def train_step(x, y, state, stop, save):
            loss, grads, new_state = local_gradients(x, y, state)
            # Averaging over replicas (allreduce / allgather): one round per optimizer step.
            grads = dist.average_gradients(grads, cfg.distribution.sparse_as_dense, cfg.distribution.compression)
            # One all-reduce carries the loss and every rank's stop/save requests: a
            # request on any rank makes its average positive on all of them.
            averaged = dist.allreduce(tf.stack([loss, stop, save]), op="average", name="lmkit.train_loss")
            mean_loss, agreed = averaged[0], averaged[1:]
            new_state, healthy, applied = update(grads, mean_loss, state, new_state)
            return mean_loss, new_state, healthy, agreed, applied

        def replicated_step(x, y, state, stop, save):
            # Each local replica trains on its rows; the loss agrees on all of them.
            loss, new_state, healthy, agreed, applied = dist.run(train_step, (x, y, state, stop, save))
            return StepResult(dist.first(loss), new_state, dist.first(healthy), dist.first(agreed),
                              dist.first(applied))

        self._compiled = False
        self._flags = flag_tensors(feed_device()) if cfg.compute.device_prefetch else host_flags  # see lmkit.train.feed
        self._compiled_train_step = tf.function(replicated_step, jit_compile=self.xla and not split,
                                                reduce_retracing=True, autograph=autograph)
        self._evaluator = self.task.evaluator(cfg.data.eval_batch_size or cfg.data.batch_size,
                                              cfg.compute.precision, self.xla,
                                              self.attention_kernel)

    def _choose_compilation(self, device: str) -> None:
        """Sets how the step compiles on ``device``: ``xla``, ``autograph``, ``branch_free``, ``attention_kernel``."""
        cfg = self.config
        self.xla = use_xla(cfg.compute.jit_compile, device)
        # lmkit's own models trace without AutoGraph (3x faster to start); a user's keeps it.
        self.autograph = use_autograph(self.model)
        # Whether a non-finite step is skipped without a branch. On a GPU a tf.cond's
        # predicate is copied to the host, which then waits for the device every step;
        # on a CPU the host is the device and the branch skips the update's work, where
        # selecting each write costs ~3 small ops per variable (the update of the tiny
        # transformer took 8.7 ms instead of 3.0 on 2 cores). Under XLA a branch stays
        # on the device and selects fuse into the update: either is fine, selects it is.
        self.branch_free = self.xla or device == "GPU"
        # The kernel of causal attention (TrainConfig.attention_kernel): chosen while tracing.
        self.attention_kernel = attention_kernels.resolve(
            cfg.compute.attention_kernel, device_type=device, xla=self.xla, precision=cfg.compute.precision,
            log=self.log)

    def _local_gradients_fn(self, variables: List[tf.Variable]) -> Callable[..., Any]:
        """``(x, y, state) -> (loss, gradients, new_state)`` of this replica (k micro-batches, not averaged)."""
        cfg, task, loss_scale, kernel = self.config, self.task, self.loss_scale, self.attention_kernel

        def forward(x, y, state):
            loss, new_state = task.loss(x, y, state, training=True)  # float32 under every precision
            return loss, (loss if loss_scale is None else loss_scale.scale_loss(loss)), new_state

        def micro_step(x, y, state):  # one micro-batch's local (not yet averaged) gradients
            with tf.GradientTape() as tape:
                loss, scaled, new_state = forward(x, y, state)
            return loss, tape.gradient(scaled, variables), new_state

        def local_gradients(x, y, state):
            with precision.scope(cfg.compute.precision), \
                    attention_kernels.scope(kernel):  # this trace's dtype and kernel
                return accumulate_gradients(micro_step, x, y, state, cfg.optimization.grad_accum_steps,
                                            cfg.distribution.sparse_as_dense)

        return local_gradients

    def _update_fn(self, variables: List[tf.Variable]) -> Callable[..., Any]:
        """``(grads, mean_loss, state, new_state) -> (new_state, healthy, applied)``: everything after the
        averaging, the same on every replica (no collective)."""
        cfg, opt, progress, policy = self.config, self.optimizer, self.progress, self.policy
        loss_scale, branch_free = self.loss_scale, self.branch_free

        def update(grads, mean_loss, state, new_state):
            if loss_scale is not None:
                grads = loss_scale.unscale(grads)
                # A skipped step keeps a non-finite state out of the next window.
                if new_state is not None:
                    new_state = tf.nest.map_structure(
                        lambda new, old: tf.where(tf.math.is_finite(new), new, old), new_state, state)
            # Clipping after the averaging: every rank applies the same update.
            # IndexedSlices stay sparse, also for the norm when clipping is off.
            grads, norm = clip_gradients(grads, cfg.optimization.max_grad_norm,
                                         cfg.optimization.max_grad_norm_per_layer)
            # The norm of the averaged gradients is the same on every rank (an Inf or
            # NaN anywhere makes it non-finite): so is this decision.
            finite = tf.math.logical_and(tf.math.is_finite(mean_loss), tf.math.is_finite(norm))
            opt.learning_rate.assign(policy(progress.global_step))
            # A non-finite step is not applied; without loss scaling the host stops training,
            # with it the scale halves and training goes on (for a while).
            if branch_free:
                opt.apply_gradients(zip(grads, variables), apply_if=finite)
            else:
                def apply():
                    opt.apply_gradients(zip(grads, variables))
                    return tf.constant(True)

                tf.cond(finite, apply, lambda: tf.constant(False))
            healthy = finite if loss_scale is None else loss_scale.update(finite)
            progress.global_step.assign_add(1)
            return new_state, healthy, finite

        return update

    def train_step(self, inputs: Any, targets: Any, state: Any, stop: float = 0.0,
                   save: float = 0.0) -> "StepResult":
        """One compiled, averaged, clipped optimizer step on this process's rows.

        Args:
          inputs: int32 [local_batch, num_steps] (this process's rows); for pairs the
            nest ``(source, source_mask, target_inputs)`` of :class:`~lmkit.data.paired.PairBatches`.
          targets: int32, the same shape; for pairs ``(target_outputs, weights)``.
          state: the carried model state from :meth:`initial_state` or the
            previous step.
          stop: 1.0 when this rank asks every rank to stop (a preemption signal).
          save: 1.0 when this rank asks for a checkpoint (rank 0's clock).

        Returns:
          A :class:`StepResult`: the loss averaged over the ranks, the new
          state, whether training can go on (False after a non-finite step,
          or with ``mixed_float16`` after ``max_consecutive_skips`` of them),
          the ranks' agreed ``[stop, save]`` (> 0: some rank asked) and
          whether the update was applied (a non-finite one is not).

        Raises:
          RuntimeError: before :meth:`build` (or :meth:`fit`).
        """
        if self._compiled_train_step is None:
            raise RuntimeError("call fit() or build() before train_step()")
        return self._compiled_train_step(inputs, targets, state, *self._flags(stop, save))

    def initial_state(self, batch: Optional[int] = None) -> Any:
        """The state an epoch starts from, one per local replica (None for stateless models).

        Args:
          batch: rows per replica; default ``local_batch`` (training).
        """
        rows = batch or self.local_batch
        return dist.per_replica(lambda: self._model_state(rows))

    def _model_state(self, batch: int) -> Any:
        return self.model.initial_state(batch) if getattr(self.model, "stateful", False) else None

    # ----------------------------------------------------------------- evaluation
    def evaluate_loss(self, ids: Any) -> float:
        """Mean loss per token of ``ids`` (or of pairs) on this process alone (no collective: rank 0 only)."""
        if self._evaluator is None:
            raise RuntimeError("call fit() or build() first")
        return self._evaluator.mean_loss(ids, lambda: self._watchdog.beat("an evaluation batch finished"))

    def evaluate(self, ids: Any) -> float:
        """Perplexity per token of ``ids`` on this process alone (rank 0 only)."""
        return perplexity(self.evaluate_loss(ids))

    # ----------------------------------------------------------------- training
    def fit(self, train_ids: Any, valid_ids: Optional[Any] = None,
            test_ids: Optional[Any] = None, max_steps: Optional[int] = None,
            num_epochs: Optional[int] = None,
            words: Optional[Mapping[str, int]] = None) -> TrainResult:
        """Trains for the config's plan (epochs, steps or tokens; or until ``max_steps``), evaluating on rank 0.

        A stateful model (an RNN) reads the stream as BPTT rows, in order, its
        state carried from window to window; a stateless one (a transformer)
        reads fixed-length windows in a new order every epoch
        (:func:`lmkit.data.window_arrays`, seeded by ``config.seed``). An
        encoder-decoder reads :class:`~lmkit.data.paired.Pairs` in
        length-bucketed batches, in a new order every epoch.

        Args:
          train_ids: the training id stream (every rank passes the whole
            stream; each takes its rows), or an encoder-decoder's pairs.
          valid_ids: evaluated by rank 0 after every epoch.
          test_ids: evaluated by rank 0 at the end.
          max_steps: stop after this many global steps (before the plan's end; the
            schedule stays the plan's); the state at the stop is saved as a checkpoint.
          num_epochs: overrides the epochs the plan goes through.
          words: whitespace-separated words of the ``"train"``, ``"valid"``
            and ``"test"`` texts, for perplexity per word (subword, char and
            byte data); None reports perplexity per token only.

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
        self._watchdog = Watchdog.from_env(self.rank, dist.size())
        try:
            return self._fit(train_ids, valid_ids, test_ids, max_steps, num_epochs, dict(words or {}))
        finally:
            self._watchdog.stop()

    def epoch_batches(self, ids: Any, epoch: int) -> Batches:
        """This process's batches of ``epoch``: ``len()`` steps, ``[i]`` gives ``(inputs, targets)``.

        Each batch is read from ``ids`` when asked for, so a memory-mapped
        stream is never loaded whole (:mod:`lmkit.train.tasks` makes them).

        Raises:
          UsageError: ``sampling = "random"`` for a model that carries a state.
        """
        return self.task.batches(ids, epoch)

    def epoch_arrays(self, ids: np.ndarray, epoch: int) -> Tuple[np.ndarray, np.ndarray]:
        """This process's ``(inputs, targets)`` of ``epoch``, each [steps, local rows, num_steps]."""
        batches = self.epoch_batches(ids, epoch)
        pairs = [batches[i] for i in range(len(batches))]
        return np.stack([x for x, _ in pairs]), np.stack([y for _, y in pairs])

    def _check_eval_data(self, **streams: Optional[Any]) -> None:
        """Evaluation data too small for one batch fails before training, on every rank."""
        self.task.check_eval_data(self.config.data.eval_batch_size or self.config.data.batch_size, **streams)

    def _fit(self, train_ids: Any, valid_ids: Optional[Any],
             test_ids: Optional[Any], max_steps: Optional[int],
             num_epochs: Optional[int], words: Dict[str, int]) -> TrainResult:
        cfg = self.config
        self.task.reset()
        self._diverging = 0  # steps in a row with a loss above the divergence bound
        self._check_eval_data(valid=valid_ids, test=test_ids)
        steps_per_epoch = len(self.epoch_batches(train_ids, 0))
        # A plan in steps (or tokens) runs the epochs its steps need and stops at its last step.
        epochs = num_epochs or cfg.epochs_to_run(steps_per_epoch)
        planned = cfg.planned_steps
        max_steps = planned if max_steps is None else min(max_steps, planned or max_steps)
        check_agreement(cfg, self.vocab, {"train_ids": int(len(train_ids)),
                                          "steps_per_epoch": steps_per_epoch})
        prepare_model_dir(self.model_dir, cfg, self.vocab)
        self.build(steps_per_epoch)
        result = TrainResult()
        self._checkpoints = Checkpointer(self._checkpoint_manager(), self.progress, self.world, self.log,
                                         self._watchdog.beat, self.loss_scale)
        result.resumed_from, position = self._checkpoints.restore(
            list(self._saved_model.variables) + list(self.optimizer.variables), self.initial_state(), cfg.run.seed)
        if result.resumed_from:
            epoch = int(self.progress.epoch.numpy())
            self.log(f"resumed from {result.resumed_from} (epoch {epoch}, step "
                     f"{int(self.progress.global_step.numpy())}"
                     + (f", {position.steps_in_epoch} steps into epoch {epoch + 1}" if position.steps_in_epoch
                        else "") + f") on {self.world} worker(s)")
        summaries = Summaries(os.path.join(self.model_dir, TENSORBOARD_DIR)
                              if self.chief and self.model_dir is not None else None)
        self._valid_sample, self._summaries, self._result = self._eval_sample(valid_ids), summaries, result
        start_epoch = int(self.progress.epoch.numpy())
        self._announce(steps_per_epoch, start_epoch, epochs)
        streams = {"train": train_ids, "valid": valid_ids, "test": test_ids}
        self._tokens_per_word = {k: len(streams[k]) / n for k, n in words.items()
                                 if streams.get(k) is not None and n}
        cumulative = 0.0
        trained = 0  # steps of this call; a usage error after the first one saves them
        with PreemptionWatcher(self.rank, cfg.checkpoints.preemption_grace_seconds) as watcher:
            # Several processes with device_prefetch read the flags they agreed on a thread, two steps late
            # (lmkit.train.resume): the read waits for the device, and the steps keep being started meanwhile.
            threaded = dist.size() > 1 and cfg.compute.device_prefetch > 0
            self._boundaries = Boundaries(watcher, cfg.checkpoints.checkpoint_every_steps,
                                          cfg.checkpoints.checkpoint_every_minutes,
                                          lag=2 if threaded else 1, background=threaded)
            try:
                for epoch in range(start_epoch, epochs):
                    batches = self.epoch_batches(train_ids, epoch)
                    run = self._run_epoch(epoch, epochs, batches, max_steps, result, position)
                    position = None  # only the first epoch resumes inside
                    trained += run.steps
                    cumulative += run.seconds
                    if run.steps == 0 and not run.preempted:
                        break
                    self._end_epoch(epoch, epochs, run, cumulative, valid_ids, summaries, result)
                    if run.preempted:
                        self._preempted(watcher, result)
                    if run.stopped:
                        break
            except UsageError:
                if trained:  # keep what was trained (rank 0 alone: no collective on this path)
                    result.checkpoint = self._checkpoints.save_on_chief({"stopped_by": "a usage error"})
                raise
            finally:
                self._boundaries.close()
        self._record_loss_scale(result)
        result.global_step = int(self.progress.global_step.numpy())
        if self.chief and test_ids is not None:
            loss = self.evaluate_loss(test_ids)
            result.test_perplexity = perplexity(loss)
            result.test_word_perplexity = self._word_perplexity(loss, "test")
            self.log(f"Test perplexity: {result.test_perplexity:.2f}"
                     + self._per_word_text(result.test_word_perplexity))
        self._write_results(result)
        self._leave_together()
        return result

    def _announce(self, steps_per_epoch: int, start_epoch: int, epochs: int) -> None:
        """Says what the run trains (rank 0) and sets up the step lines of a plan in steps."""
        cfg, planned = self.config, self.config.planned_steps
        self._step_lines = None if planned is None else StepLines(
            planned, cfg.run.log_every_steps, self.log, self.flops_per_token,
            self.peak_tflops * self.world if self.peak_tflops else None)
        accum = (f" = {cfg.optimization.grad_accum_steps} micro-batches of {self.micro_batch}"
                 if cfg.optimization.grad_accum_steps > 1 else "")
        self.log(f"training {type(self.model).__name__} on {self.world} worker(s): global batch "
                 f"{cfg.data.batch_size} ({self.local_batch} per worker{accum}) {self.task.batch_unit}, "
                 f"{steps_per_epoch} steps/epoch, "
                 + (f"epochs {start_epoch + 1}..{epochs}" if planned is None else
                    f"{planned} steps ({planned * cfg.tokens_per_step:,} tokens; {epochs} epoch(s))")
                 + ("" if cfg.compute.precision == "float32" else f", precision {cfg.compute.precision}"))

    def _leave_together(self) -> None:
        """Every rank returns from :meth:`fit` after rank 0's last evaluation and results.

        A rank that left while rank 0 still evaluated would stop answering the
        native backend's coordination service, which then reports it as
        failed on rank 0 (heartbeat timeouts, collectives aborted). The other
        ranks wait without their watchdog: rank 0's, beating at every
        evaluation batch, covers a long evaluation.
        """
        if dist.size() > 1:
            if not self.chief:
                self._watchdog.pause()
            dist.barrier()

    def _record_loss_scale(self, result: TrainResult) -> None:
        if self.loss_scale is not None:
            result.skipped_steps = int(self.loss_scale.skipped_steps.numpy())
            result.loss_scale = float(self.loss_scale.scale.numpy())

    def _write_results(self, result: TrainResult) -> None:
        if self.chief and self.model_dir is not None:
            summary = {"config": self.config.to_dict(), "world_size": self.world, **result.to_dict(),
                       "flops_per_token": self.flops_per_token, "peak_tflops": self.peak_tflops,
                       "peak_source": self.peak_source}
            atomic_write_text(os.path.join(self.model_dir, RESULTS_FILE),
                              json.dumps(summary, indent=2, sort_keys=True))

    def _preempted(self, watcher: PreemptionWatcher, result: TrainResult) -> None:
        """Every rank leaves after rank 0's checkpoint: the job can be rerun to continue."""
        # Every rank waits here for rank 0's save, so no rank's exit stops a save in progress.
        path = dist.broadcast_object(result.checkpoint, 0)
        watcher.stopped()
        self._record_loss_scale(result)
        result.global_step = int(self.progress.global_step.numpy())
        self._write_results(result)
        step_in_epoch = int(self.progress.steps_in_epoch.numpy())
        where = (f"step {result.global_step} (epoch {int(self.progress.epoch.numpy()) + 1}, "
                 f"{step_in_epoch} steps into it)" if step_in_epoch else
                 f"step {result.global_step} (the end of epoch {int(self.progress.epoch.numpy())})")
        signal_name = watcher.signal_name or "a signal on another rank"
        raise PreemptedError(f"stopped by {signal_name} at {where}; checkpoint {path}; "
                             "rerun the same command to continue from there")

    def _word_perplexity(self, mean_token_loss: float, split: str) -> Optional[float]:
        ratio = self._tokens_per_word.get(split)
        return None if ratio is None else perplexity(mean_token_loss * ratio)

    @staticmethod
    def _per_word_text(value: Optional[float]) -> str:
        return "" if value is None else f" (per word {value:.2f})"

    def _checkpoint_manager(self) -> Optional[CheckpointManager]:
        if self.model_dir is None:
            return None
        ckpt = tf.train.Checkpoint(model=self._saved_model, optimizer=self.optimizer, progress=self.progress)
        return CheckpointManager(os.path.join(self.model_dir, CHECKPOINT_DIR), ckpt,
                                 keep=self.config.checkpoints.keep_checkpoints)

    def _run_epoch(self, epoch: int, epochs: int, batches: Batches,
                   max_steps: Optional[int], result: TrainResult,
                   position: Optional[Position] = None) -> EpochRun:
        """Trains on one epoch's windows (or until ``max_steps`` or a stop); logs progress on rank 0.

        ``position`` resumes inside the epoch: its first steps are skipped
        and its carried state continues.
        """
        cfg = self.config
        steps_per_epoch = len(batches)
        tokens_per_step = self.task.tokens_per_step(batches)
        start = position.steps_in_epoch if position is not None else 0
        state = position.state if position is not None and position.state is not None else self.initial_state()
        lines = self._step_lines  # a plan in steps prints step lines instead of the epoch's bar
        bar = ProgressBar(steps_per_epoch, f"epoch {epoch + 1}/{epochs}", enabled=self.chief and lines is None,
                          every=cfg.run.log_every_steps)
        run = EpochRun(tokens_per_step=tokens_per_step)
        pending: List[Any] = []  # (loss, finite) tensors not yet read back
        step_count = int(self.progress.global_step.numpy())

        def drain(index: int) -> None:
            self._count_losses(self._drain(pending, epoch, index), run, result)

        t0 = time.perf_counter()
        feed = window_feed(batches, self.config.compute.device_prefetch)  # None without device_prefetch
        try:
            for i in range(start, steps_per_epoch):
                if max_steps is not None and step_count >= max_steps:
                    run.stopped = True
                    self.progress.steps_in_epoch.assign(i)
                    if pending:
                        drain(i - 1)
                    saved = self._checkpoints.save(state, {"stopped_by": "max_steps"})
                    result.checkpoint = saved or result.checkpoint
                    break
                if i == start and not self.chief:  # waits for rank 0's evaluation and save (watched there)
                    self._watchdog.pause()
                inputs, targets = feed.get(i) if feed else tf.nest.map_structure(tf.constant, batches[i])
                flags = self._boundaries.flags()
                out = self.train_step(inputs, targets, state, *flags)
                state = out.state
                self._watchdog.beat(step_count + 1)
                pending.append((out.loss, out.finite, out.applied))
                run.steps += 1
                step_count += 1
                if not self._compiled:  # the first call traces and compiles: not training speed
                    drain(i)
                    self._compiled_in(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    run.timed_from = run.steps
                # Reading values back costs a host sync: only every few steps.
                due = lines.due(step_count) if lines else len(pending) >= bar.every or i == steps_per_epoch - 1
                if due or self.record_step_losses:
                    drain(i)
                    self._show_progress(bar, run, i + 1, step_count, time.perf_counter() - t0, due)
                # One process agrees with itself: its own flags, read without waiting for the device. (Reading
                # out.agreed waits for every step queued, this one included: the GPU would idle each step while
                # the host starts the next.) Several processes read the flags they averaged in the step (with
                # device_prefetch on a thread of their own, decided two steps later).
                actions = self._boundaries.after_step(out.agreed if dist.size() > 1 else flags, step_count)
                if actions:
                    if pending:
                        drain(i)
                    self._act(actions, i + 1, steps_per_epoch, state, run, result)
                    if run.preempted:
                        run.stopped = True
                        break
                if cfg.run.eval_every_steps and step_count % cfg.run.eval_every_steps == 0:
                    self._evaluate_at(step_count, lambda: drain(i) if pending else None)
            else:
                # The last step's flags: no step follows.
                self._act(self._boundaries.flush(), steps_per_epoch, steps_per_epoch, state, run, result)
        finally:
            if feed:
                feed.close()
        if pending:
            drain(run.steps - 1)
        bar.close()
        run.seconds = time.perf_counter() - t0
        return run

    def _count_losses(self, values: List[Optional[float]], run: EpochRun, result: TrainResult) -> None:
        """Adds the losses read back (None: a skipped, non-finite step) to the epoch's sums."""
        if self.record_step_losses:  # NaN marks a skipped step
            result.step_losses.extend(math.nan if v is None else v for v in values)
        applied = [v for v in values if v is not None]
        if self._step_lines is not None:
            self._step_lines.add(sum(applied) / self.task.loss_tokens, len(applied))
        run.skipped += len(values) - len(applied)
        run.loss_sum += sum(applied)

    def _show_progress(self, bar: ProgressBar, run: EpochRun, done_in_epoch: int, step: int, seconds: float,
                       due: bool) -> None:
        """The epoch's progress bar, or in a plan in steps the step line when ``due`` (rank 0 prints)."""
        timed = run.steps - run.timed_from
        tokens_per_sec = run.tokens_per_step * timed / max(seconds, 1e-9)
        if self._step_lines is None:
            bar.update(done_in_epoch, f"ppl {perplexity(run.token_loss(self.task.loss_tokens)):.2f} "
                       f"{tokens_per_sec:.0f} tokens/s")
        elif due:
            self._step_lines.show(step, float(self.optimizer.learning_rate.numpy()), tokens_per_sec,
                                  timed / max(seconds, 1e-9))

    def _eval_sample(self, ids: Any) -> Any:
        """What the evaluations every ``eval_every_steps`` read: the first ``eval_steps`` batches (0: all)."""
        batches = self.config.run.eval_steps
        if ids is None or not batches:
            return ids
        return self.task.eval_sample(ids, batches, self.config.data.eval_batch_size or self.config.data.batch_size)

    def _evaluate_at(self, step: int, drain: Callable[[], None]) -> None:
        """Rank 0 evaluates the validation sample after global step ``step`` and logs it; the other ranks go on
        to the next step's collective, where they wait for it (their watchdog paused: rank 0's beats).

        ``drain`` reads the steps not yet read back first, so their lines come before this one."""
        if self._valid_sample is None:
            return
        drain()
        if not self.chief:
            self._watchdog.pause()
            return
        loss = self.evaluate_loss(self._valid_sample)
        self._result.validations.append({"step": step, "valid_loss": loss, "valid_perplexity": perplexity(loss)})
        total = self.config.planned_steps
        self.log(f"step {step}{'' if total is None else f'/{total}'} | val loss {loss:.4f} | "
                 f"val ppl {perplexity(loss):.2f}")
        self._summaries.write(step, {"valid/loss": loss, "valid/perplexity": perplexity(loss)})

    def _compiled_in(self, seconds: float) -> None:
        """Notes that the first step traced and compiled in ``seconds`` (not training speed) and says so."""
        self.compile_time = seconds
        self._compiled = True
        kernel = "" if self.attention_kernel == "matmul" else f" ({self.attention_kernel} attention)"
        self.log(f"compiled the training step{' with XLA' if self.xla else ''}{kernel} in {seconds:.1f} s")
        for line in attention_kernels.declined(self.attention_kernel):
            self.log(line)

    def _act(self, actions: List[str], done_in_epoch: int, steps_per_epoch: int, state: Any, run: EpochRun,
             result: TrainResult) -> None:
        """Carries out what the ranks agreed after a step (``"stop"``, ``"save"``): inside an epoch, a checkpoint
        of ``state``; at its end, :meth:`_end_epoch` saves."""
        stopping = "stop" in actions
        run.preempted = run.preempted or stopping
        run.save_at_end = bool(actions) and done_in_epoch == steps_per_epoch
        if actions and done_in_epoch < steps_per_epoch:
            self.progress.steps_in_epoch.assign(done_in_epoch)
            result.checkpoint = self._checkpoints.save(state, {"stopped_by": "preemption"} if stopping
                                                       else {"saved_by": "schedule"}) or result.checkpoint
            self._boundaries.saved()

    def _end_epoch(self, epoch: int, epochs: int, run: EpochRun, cumulative: float,
                   valid_ids: Optional[Any], summaries: Summaries, result: TrainResult) -> None:
        """Every rank takes part in the epoch's checkpoint; rank 0 evaluates, logs and writes summaries.

        A checkpoint follows every ``checkpoint_every_epochs`` epochs, the last
        epoch, and a preemption at the epoch's end (stops inside an epoch
        saved their own in :meth:`_run_epoch`).
        """
        cfg = self.config
        lr = float(self.optimizer.learning_rate.numpy())
        train_loss = run.token_loss(self.task.loss_tokens)
        completed = not run.stopped
        if completed:
            self.progress.epoch.assign(epoch + 1)
            self.progress.steps_in_epoch.assign(0)
        tokens = run.tokens_per_step * (run.steps - run.timed_from)
        every = cfg.checkpoints.checkpoint_every_epochs
        due = epoch + 1 == epochs or (every > 0 and (epoch + 1) % every == 0) or run.save_at_end
        if completed and due:  # before rank 0's evaluation: the save gathers from every rank
            result.checkpoint = self._checkpoints.save(
                None, {"train_perplexity": perplexity(train_loss),
                       **({"stopped_by": "preemption"} if run.preempted else {})}) or result.checkpoint
            self._boundaries.saved()
        valid_loss = None
        # Rank 0 only: no collective here. A preemption leaves the evaluation to the rerun.
        if self.chief and valid_ids is not None and run.steps and not run.preempted:
            valid_loss = self.evaluate_loss(valid_ids)
        stats = EpochStats(
            epoch=epoch + 1, train_perplexity=perplexity(train_loss),
            valid_perplexity=None if valid_loss is None else perplexity(valid_loss),
            learning_rate=lr, tokens_per_sec=tokens / max(run.seconds, 1e-9), epoch_time=run.seconds,
            cumulative_time=cumulative, steps=run.steps,
            train_word_perplexity=self._word_perplexity(train_loss, "train"),
            valid_word_perplexity=None if valid_loss is None else self._word_perplexity(valid_loss, "valid"),
            skipped_steps=run.skipped,
            loss_scale=None if self.loss_scale is None else float(self.loss_scale.scale.numpy()))
        if self.flops_per_token is not None and run.steps > run.timed_from:
            stats.model_tflops = stats.tokens_per_sec * self.flops_per_token / 1e12
            if self.peak_tflops:
                stats.mfu = stats.model_tflops / (self.peak_tflops * self.world)
        result.epochs.append(stats)
        valid_text = "-" if stats.valid_perplexity is None else f"{stats.valid_perplexity:.2f}"
        scaling = ("" if stats.loss_scale is None else
                   f" | loss scale {stats.loss_scale:g}, {run.skipped} step(s) skipped")
        if stats.model_tflops is not None:
            scaling += f" | model {stats.model_tflops:.3g} TFLOP/s" + (
                "" if stats.mfu is None else f", MFU {100 * stats.mfu:.1f}%")
        self.log(f"Epoch {epoch + 1}/{epochs}: lr {lr:.4g} | train ppl {stats.train_perplexity:.2f}"
                 f"{self._per_word_text(stats.train_word_perplexity)} | valid ppl {valid_text}"
                 f"{self._per_word_text(stats.valid_word_perplexity)} | {stats.tokens_per_sec:.0f} "
                 f"tokens/sec ({self.world} worker(s)) | epoch time {run.seconds:.1f} s | "
                 f"cumulative training time {cumulative:.1f} s{scaling}")
        summaries.write(int(self.progress.global_step.numpy()),
                        {"train/perplexity": stats.train_perplexity, "train/learning_rate": lr,
                         "train/tokens_per_sec": stats.tokens_per_sec,
                         "train/word_perplexity": stats.train_word_perplexity,
                         "valid/perplexity": stats.valid_perplexity,
                         "valid/word_perplexity": stats.valid_word_perplexity})

    def _divergence_bound(self) -> float:
        """The loss above which a step counts towards divergence (inf: the check is off)."""
        cfg = self.config
        factor = cfg.run.divergence_factor
        return factor * math.log(max(cfg.model["vocab_size"], 2)) if factor > 0 else math.inf

    def _drain(self, pending: List[Any], epoch: int, last_index: int) -> List[Optional[float]]:
        """Reads the pending step results (None for a skipped step); raises when training cannot go on.

        The losses are the ranks' average, so every rank raises at the same step.
        """
        values: List[Optional[float]] = []
        bound = self._divergence_bound()
        per_token = self.task.loss_tokens  # a step's loss over this is per token
        for k, (loss, finite, applied) in enumerate(pending):
            value = float(loss)
            if bool(applied) and math.isfinite(value):  # a window's loss sums its num_steps positions
                self._diverging = self._diverging + 1 if value / per_token > bound else 0
                if self._diverging >= self.config.run.divergence_steps:
                    step_in_epoch = last_index - len(pending) + 1 + k
                    pending.clear()
                    raise NonFiniteError(
                        f"the loss diverged: {self._diverging} steps in a row above {bound:.2f} per token "
                        f"(divergence_factor {self.config.run.divergence_factor:g} x ln(vocab_size "
                        f"{self.config.model['vocab_size']}); a uniform guess scores "
                        f"{bound / self.config.run.divergence_factor:.2f}), "
                        f"the last {value / per_token:.4g}, at epoch {epoch + 1}, step {step_in_epoch + 1}; training "
                        "stopped and the last good checkpoint stays the latest. Lower the learning rate or "
                        "max_grad_norm, or check the data (divergence_factor = 0 turns this check off)")
            if not bool(finite) or (bool(applied) and not math.isfinite(value)):
                step_in_epoch = last_index - len(pending) + 1 + k
                pending.clear()
                where = f"at epoch {epoch + 1}, step {step_in_epoch + 1}"
                if self.loss_scale is not None:
                    raise NonFiniteError(
                        f"{self.loss_scale.max_consecutive_skips} steps in a row had non-finite gradients "
                        f"(loss {value}) {where}, although the loss scale fell to "
                        f"{float(self.loss_scale.scale.numpy()):g}; none was applied and the last good "
                        "checkpoint stays the latest. Lower the learning rate or max_grad_norm, check "
                        "the data, or train with precision = 'mixed_bfloat16' or 'float32'")
                raise NonFiniteError(
                    f"non-finite loss or gradient (loss {value}) {where}; the update was not applied and "
                    "the last good checkpoint stays the latest. Lower the learning rate or max_grad_norm, "
                    "or check the data")
            values.append(value if bool(applied) else None)
        pending.clear()
        return values
