"""Gradient accumulation: one optimizer step from k micro-batches, communicated once.

With ``grad_accum_steps = k`` each replica splits its rows of a step's batch
into k blocks of consecutive rows (the micro-batches) and runs them one after
the other; the step's gradient is the mean of the k micro-batch gradients,
which is the gradient of the whole batch (the loss averages over rows), so
k = 4 on 1 worker trains like k = 1 with the same global batch, up to
float32 rounding (``tests/train/test_accumulation.py``). Only the mean is
averaged over the workers: one round of communication per optimizer step,
whatever k. A recurrent model's state stays with its rows: block j starts
from the state block j ended the previous window with.

The micro-batches run in a ``tf.while_loop`` with ``parallel_iterations=1``,
so only one micro-batch's activations are alive at a time (the point of
accumulating on a device that cannot hold the whole batch). Dense gradients
are summed in place; the sparse gradient of an embedding lookup
(``tf.IndexedSlices``) keeps the rows of every micro-batch, concatenated, as
one big batch would give them (``sparse_as_dense`` sums them densely
instead).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import tensorflow as tf

from lmkit.core.errors import UsageError

__all__ = ["accumulate_gradients", "micro_batch_rows"]

# (inputs, targets, state) -> (loss, gradients, new state) of one micro-batch
MicroStep = Callable[[tf.Tensor, tf.Tensor, Any], Tuple[tf.Tensor, List[Any], Any]]


def micro_batch_rows(batch_size: int, replicas: int, grad_accum_steps: int) -> int:
    """Rows of one micro-batch: ``batch_size / (replicas * grad_accum_steps)``.

    Raises:
      UsageError: the split is not whole (the message names a batch size that works).
    """
    parts = replicas * grad_accum_steps
    if batch_size % parts:
        lower, upper = (batch_size // parts) * parts, (batch_size // parts + 1) * parts
        nearest = f"{lower} or {upper}" if lower else f"{upper}"
        raise UsageError(
            f"batch_size {batch_size} does not split into {replicas} worker(s) x grad_accum_steps "
            f"{grad_accum_steps} = {parts} equal micro-batches; use a batch_size that is a multiple of "
            f"{parts} (e.g. {nearest}) or another grad_accum_steps")
    return batch_size // parts


def _blocks(t: tf.Tensor, k: int) -> tf.Tensor:
    """[k * m, ...] -> [k, m, ...] (block j = rows j*m .. (j+1)*m - 1)."""
    shape = t.shape.as_list()
    rows = shape[0] if shape[0] is not None else tf.shape(t)[0]
    rest = [d if d is not None else tf.shape(t)[i + 1] for i, d in enumerate(shape[1:])]
    return tf.reshape(t, [k, rows // k] + rest)


def _unblock(t: tf.Tensor) -> tf.Tensor:
    """[k, m, ...] -> [k * m, ...]."""
    shape = t.shape.as_list()
    dims = [d if d is not None else tf.shape(t)[i] for i, d in enumerate(shape)]
    first = dims[0] * dims[1]
    return tf.reshape(t, [first] + dims[2:])


def accumulate_gradients(micro_step: MicroStep, inputs: tf.Tensor, targets: tf.Tensor, state: Any,
                         steps: int, sparse_as_dense: bool = False) -> Tuple[tf.Tensor, List[Any], Any]:
    """The mean loss and gradients of ``steps`` micro-batches, and the new state of every row.

    Args:
      micro_step: computes one micro-batch's loss, (local) gradients and new state.
      inputs: int32 [rows, time]; ``rows`` a multiple of ``steps``; or a nest of
        [rows, ...] tensors (an encoder-decoder's source, mask and target inputs).
      targets: the same shape (or a nest of [rows, ...] tensors).
      state: the carried state of all the rows (a nest of [rows, ...]), or None.
      steps: the number of micro-batches k (1 calls ``micro_step`` once).
      sparse_as_dense: sum ``IndexedSlices`` gradients densely.

    Returns:
      ``(mean loss, mean gradients, new state of all rows)``; gradients keep
      ``micro_step``'s order, None entries included.
    """
    if steps == 1:
        return micro_step(inputs, targets, state)
    xs, ys = (tf.nest.map_structure(lambda t: _blocks(t, steps), nest) for nest in (inputs, targets))
    states = None if state is None else tf.nest.map_structure(lambda s: _blocks(s, steps), state)

    def prepare(grads: List[Any]) -> List[Any]:
        return _densified(grads) if sparse_as_dense else grads

    # The first micro-batch outside the loop fixes the structure of what the loop carries.
    loss0, grads0, state0 = micro_step(_block(xs, 0), _block(ys, 0), _block(states, 0))
    grads0 = prepare(grads0)
    kinds = ["none" if g is None else "sparse" if isinstance(g, tf.IndexedSlices) else "dense" for g in grads0]
    dense0 = [g for g, kind in zip(grads0, kinds) if kind == "dense"]
    sparse0 = [g for g, kind in zip(grads0, kinds) if kind == "sparse"]
    values_tas = _arrays([g.values for g in sparse0], steps)
    index_tas = _arrays([g.indices for g in sparse0], steps)
    state_tas = _arrays([] if state0 is None else tf.nest.flatten(state0), steps)

    def body(j, loss_sum, dense_sums, values_tas, index_tas, state_tas):
        loss, grads, new_state = micro_step(_block(xs, j), _block(ys, j), _block(states, j))
        grads = prepare(grads)
        dense = [g for g, kind in zip(grads, kinds) if kind == "dense"]
        sparse = [g for g, kind in zip(grads, kinds) if kind == "sparse"]
        dense_sums = [a + g for a, g in zip(dense_sums, dense)]
        values_tas = [ta.write(j, g.values) for ta, g in zip(values_tas, sparse)]
        index_tas = [ta.write(j, g.indices) for ta, g in zip(index_tas, sparse)]
        flat = [] if new_state is None else tf.nest.flatten(new_state)
        state_tas = [ta.write(j, s) for ta, s in zip(state_tas, flat)]
        return j + 1, loss_sum + loss, dense_sums, values_tas, index_tas, state_tas

    _, loss_sum, dense_sums, values_tas, index_tas, state_tas = tf.while_loop(
        lambda j, *_: j < steps, body,
        (tf.constant(1), loss0, dense0, values_tas, index_tas, state_tas),
        parallel_iterations=1)  # one micro-batch's activations at a time

    inverse = 1.0 / steps
    sparse = [tf.IndexedSlices(v.concat() * inverse, i.concat(), g.dense_shape)
              for v, i, g in zip(values_tas, index_tas, sparse0)]
    grads = _in_order(kinds, [d * inverse for d in dense_sums], sparse)
    new_state: Optional[Any] = None
    if state0 is not None:
        new_state = tf.nest.pack_sequence_as(state0, [_unblock(ta.stack()) for ta in state_tas])
    return loss_sum * inverse, grads, new_state


def _arrays(firsts: List[tf.Tensor], steps: int) -> List[tf.TensorArray]:
    """A ``TensorArray`` of ``steps`` entries per tensor, each holding the tensor as its entry 0."""
    return [tf.TensorArray(t.dtype, size=steps, element_shape=t.shape).write(0, t) for t in firsts]


def _in_order(kinds: List[str], dense: List[Any], sparse: List[Any]) -> List[Any]:
    """The gradients back in the variables' order: ``kinds`` says which list each comes from (or None)."""
    dense_it, sparse_it = iter(dense), iter(sparse)
    return [None if kind == "none" else next(dense_it) if kind == "dense" else next(sparse_it) for kind in kinds]


def _block(nest: Any, j: Any) -> Any:
    """Micro-batch ``j`` of a nest of [k, m, ...] blocks (None stays None)."""
    return None if nest is None else tf.nest.map_structure(lambda t: t[j], nest)


def _densified(grads: List[Any]) -> List[Any]:
    """``IndexedSlices`` gradients as dense tensors (``sparse_as_dense``)."""
    return [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
