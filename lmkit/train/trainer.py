"""A distributed trainer for language models and encoder-decoders, in three parts a user can read and extend.

The same code runs in one process (``python examples/lm_ptb.py``) and on N
workers (``mpirun -np N lmkit train ...``):

* the global batch of ``data.batch_size`` rows is split across the workers;
  rank r trains on rows ``[r*B/N, (r+1)*B/N)`` of every batch (BPTT rows,
  windows, or source/target pairs: :mod:`lmkit.train.tasks` turns the data
  into batches and a batch into a loss);
* every variable of the model and the optimizer (slots included) is
  broadcast from rank 0 after start-up or a resume, so all ranks start equal;
* the compiled step (:mod:`lmkit.train.step`) averages the gradients over
  the replicas, clips them and applies the same update on every rank; all
  collective operations sit inside it, so every rank issues them in the
  same order;
* the loop (:mod:`lmkit.train.loop`) runs the epochs or steps, checkpoints,
  stops for a preemption, and stops a diverging run (:mod:`lmkit.train.health`);
* the reporting (:mod:`lmkit.train.reporting`) writes rank 0's log lines,
  TensorBoard summaries and ``results.json``;
* callbacks (:mod:`lmkit.train.callbacks`) see every step and evaluation
  and may stop the run or ask for a checkpoint, on any rank.

Rank 0 alone evaluates, logs and writes checkpoints; that path holds no
collective operation: the other ranks wait for the outcome of rank 0's
checkpoint write (one broadcast, ``Checkpointer.save``), or in the next
collective.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Optional, Tuple

import numpy as np
import tensorflow as tf

from lmkit import distributed as dist
from lmkit.config import TrainConfig
from lmkit.core.checks import check_divisible
from lmkit.data.batching import Batches
from lmkit.layers import precision
from lmkit.layers.lora import lora_of
from lmkit.optim import LearningRatePolicy, build_optimizer
from lmkit.train.accumulation import micro_batch_rows
from lmkit.train.callbacks import Callback, CallbackList
from lmkit.train.flops import device_peak_tflops, flops_per_token
from lmkit.train.loop import RunData, TrainingLoop
from lmkit.train.loss_scale import DynamicLossScale
from lmkit.train.metrics import perplexity
from lmkit.train.records import Progress, StepResult, TrainResult
from lmkit.train.reporting import Flops
from lmkit.train.step import Compilation, TrainStep, choose_compilation, evaluator_for
from lmkit.train.tasks import task_for
from lmkit.train.watchdog import Watchdog

__all__ = ["Trainer"]


class Trainer:
    """Trains a language model on id streams, or an encoder-decoder on source/target pairs.

    Its parts: the batches and the loss (:mod:`lmkit.train.tasks`), the
    compiled step (:class:`~lmkit.train.step.TrainStep`, :attr:`step`), the
    loop (:class:`~lmkit.train.loop.TrainingLoop`, :attr:`loop` after
    :meth:`fit`), the reporting (:class:`~lmkit.train.reporting.Reporter`)
    and the callbacks (:mod:`lmkit.train.callbacks`).

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
      resume: restore the latest checkpoint of ``model_dir`` when there is one
        (False: start from the model's values; the checkpoints still go there).
      lr_world_size: the number of workers the learning-rate scaling and
        warmup assume (default: the real number); lets one process reproduce
        the policy of N workers with the same global batch.
      callbacks: :class:`~lmkit.train.callbacks.Callback` objects, called in order
        (``on_step_end`` and ``on_train_end`` on every rank, ``on_eval_end`` on rank 0).

    Raises:
      UsageError: ``batch_size`` not divisible by the number of replicas
        times ``grad_accum_steps``, or an unknown ``precision``.
    """

    def __init__(self, model: tf.Module, config: TrainConfig, model_dir: Optional[str] = None,
                 vocab: Any = None, optimizer: Any = None, log: Optional[Callable[[str], None]] = None,
                 record_step_losses: bool = False, resume: bool = True, lr_world_size: Optional[int] = None,
                 callbacks: Optional[Iterable[Callback]] = None) -> None:
        self.model, self.config, self.model_dir, self.vocab = model, config, model_dir, vocab
        self.world = dist.num_replicas()  # data-parallel replicas (= processes with Horovod)
        self.rank, self.chief = dist.rank(), dist.is_chief()
        self._print = log or (lambda s: print(s, flush=True))
        self.record_step_losses, self.resume = record_step_losses, resume
        self.lr_world_size = lr_world_size or self.world
        batch_size, accum_steps = config.data.batch_size, config.optimization.grad_accum_steps
        self.local_batch = check_divisible("batch_size", batch_size, self.world, "workers")
        self.micro_batch = micro_batch_rows(batch_size, self.world, accum_steps)
        compute = config.compute
        with dist.scope():  # the native backend keeps one copy per replica
            self.optimizer = optimizer if optimizer is not None else build_optimizer(config)
            self.loss_scale: Optional[DynamicLossScale] = DynamicLossScale(
                compute.loss_scale, compute.loss_scale_growth_interval, compute.max_consecutive_skips
            ) if precision.get(compute.precision).loss_scaling else None
            # Dropout of lmkit modules draws from the global generator: make it a
            # checkpointed one, different on every rank (each rank sees other rows).
            self.progress = Progress(config.run.seed, self.rank)
        tf.random.set_global_generator(self.progress.rng)
        self.task = task_for(model, config, vocab, self.rank, dist.size())  # the data's batches and loss
        self.callbacks = CallbackList(callbacks)
        self.flops = Flops(flops_per_token(model, config.data.num_steps))  # the device's peak: build()
        self.compilation = Compilation()  # how the steps compile here: build()
        self.policy: Optional[LearningRatePolicy] = None
        self.step: Optional[TrainStep] = None
        self.evaluator: Any = None
        self.compile_time = 0.0  # seconds the first step took to trace and compile (fit)
        self.watchdog = Watchdog(self.rank, 0.0)  # armed by fit() when there are peers
        self.loop: Optional[TrainingLoop] = None  # the last fit's

    # The compiled step's settings and the model's FLOPs, as read before the parts were split.
    xla = property(lambda self: self.compilation.xla, doc="Whether the steps are XLA-compiled (build()).")
    autograph = property(lambda self: self.compilation.autograph, doc="Whether the steps trace with AutoGraph.")
    branch_free = property(lambda self: self.compilation.branch_free,
                           doc="Whether a non-finite step is skipped without a tf.cond (build()).")
    attention_kernel = property(lambda self: self.compilation.attention_kernel,
                                doc="compute.attention_kernel as resolved by build() (lmkit.layers.kernels).")
    flops_per_token = property(lambda self: self.flops.per_token, doc="Model FLOPs per token (None: seq2seq).")
    peak_tflops = property(lambda self: self.flops.peak_tflops, doc="One device's peak TFLOP/s (None: unknown).")

    @property
    def saved_model(self) -> tf.Module:
        """What the checkpoints hold of the model: the LoRA adapters alone (the base is its own folder), or
        all of it."""
        lora = lora_of(self.model)
        return self.model if lora is None else lora

    def log(self, text: str) -> None:
        """Prints ``text`` on rank 0."""
        if self.chief:
            self._print(text)

    # -------------------------------------------------------------- compiled steps
    def build(self, steps_per_epoch: int) -> None:
        """Creates the optimizer slots and the learning-rate policy, and builds the compiled steps.

        :meth:`fit` calls it; call it yourself only to drive :meth:`train_step`
        without ``fit`` (benchmarks).
        """
        cfg = self.config
        self.policy = LearningRatePolicy.from_config(cfg, world_size=self.lr_world_size,
                                                     steps_per_epoch=steps_per_epoch)
        with dist.scope():
            self.optimizer.build(list(self.model.trainable_variables))
        peak, source = device_peak_tflops(cfg.run.peak_tflops, cfg.compute.precision)
        self.flops = Flops(self.flops.per_token, peak, source)
        self.compilation = choose_compilation(cfg, self.model, dist.device_type(), self.log)
        self.step = TrainStep(self.task, self.optimizer, self.progress, self.policy, cfg, self.compilation,
                              self.loss_scale)
        self.evaluator = evaluator_for(self.task, cfg, self.compilation)

    def train_step(self, inputs: Any, targets: Any, state: Any, stop: float = 0.0, save: float = 0.0,
                   end: float = 0.0) -> StepResult:
        """One compiled, averaged, clipped optimizer step on this process's rows.

        Args:
          inputs: int32 [local_batch, num_steps] (this process's rows); for pairs the
            nest ``(source, source_mask, target_inputs)`` of :class:`~lmkit.data.paired.PairBatches`.
          targets: int32, the same shape; for pairs ``(target_outputs, weights)``.
          state: the carried model state from :meth:`initial_state` or the
            previous step.
          stop: 1.0 when this rank asks every rank to stop (a preemption signal).
          save: 1.0 when this rank asks for a checkpoint (rank 0's clock, a callback).
          end: 1.0 when this rank asks every rank to end the run (a callback).

        Returns:
          A :class:`StepResult`: the loss averaged over the ranks, the new
          state, whether training can go on (False after a non-finite step,
          or with ``mixed_float16`` after ``max_consecutive_skips`` of them),
          the ranks' agreed ``[stop, save, end]`` (> 0: some rank asked) and
          whether the update was applied (a non-finite one is not).

        Raises:
          RuntimeError: before :meth:`build` (or :meth:`fit`).
        """
        if self.step is None:
            raise RuntimeError("call fit() or build() before train_step()")
        return self.step(inputs, targets, state, stop, save, end)

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
        if self.evaluator is None:
            raise RuntimeError("call fit() or build() first")
        return self.evaluator.mean_loss(ids, lambda: self.watchdog.beat("an evaluation batch finished"))

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
        (:func:`lmkit.data.window_arrays`, seeded by ``run.seed``). An
        encoder-decoder reads :class:`~lmkit.data.paired.Pairs` in
        length-bucketed batches, in a new order every epoch.

        Args:
          train_ids: the training id stream (every rank passes the whole
            stream; each takes its rows), an encoder-decoder's pairs, or examples
            with loss weights (:class:`~lmkit.data.examples.ExampleSet`: conversations).
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
          PreemptedError: a preemption signal stopped the run (checkpoint written; exit status 75).
        """
        # With peers, a watchdog ends this process when training stops making
        # progress (LMKIT_COLLECTIVE_TIMEOUT), instead of waiting forever.
        self.watchdog = Watchdog.from_env(self.rank, dist.size())
        self.use_data(train_ids)
        self.loop = TrainingLoop(self, self.callbacks)
        try:
            return self.loop.run(RunData(train_ids, valid_ids, test_ids, dict(words or {})), max_steps, num_epochs)
        finally:
            self.watchdog.stop()

    def use_data(self, train: Any) -> None:
        """Picks the task of the training data: examples with loss weights (an
        :class:`~lmkit.data.examples.ExampleSet`) train per weighted token
        (:class:`~lmkit.train.tasks.WeightedExamples`). :meth:`fit` calls it; call it before :meth:`build`
        to drive :meth:`train_step` on such data yourself."""
        task = task_for(self.model, self.config, self.vocab, self.rank, dist.size(), train)
        if type(task) is not type(self.task):
            self.task = task

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
                self.watchdog.pause()
            dist.barrier()  # DIST
