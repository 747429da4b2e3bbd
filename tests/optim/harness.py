"""What every optimizer's test runs: the same gradients applied by the optimizer and by its NumPy rule.

Four variables of very different scales (1e-3, 1, 100 and an all-zero one)
get six updates with changing learning rates, eagerly and under tf.function.
Hyper-parameters are chosen so that the details matter (betas far from 1,
epsilon comparable to the small layer's gradients). Sparse gradients
(``IndexedSlices`` with duplicate indices) must equal the dense update.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

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


def model_vars(prefix: str = "net"):
    """An embedding table, a kernel and a bias, each filled with 0.5."""
    return [tf.Variable(tf.fill(shape, 0.5), name=f"{prefix}/{name}")
            for name, shape in (("embedding", [4, 3]), ("kernel", [3, 2]), ("bias", [2]))]


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

#: betas far from 1 and an epsilon of the small layer's size: the optimizer's, the NumPy rule's spelling
B = dict(beta1=0.8, beta2=0.9, epsilon=1e-3)
RB = dict(beta1=0.8, beta2=0.9, eps=1e-3)


EMB_SHAPE = (6, 3)
INDICES = [np.array([0, 2, 2, 5]), np.array([1, 1, 1, 4]), np.array([3, 0, 3, 0]),
           np.array([5, 4, 2, 2]), np.array([0, 1, 2, 3]), np.array([2, 2, 2, 2])]


def run_sparse_and_compare(make, ref_step, mode, what):
    """Sparse gradients with duplicate indices (six steps) equal the dense-gradient update of ``ref_step``
    (None: LARC(SGD) in clip mode)."""
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
        assert_close(emb.numpy(), w, f"{what} step {t}")
