"""What every optimizer shares (optim/base.py): slots and the `variables` order, checkpoints, lazy building,
the iteration count, None gradients, which variables weight decay skips, and an update gated by apply_if
with no branch in the graph."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from lmkit import optim
from lmkit.optim import OPTIMIZERS, create_optimizer
from tests.optim import reference as ref
from tests.optim.harness import RB, B, assert_close, model_vars

EXPECTED_SLOTS = {
    "sgd": [],
    "momentum": ["momentum"],
    "adam": ["m", "v"],
    "adamw": ["m", "v"],
    "novograd": ["m", "v"],
    "lamb": ["m", "v"],
}


@pytest.mark.parametrize("name", sorted(EXPECTED_SLOTS))
def test_build_creates_named_slots_in_a_stable_order(name):
    variables = model_vars()
    opt = optim.create_optimizer(name, learning_rate=0.1)
    assert opt.learning_rate.dtype == tf.float32 and not opt.learning_rate.trainable
    assert opt.iterations.dtype == tf.int64 and not opt.iterations.trainable
    assert [v.name for v in opt.variables] == [opt.learning_rate.name, opt.iterations.name]
    opt.build(variables)
    want = [f"net/{var}/{slot}:0" for var in ("embedding", "kernel", "bias")
            for slot in EXPECTED_SLOTS[name]]
    got = [v.name for v in opt.variables[2:]]
    assert got == want
    for slot in opt.variables[2:]:
        assert not slot.trainable
        assert not np.any(slot.numpy()), "slots start at zero"
    if name == "novograd":  # one second moment per layer
        assert opt.slots(variables[0])["v"].shape == ()
        assert opt.slots(variables[0])["m"].shape == (4, 3)
    before = list(opt.variables)
    opt.build(variables)  # idempotent
    opt.build(variables[::-1])  # order of later calls does not matter
    assert [id(v) for v in opt.variables] == [id(v) for v in before]
    extra = tf.Variable(tf.zeros([5]), name="net/extra")
    opt.build(variables + [extra])
    assert [v.name for v in opt.variables[len(before):]] == [
        f"net/extra/{slot}:0" for slot in EXPECTED_SLOTS[name]]


def test_variables_with_equal_names_get_separate_slots():
    a = tf.Variable(tf.ones([2]), name="w")
    b = tf.Variable(tf.ones([3]), name="w")
    opt = optim.Adam()
    opt.build([a, b])
    assert opt.slots(a)["m"] is not opt.slots(b)["m"]
    assert opt.slots(b)["m"].shape == (3,)
    assert [v.name for v in opt.variables[2:]] == ["w/m:0", "w/v:0", "w_1/m:0", "w_1/v:0"]


def _train(opt, variables, steps, seed):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        grads = [tf.constant(rng.standard_normal(v.shape).astype(np.float32)) for v in variables]
        opt.learning_rate.assign(float(rng.uniform(0.01, 0.1)))
        opt.apply_gradients(zip(grads, variables))


@pytest.mark.parametrize("make", [
    lambda: optim.Adam(),
    lambda: optim.NovoGrad(),
    lambda: optim.LARC(optim.SGD(momentum=0.9), larc_eta=0.002, larc_mode="scale"),
], ids=["adam", "novograd", "larc_momentum"])
def test_checkpoint_round_trip_restores_slots(tmp_path, make):
    variables, opt = model_vars(), make()
    opt.build(variables)
    _train(opt, variables, steps=3, seed=0)
    path = tf.train.Checkpoint(model=variables, optimizer=opt).save(str(tmp_path / "ckpt"))

    # A fresh optimizer built in the opposite order: slots are found by name.
    variables2, opt2 = model_vars(), make()
    opt2.build(variables2[::-1])
    tf.train.Checkpoint(model=variables2, optimizer=opt2).restore(path).assert_consumed()
    saved = {v.name: v.numpy() for v in opt.variables}
    restored = {v.name: v.numpy() for v in opt2.variables}
    assert saved.keys() == restored.keys()
    for name, value in saved.items():
        np.testing.assert_array_equal(restored[name], value, err_msg=name)
    assert any(np.any(v) for k, v in restored.items() if k.count("/") >= 2), "slots were trained"

    # Training on from both gives identical weights.
    _train(opt, variables, steps=2, seed=1)
    _train(opt2, variables2, steps=2, seed=1)
    for a, b in zip(variables, variables2):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_apply_before_build_builds_eagerly_and_in_tf_function():
    eager_vars, traced_vars = model_vars("e"), model_vars("t")
    eager, traced = optim.Adam(learning_rate=0.1), optim.Adam(learning_rate=0.1)
    grads = [tf.fill(v.shape, 0.3) for v in eager_vars]

    eager.apply_gradients(zip(grads, eager_vars))  # no build() first

    @tf.function
    def step():
        traced.apply_gradients(zip(grads, traced_vars))

    step()  # slots are created on the first trace, outside the graph
    step()
    eager.apply_gradients(zip(grads, eager_vars))
    assert len(traced.variables) == 2 + 2 * 3
    for a, b in zip(eager_vars, traced_vars):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
    assert int(traced.iterations.numpy()) == 2


def test_iterations_drive_bias_correction_under_tf_function():
    """The step counter is read inside the graph, not frozen at trace time."""
    w = tf.Variable([1.0])
    opt = optim.Adam(learning_rate=1.0, beta1=0.5, beta2=0.5, epsilon=1e-12)
    opt.build([w])
    step = tf.function(lambda g: opt.apply_gradients([(g, w)]))
    deltas = []
    for g in (1.0, 1.0, 1.0):
        before = float(w.numpy()[0])
        step(tf.constant([g]))
        deltas.append(before - float(w.numpy()[0]))
    # with a constant gradient the bias-corrected Adam step is exactly lr each time
    np.testing.assert_allclose(deltas, [1.0, 1.0, 1.0], rtol=1e-5)


@pytest.mark.parametrize("exclude", [["bias"], lambda v: v.shape.rank == 1, "vectors", ["vectors"]])
def test_weight_decay_exclusion(exclude):
    rng = np.random.default_rng(2)
    kernel0 = rng.standard_normal((3, 2)).astype(np.float32)
    bias0 = rng.standard_normal((2,)).astype(np.float32)
    kernel = tf.Variable(kernel0, name="dense/kernel")
    bias = tf.Variable(bias0, name="dense/bias")
    opt = optim.AdamW(learning_rate=0.1, weight_decay=0.5, exclude_from_weight_decay=exclude, **B)
    assert opt.decays(kernel) and not opt.decays(bias)
    sk, sb = {}, {}
    wk, wb = kernel0.astype(np.float64), bias0.astype(np.float64)
    for t in range(1, 6):
        gk = rng.standard_normal((3, 2)).astype(np.float32)
        gb = rng.standard_normal((2,)).astype(np.float32)
        opt.apply_gradients([(tf.constant(gk), kernel), (tf.constant(gb), bias)])
        wk = ref.adam(wk, gk, sk, 0.1, t, wd=0.5, decoupled=True, **RB)
        wb = ref.adam(wb, gb, sb, 0.1, t, wd=0.0, **RB)
        assert_close(kernel.numpy(), wk, f"kernel step {t}")
        assert_close(bias.numpy(), wb, f"bias step {t}")


def test_vectors_decay_what_nanogpt_decays():
    """exclude_from_weight_decay = "vectors" on nanoGPT's CPU model (config_tiny_transformer's shape): the
    18 tensors, 802,944 weights that nanoGPT's configure_optimizers decays (every parameter of 2 or more
    dimensions: matrices and embedding tables); with a pattern beside it, that one too."""
    from lmkit.models import TransformerLanguageModel
    model = TransformerLanguageModel(vocab_size=65, hidden_size=128, num_layers=4, num_heads=4, max_positions=64,
                                     tie_weights=True, init_scale=0.02)
    decayed = [v for v in model.trainable_variables if optim.AdamW(exclude_from_weight_decay="vectors").decays(v)]
    assert len(decayed) == 18 and sum(v.shape.num_elements() for v in decayed) == 802_944
    assert all(len(v.shape) == 2 for v in decayed)
    opt = optim.AdamW(exclude_from_weight_decay=["vectors", "position_embedder"])
    assert [v.name for v in model.trainable_variables if opt.decays(v)] == [
        v.name for v in decayed if "position_embedder" not in v.name]


def test_none_gradient_skips_the_variable():
    a = tf.Variable([1.0, 2.0], name="a")
    b = tf.Variable([3.0], name="b")
    opt = optim.Adam(learning_rate=0.1)
    opt.build([a, b])
    opt.apply_gradients([(tf.constant([1.0, 1.0]), a), (None, b)])
    assert b.numpy().tolist() == [3.0]
    assert not np.any(opt.slots(b)["m"].numpy())
    assert np.all(a.numpy() < [1.0, 2.0])
    assert int(opt.iterations.numpy()) == 1


# ------------------------------------------------ apply_if: a skipped step changes nothing, with no branch
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
