"""``apply_gradients(..., apply_if=...)``: a skipped step changes nothing, with no branch in the graph.

The trainer skips a non-finite step on the device (``apply_if`` = the
averaged gradients are finite) rather than with a ``tf.cond``, whose
predicate makes the host wait for the GPU every step; these tests hold
every registered optimizer (and LARC) to that contract on the CPU.
"""
import numpy as np
import pytest
import tensorflow as tf

from lmkit.optim import OPTIMIZERS, create_optimizer

CASES = [(name, None) for name in OPTIMIZERS] + [("sgd", {"larc_eta": 0.02, "larc_mode": "clip"})]
# Ops that make a branch (or read a device value on the host to choose one).
BRANCH_OPS = {"If", "StatelessIf", "Switch", "Merge"}


def _problem(name, larc):
    opt = create_optimizer(name, learning_rate=0.1, params={"weight_decay": 0.01}
                           if name in ("adamw", "lamb") else None, larc_params=larc)
    dense = tf.Variable(np.linspace(-1, 1, 12).reshape(3, 4).astype(np.float32), name="dense")
    table = tf.Variable(np.linspace(0.5, 2, 10).reshape(5, 2).astype(np.float32), name="table")
    opt.build([dense, table])
    grad = tf.constant(np.linspace(0.3, -0.2, 12).reshape(3, 4), tf.float32)
    rows = tf.IndexedSlices(tf.constant([[1.0, -2.0], [0.5, 0.5], [3.0, 1.0]]), tf.constant([4, 1, 4]),
                            tf.constant([5, 2]))
    return opt, [dense, table], grad, rows


def _state(opt, variables):
    return [v.numpy().copy() for v in variables + list(opt.variables)]


@pytest.mark.parametrize("name, larc", CASES)
def test_a_false_condition_changes_nothing_even_with_nan_gradients(name, larc):
    opt, variables, grad, rows = _problem(name, larc)
    opt.apply_gradients(zip([grad, rows], variables))  # slots hold real values first
    before = _state(opt, variables)
    nan = tf.fill(grad.shape, float("nan"))
    bad_rows = tf.IndexedSlices(rows.values * float("inf"), rows.indices, rows.dense_shape)
    step = tf.function(lambda g, r, ok: opt.apply_gradients(zip([g, r], variables), apply_if=ok))
    step(nan, bad_rows, tf.constant(False))
    for a, b in zip(_state(opt, variables), before):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name, larc", CASES)
def test_a_true_condition_is_the_plain_update(name, larc):
    gated, gated_vars, grad, rows = _problem(name, larc)
    plain, plain_vars, _, _ = _problem(name, larc)
    for _ in range(3):
        gated.apply_gradients(zip([grad, rows], gated_vars), apply_if=tf.constant(True))
        plain.apply_gradients(zip([grad, rows], plain_vars))
    assert int(gated.iterations.numpy()) == 3
    for a, b in zip(_state(gated, gated_vars), _state(plain, plain_vars)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name, larc", CASES)
def test_the_gated_update_has_no_branch(name, larc):
    opt, variables, grad, rows = _problem(name, larc)
    fn = tf.function(lambda g, ok: opt.apply_gradients(zip([g, rows], variables), apply_if=ok))
    graph = fn.get_concrete_function(tf.TensorSpec(grad.shape), tf.TensorSpec([], tf.bool)).graph
    ops = {op.type for op in graph.get_operations()}
    assert not ops & BRANCH_OPS, sorted(ops & BRANCH_OPS)
    assert "SelectV2" in ops  # ... the condition selects instead
