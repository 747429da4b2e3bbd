"""LARC (a per-layer trust ratio over any optimizer), clip and scale, step by step against NumPy; its factor."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tensorflow as tf

from lmkit import optim
from tests.optim import reference as ref
from tests.optim.harness import MODES, RB, B, model_vars, run_and_compare, run_sparse_and_compare

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


@pytest.mark.parametrize("mode", MODES)
def test_indexed_slices_gradients(mode):
    run_sparse_and_compare(lambda: optim.LARC(optim.SGD(), larc_eta=0.02), None, mode, "larc_clip_sgd")


def test_larc_shares_the_wrapped_state():
    inner = optim.SGD(momentum=0.9)
    opt = optim.LARC(inner, larc_eta=0.002)
    assert opt.learning_rate is inner.learning_rate
    assert opt.iterations is inner.iterations
    variables = model_vars()
    opt.build(variables)
    assert [id(v) for v in opt.variables] == [id(v) for v in inner.variables]
    assert len(opt.variables) == 2 + 3
    opt.learning_rate.assign(0.25)
    assert float(inner.learning_rate.numpy()) == 0.25


@pytest.mark.parametrize("make, needle", [
    (lambda: optim.LARC(optim.SGD(), larc_eta=0.002, larc_mode="clamp"), "larc_mode"),
    (lambda: optim.LARC(optim.SGD(), larc_eta=0.0), "larc_eta"),
    (lambda: optim.LARC(optim.LARC(optim.SGD(), larc_eta=1.0), larc_eta=1.0), "optimizer"),
])
def test_bad_arguments_are_named(make, needle):
    with pytest.raises(ValueError, match=needle):
        make()
