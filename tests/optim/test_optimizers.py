"""Every optimizer and LARC mode, step by step, against a NumPy reference.

Four variables of very different scales (1e-3, 1, 100 and an all-zero one)
get six updates with changing learning rates, eagerly and under tf.function.
Hyper-parameters are chosen so that the details matter (betas far from 1,
epsilon comparable to the small layer's gradients).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tensorflow as tf

from lmkit import optim
from tests.optim import reference as ref

SHAPES = [(3, 4), (5,), (2, 3), (4,)]
VAR_SCALES = [1e-3, 1.0, 100.0, 0.0]
GRAD_SCALES = [1e-3, 1e-2, 10.0, 1.0]
LRS = [0.1, 0.05, 0.2, 0.1, 0.03, 0.07]
MODES = ["eager", "function"]


def make_problem(seed: int = 0):
    rng = np.random.default_rng(seed)
    inits = [(s * rng.standard_normal(shape)).astype(np.float32)
             for shape, s in zip(SHAPES, VAR_SCALES)]
    grads = [[(s * rng.standard_normal(shape)).astype(np.float32)
              for shape, s in zip(SHAPES, GRAD_SCALES)] for _ in LRS]
    return inits, grads


def assert_close(actual, expected, what):
    scale = max(float(np.abs(expected).max()), 1e-3)
    np.testing.assert_allclose(actual, expected, rtol=2e-5, atol=2e-6 * scale, err_msg=what)


def run_and_compare(opt, ref_step, mode, lr_scale=1.0, larc=None):
    """Applies the same gradients with ``opt`` and the NumPy rule; compares after every step."""
    inits, grads = make_problem()
    variables = [tf.Variable(w, name=f"layer{i}/w") for i, w in enumerate(inits)]
    opt.build(variables)

    def step(gs):
        opt.apply_gradients(zip(gs, variables))

    if mode == "function":
        step = tf.function(step)
    ws = [w.astype(np.float64) for w in inits]
    states = [{} for _ in ws]
    clipped_seen, free_seen = False, False
    for t, (lr, gs) in enumerate(zip(LRS, grads), start=1):
        lr = lr * lr_scale
        opt.learning_rate.assign(lr)
        step([tf.constant(g) for g in gs])
        for i, g in enumerate(gs):
            g = g.astype(np.float64)
            if larc is not None:
                f = ref.larc_factor(ws[i], g, lr, **larc)
                clipped_seen |= f < 1.0
                free_seen |= f == 1.0
                g = f * g
            ws[i] = ref_step(ws[i], g, states[i], lr, t)
        for i, var in enumerate(variables):
            assert_close(var.numpy(), ws[i], f"{type(opt).__name__} step {t} variable {i}")
    assert int(opt.iterations.numpy()) == len(LRS)
    if larc is not None and larc["mode"] == "clip":
        assert clipped_seen and free_seen, "the test should exercise both clipped and free layers"


B = dict(beta1=0.8, beta2=0.9, epsilon=1e-3)
RB = dict(beta1=0.8, beta2=0.9, eps=1e-3)
CASES = {
    "sgd": (lambda: optim.SGD(), ref.sgd, 1.0),
    "sgd_weight_decay": (lambda: optim.SGD(weight_decay=0.1),
                         functools.partial(ref.sgd, wd=0.1), 1.0),
    "momentum": (lambda: optim.SGD(momentum=0.9), functools.partial(ref.sgd, momentum=0.9), 1.0),
    "nesterov": (lambda: optim.SGD(momentum=0.9, nesterov=True, weight_decay=0.01),
                 functools.partial(ref.sgd, momentum=0.9, nesterov=True, wd=0.01), 1.0),
    "adam": (lambda: optim.Adam(**B), functools.partial(ref.adam, **RB), 0.1),
    "adam_l2": (lambda: optim.Adam(weight_decay=0.1, **B),
                functools.partial(ref.adam, wd=0.1, **RB), 0.1),
    "adamw": (lambda: optim.AdamW(weight_decay=0.1, **B),
              functools.partial(ref.adam, wd=0.1, decoupled=True, **RB), 0.1),
    "adam_defaults": (lambda: optim.Adam(),
                      functools.partial(ref.adam, beta1=0.9, beta2=0.999, eps=1e-8), 0.1),
    "novograd": (lambda: optim.NovoGrad(beta1=0.9, beta2=0.7, epsilon=1e-3),
                 functools.partial(ref.novograd, beta1=0.9, beta2=0.7, eps=1e-3), 1.0),
    "novograd_averaging_wd": (
        lambda: optim.NovoGrad(beta1=0.9, beta2=0.7, epsilon=1e-3, weight_decay=0.01,
                               grad_averaging=True),
        functools.partial(ref.novograd, beta1=0.9, beta2=0.7, eps=1e-3, wd=0.01,
                          grad_averaging=True), 1.0),
    "novograd_defaults": (lambda: optim.NovoGrad(),
                          functools.partial(ref.novograd, beta1=0.95, beta2=0.98, eps=1e-8), 1.0),
    "lamb": (lambda: optim.LAMB(weight_decay=0.01, **B),
             functools.partial(ref.lamb, wd=0.01, **RB), 0.1),
    "lamb_no_bias_correction": (lambda: optim.LAMB(bias_correction=False, **B),
                                functools.partial(ref.lamb, bias_correction=False, **RB), 0.1),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_optimizer_matches_numpy(case, mode):
    make, ref_step, lr_scale = CASES[case]
    run_and_compare(make(), ref_step, mode, lr_scale=lr_scale)


LARC_CASES = {
    "clip_sgd": ("clip", lambda: optim.SGD(), ref.sgd),
    "clip_momentum": ("clip", lambda: optim.SGD(momentum=0.9),
                      functools.partial(ref.sgd, momentum=0.9)),
    "scale_sgd": ("scale", lambda: optim.SGD(), ref.sgd),
    "scale_adam": ("scale", lambda: optim.Adam(**B), functools.partial(ref.adam, **RB)),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(LARC_CASES))
def test_larc_matches_numpy(case, mode):
    larc_mode, make, ref_step = LARC_CASES[case]
    settings = dict(eta=0.02, mode=larc_mode, min_update=1e-4, eps=1e-7)
    opt = optim.LARC(make(), larc_eta=0.02, larc_mode=larc_mode, min_update=1e-4, epsilon=1e-7)
    run_and_compare(opt, ref_step, mode, larc=settings)


def test_larc_factor_formulas():
    """The factor itself, including the min_update floor and the clip at 1."""
    cases = [  # (||g||, ||w||, lr)
        (1.0, 10.0, 0.1), (1e-3, 1.0, 1.0), (5.0, 0.0, 0.5), (0.0, 2.0, 0.01)]
    for g_norm, w_norm, lr in cases:
        for mode in ("clip", "scale"):
            got = optim.larc_factor(tf.constant(g_norm), tf.constant(w_norm), tf.constant(lr),
                                    larc_eta=0.002, larc_mode=mode, min_update=1e-7, epsilon=1e-7)
            g = np.array([g_norm])
            w = np.array([w_norm])
            want = ref.larc_factor(w, g, lr, eta=0.002, mode=mode, min_update=1e-7, eps=1e-7)
            np.testing.assert_allclose(float(got), want, rtol=1e-6, err_msg=f"{mode} {g_norm} {w_norm}")
    clip = optim.larc_factor(tf.constant(1e-3), tf.constant(1.0), tf.constant(1.0), larc_eta=0.002)
    assert float(clip) == 1.0  # 0.002 * 1 / 1e-3 = 2, clipped to 1
    floor = optim.larc_factor(tf.constant(5.0), tf.constant(0.0), tf.constant(1.0),
                              larc_eta=0.002, larc_mode="scale", min_update=1e-7)
    np.testing.assert_allclose(float(floor), 1e-7, rtol=1e-6)


# ---------------------------------------------------------------- IndexedSlices
EMB_SHAPE = (6, 3)
INDICES = [np.array([0, 2, 2, 5]), np.array([1, 1, 1, 4]), np.array([3, 0, 3, 0]),
           np.array([5, 4, 2, 2]), np.array([0, 1, 2, 3]), np.array([2, 2, 2, 2])]

SPARSE_CASES = {
    "sgd": (lambda: optim.SGD(), ref.sgd),
    "sgd_momentum_nesterov": (lambda: optim.SGD(momentum=0.9, nesterov=True),
                              functools.partial(ref.sgd, momentum=0.9, nesterov=True)),
    "sgd_weight_decay": (lambda: optim.SGD(weight_decay=0.1), functools.partial(ref.sgd, wd=0.1)),
    "adam": (lambda: optim.Adam(**B), functools.partial(ref.adam, **RB)),
    "lamb": (lambda: optim.LAMB(**B), functools.partial(ref.lamb, **RB)),
    "larc_clip_sgd": (lambda: optim.LARC(optim.SGD(), larc_eta=0.02), None),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(SPARSE_CASES))
def test_indexed_slices_gradients(case, mode):
    """Sparse gradients with duplicate indices equal the dense-gradient update."""
    make, ref_step = SPARSE_CASES[case]
    rng = np.random.default_rng(1)
    init = rng.standard_normal(EMB_SHAPE).astype(np.float32)
    emb = tf.Variable(init, name="embedding/table")
    opt = make()
    opt.build([emb])

    def step(values, indices):
        opt.apply_gradients([(tf.IndexedSlices(values, indices, tf.constant(EMB_SHAPE)), emb)])

    if mode == "function":
        step = tf.function(step)
    w = init.astype(np.float64)
    state = {}
    for t, (lr, idx) in enumerate(zip(LRS, INDICES), start=1):
        values = rng.standard_normal((len(idx), EMB_SHAPE[1])).astype(np.float32)
        opt.learning_rate.assign(lr)
        step(tf.constant(values), tf.constant(idx, tf.int32))
        g = ref.densify(values.astype(np.float64), idx, EMB_SHAPE)
        if ref_step is None:  # LARC(SGD), clip mode
            g = ref.larc_factor(w, g, lr, eta=0.02, mode="clip", min_update=1e-7, eps=1e-7) * g
            w = ref.sgd(w, g, state, lr, t)
        else:
            w = ref_step(w, g, state, lr, t)
        assert_close(emb.numpy(), w, f"{case} step {t}")


def test_sparse_sgd_leaves_untouched_rows_bit_identical():
    """The scatter path: rows without a gradient are not even rewritten."""
    init = np.arange(18, dtype=np.float32).reshape(EMB_SHAPE) / 7.0
    emb = tf.Variable(init)
    opt = optim.SGD(learning_rate=0.5)
    opt.apply_gradients([(tf.IndexedSlices(tf.ones([3, 3]), tf.constant([1, 4, 1]),
                                           tf.constant(EMB_SHAPE)), emb)])
    out = emb.numpy()
    untouched = [0, 2, 3, 5]
    assert np.array_equal(out[untouched], init[untouched])
    np.testing.assert_allclose(out[1], init[1] - 1.0)  # two duplicate rows: 2 * 0.5
    np.testing.assert_allclose(out[4], init[4] - 0.5)


# ------------------------------------------------------------- weight decay etc.
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


@pytest.mark.parametrize("make, needle", [
    (lambda: optim.SGD(momentum=1.5), "momentum"),
    (lambda: optim.SGD(nesterov=True), "nesterov"),
    (lambda: optim.SGD(learning_rate=-1.0), "learning_rate"),
    (lambda: optim.Adam(beta1=1.0), "beta1"),
    (lambda: optim.Adam(epsilon=0.0), "epsilon"),
    (lambda: optim.NovoGrad(grad_averaging=1), "grad_averaging"),
    (lambda: optim.LAMB(weight_decay=-0.1), "weight_decay"),
    (lambda: optim.AdamW(exclude_from_weight_decay=["("]), "exclude_from_weight_decay"),
    (lambda: optim.LARC(optim.SGD(), larc_eta=0.002, larc_mode="clamp"), "larc_mode"),
    (lambda: optim.LARC(optim.SGD(), larc_eta=0.0), "larc_eta"),
    (lambda: optim.LARC(optim.LARC(optim.SGD(), larc_eta=1.0), larc_eta=1.0), "optimizer"),
])
def test_bad_arguments_are_named(make, needle):
    with pytest.raises(ValueError, match=needle):
        make()
