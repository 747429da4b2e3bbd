"""SGD, with momentum, Nesterov and weight decay, step by step against NumPy, dense and sparse."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tensorflow as tf

from lmkit import optim
from tests.optim import reference as ref
from tests.optim.harness import EMB_SHAPE, MODES, run_and_compare, run_sparse_and_compare

CASES = {
    "sgd": (lambda: optim.SGD(), ref.sgd),
    "sgd_weight_decay": (lambda: optim.SGD(weight_decay=0.1), functools.partial(ref.sgd, wd=0.1)),
    "momentum": (lambda: optim.SGD(momentum=0.9), functools.partial(ref.sgd, momentum=0.9)),
    "nesterov": (lambda: optim.SGD(momentum=0.9, nesterov=True, weight_decay=0.01),
                 functools.partial(ref.sgd, momentum=0.9, nesterov=True, wd=0.01)),
}
SPARSE_CASES = {
    "sgd": (lambda: optim.SGD(), ref.sgd),
    "sgd_momentum_nesterov": (lambda: optim.SGD(momentum=0.9, nesterov=True),
                              functools.partial(ref.sgd, momentum=0.9, nesterov=True)),
    "sgd_weight_decay": (lambda: optim.SGD(weight_decay=0.1), functools.partial(ref.sgd, wd=0.1)),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_sgd_matches_numpy(case, mode):
    make, ref_step = CASES[case]
    run_and_compare(make(), ref_step, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(SPARSE_CASES))
def test_indexed_slices_gradients(case, mode):
    run_sparse_and_compare(*SPARSE_CASES[case], mode, case)


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


@pytest.mark.parametrize("make, needle", [
    (lambda: optim.SGD(momentum=1.5), "momentum"),
    (lambda: optim.SGD(nesterov=True), "nesterov"),
    (lambda: optim.SGD(learning_rate=-1.0), "learning_rate"),
])
def test_bad_arguments_are_named(make, needle):
    with pytest.raises(ValueError, match=needle):
        make()
