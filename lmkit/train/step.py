"""The compiled steps of a run: one training step (forward, loss, averaged gradients, clipping, the update) and
the evaluation step.

The training step is the only place where the ranks talk during training:

* each replica computes its gradients (with ``grad_accum_steps`` = k, the
  mean of k micro-batches: :mod:`lmkit.train.accumulation`), they are
  averaged over the replicas once (``dist.average_gradients``), then
  clipped, so every rank applies the same update;
* one all-reduce carries the loss and every rank's requests, the flags
  ``[stop, save, end]`` (:data:`FLAGS`): a request on any rank makes its
  average positive on all of them, so the ranks agree at the same step
  (:class:`lmkit.train.resume.Boundaries` decides on them);
* the steps are XLA-compiled where that is faster (``jit_compile = "auto"``:
  on GPUs; :mod:`lmkit.core.xla`); with several replicas the gradients and the
  update are compiled apart and the collectives run between them;
* a non-finite step is not applied; on GPUs and under XLA that is decided
  on the device without a branch (``Optimizer.apply_gradients(apply_if=...)``),
  so the host never waits for the GPU inside a step;
* the arithmetic runs in ``compute.precision`` (:mod:`lmkit.layers.precision`);
  ``mixed_float16`` scales the loss (:mod:`lmkit.train.loss_scale`) and
  skips a step whose averaged gradients overflowed, on every rank alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional

import tensorflow as tf

from lmkit import distributed as dist
from lmkit.core.xla import use_autograph, use_xla
from lmkit.layers import kernels as attention_kernels
from lmkit.layers import precision
from lmkit.optim import clip_gradients
from lmkit.train.accumulation import accumulate_gradients
from lmkit.train.feed import feed_device, flag_tensors, host_flags
from lmkit.train.records import StepResult

__all__ = ["FLAGS", "Compilation", "TrainStep", "choose_compilation", "local_gradients_fn", "update_fn"]

#: The requests a step's all-reduce carries, in order: stop for a preemption, save a checkpoint, end the run.
FLAGS = ("stop", "save", "end")


@dataclass(frozen=True)
class Compilation:
    """How a run's steps compile on its device.

    Attributes:
      xla: the steps are XLA-compiled (``compute.jit_compile``, :func:`lmkit.core.xla.use_xla`).
      autograph: the steps trace with AutoGraph (a user's model; lmkit's own trace without it).
      branch_free: a non-finite step is skipped without a ``tf.cond``.
      attention_kernel: the kernel of causal attention (:func:`lmkit.layers.kernels.resolve`).
    """

    xla: bool = False
    autograph: bool = True
    branch_free: bool = False
    attention_kernel: str = "matmul"


def choose_compilation(config: Any, model: Any, device: str, log: Callable[[str], None]) -> Compilation:
    """How the steps of ``model`` compile on ``device`` (``"CPU"``, ``"GPU"``) under ``config``'s ``compute``."""
    compute = config.compute
    xla = use_xla(compute.jit_compile, device)
    # Whether a non-finite step is skipped without a branch. On a GPU a tf.cond's
    # predicate is copied to the host, which then waits for the device every step;
    # on a CPU the host is the device and the branch skips the update's work, where
    # selecting each write costs ~3 small ops per variable (the update of the tiny
    # transformer took 8.7 ms instead of 3.0 on 2 cores). Under XLA a branch stays
    # on the device and selects fuse into the update: either is fine, selects it is.
    kernel = attention_kernels.resolve(compute.attention_kernel, device_type=device, xla=xla,
                                       precision=compute.precision, log=log)
    # lmkit's own models trace without AutoGraph (3x faster to start); a user's keeps it.
    return Compilation(xla=xla, autograph=use_autograph(model), branch_free=xla or device == "GPU",
                       attention_kernel=kernel)


def local_gradients_fn(task: Any, config: Any, kernel: str, variables: List[tf.Variable],
                       loss_scale: Any = None) -> Callable[..., Any]:
    """``(x, y, state) -> (loss, gradients, new_state)`` of this replica (k micro-batches, not averaged)."""
    compute, accum_steps = config.compute, config.optimization.grad_accum_steps
    sparse_as_dense = config.distribution.sparse_as_dense

    def forward(x, y, state):
        loss, new_state = task.loss(x, y, state, training=True)  # float32 under every precision
        return loss, (loss if loss_scale is None else loss_scale.scale_loss(loss)), new_state

    def micro_step(x, y, state):  # one micro-batch's local (not yet averaged) gradients
        with tf.GradientTape() as tape:
            loss, scaled, new_state = forward(x, y, state)
        return loss, tape.gradient(scaled, variables), new_state

    def local_gradients(x, y, state):
        with precision.scope(compute.precision), attention_kernels.scope(kernel):  # this trace's dtype and kernel
            return accumulate_gradients(micro_step, x, y, state, accum_steps, sparse_as_dense)

    return local_gradients


def update_fn(optimizer: Any, progress: Any, policy: Any, config: Any, variables: List[tf.Variable],
              branch_free: bool, loss_scale: Any = None) -> Callable[..., Any]:
    """``(grads, mean_loss, state, new_state) -> (new_state, healthy, applied)``: everything after the
    averaging, the same on every replica (no collective)."""
    opt_config = config.optimization

    def apply(grads, finite):
        # A non-finite step is not applied; without loss scaling the host stops training,
        # with it the scale halves and training goes on (for a while).
        if branch_free:
            optimizer.apply_gradients(zip(grads, variables), apply_if=finite)
            return

        def applied():
            optimizer.apply_gradients(zip(grads, variables))
            return tf.constant(True)

        tf.cond(finite, applied, lambda: tf.constant(False))

    def update(grads, mean_loss, state, new_state):
        if loss_scale is not None:
            grads = loss_scale.unscale(grads)
            # A skipped step keeps a non-finite state out of the next window.
            if new_state is not None:
                new_state = tf.nest.map_structure(
                    lambda new, old: tf.where(tf.math.is_finite(new), new, old), new_state, state)
        # Clipping after the averaging: every rank applies the same update.
        # IndexedSlices stay sparse, also for the norm when clipping is off.
        grads, norm = clip_gradients(grads, opt_config.max_grad_norm, opt_config.max_grad_norm_per_layer)
        # The norm of the averaged gradients is the same on every rank (an Inf or
        # NaN anywhere makes it non-finite): so is this decision.
        finite = tf.math.logical_and(tf.math.is_finite(mean_loss), tf.math.is_finite(norm))
        optimizer.learning_rate.assign(policy(progress.global_step))
        apply(grads, finite)
        healthy = finite if loss_scale is None else loss_scale.update(finite)
        progress.global_step.assign_add(1)
        return new_state, healthy, finite

    return update


class TrainStep:
    """The compiled training step of a run: ``step(inputs, targets, state, stop, save, end) -> StepResult``.

    Building it traces nothing; the first call traces (and compiles) it.

    Args:
      task: the run's task (:mod:`lmkit.train.tasks`): its ``loss`` is the forward pass.
      optimizer: an ``lmkit.optim`` optimizer, built (its slots exist).
      progress: the run's counters (:class:`~lmkit.train.records.Progress`); the step counts ``global_step``.
      policy: the learning-rate policy, ``global_step -> learning rate``.
      config: the run's config (``optimization``, ``compute``, ``distribution``).
      compilation: how the step compiles (:func:`choose_compilation`).
      loss_scale: the ``mixed_float16`` loss scale, or None.
    """

    def __init__(self, task: Any, optimizer: Any, progress: Any, policy: Any, config: Any,
                 compilation: Compilation, loss_scale: Any = None) -> None:
        variables = list(task.model.trainable_variables)
        comp, distribution = compilation, config.distribution
        # With more than one replica the collectives stay outside XLA (Horovod's cannot be
        # compiled): the replica's gradients and the update are compiled apart.
        split = comp.xla and dist.num_replicas() > 1
        local_gradients = local_gradients_fn(task, config, comp.attention_kernel, variables, loss_scale)
        update = update_fn(optimizer, progress, policy, config, variables, comp.branch_free, loss_scale)
        # Pairs come in a few padded lengths: one trace serves them all (XLA compiles each shape).
        if split:
            local_gradients = tf.function(local_gradients, jit_compile=True, reduce_retracing=True,
                                          autograph=comp.autograph)
            update = tf.function(update, jit_compile=True, autograph=comp.autograph)

        def train_step(x, y, state, stop, save, end):
            loss, grads, new_state = local_gradients(x, y, state)
            # Averaging over replicas (allreduce / allgather): one round per optimizer step.
            grads = dist.average_gradients(grads, distribution.sparse_as_dense, distribution.compression)
            # DIST: one all-reduce carries the loss and every rank's requests ([stop, save, end]): a
            # request on any rank makes its average positive on all of them, at the same step.
            averaged = dist.allreduce(tf.stack([loss, stop, save, end]), op="average", name="lmkit.train_loss")
            mean_loss, agreed = averaged[0], averaged[1:]
            new_state, healthy, applied = update(grads, mean_loss, state, new_state)
            return mean_loss, new_state, healthy, agreed, applied

        def replicated_step(x, y, state, stop, save, end):
            # Each local replica trains on its rows; the loss agrees on all of them.
            loss, new_state, healthy, agreed, applied = dist.run(train_step, (x, y, state, stop, save, end))
            return StepResult(dist.first(loss), new_state, dist.first(healthy), dist.first(agreed),
                              dist.first(applied))

        self.compilation = compilation
        #: The ``tf.function`` itself: ``(inputs, targets, state, stop, save, end)``, the flags float32 scalars.
        self.function = tf.function(replicated_step, jit_compile=comp.xla and not split, reduce_retracing=True,
                                    autograph=comp.autograph)
        # Where the flags are made (lmkit.train.feed): on the step's device with device_prefetch.
        self.flags = flag_tensors(feed_device()) if config.compute.device_prefetch else host_flags

    def __call__(self, inputs: Any, targets: Any, state: Any, stop: float = 0.0, save: float = 0.0,
                 end: float = 0.0) -> StepResult:
        return self.function(inputs, targets, state, *self.flags(stop, save, end))


def eval_batch_size(config: Any) -> int:
    """The rows an evaluation reads side by side: ``eval_batch_size``, else the training batch."""
    return config.data.eval_batch_size or config.data.batch_size


def evaluator_for(task: Any, config: Any, compilation: Optional[Compilation] = None) -> Any:
    """The compiled evaluation step of ``task`` (:mod:`lmkit.train.evaluation`), compiled as training is."""
    comp = compilation or Compilation()
    return task.evaluator(eval_batch_size(config), config.compute.precision, comp.xla, comp.attention_kernel)
