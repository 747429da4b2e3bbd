"""LAMB (Adam with a layer-wise trust ratio), with and without bias correction, against NumPy."""

from __future__ import annotations

import functools

import pytest

from lmkit import optim
from tests.optim import reference as ref
from tests.optim.harness import MODES, RB, B, run_and_compare, run_sparse_and_compare

CASES = {
    "lamb": (lambda: optim.LAMB(weight_decay=0.01, **B), functools.partial(ref.lamb, wd=0.01, **RB)),
    "lamb_no_bias_correction": (lambda: optim.LAMB(bias_correction=False, **B),
                                functools.partial(ref.lamb, bias_correction=False, **RB)),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_lamb_matches_numpy(case, mode):
    make, ref_step = CASES[case]
    run_and_compare(make(), ref_step, mode, lr_scale=0.1)


@pytest.mark.parametrize("mode", MODES)
def test_indexed_slices_gradients(mode):
    run_sparse_and_compare(lambda: optim.LAMB(**B), functools.partial(ref.lamb, **RB), mode, "lamb")


@pytest.mark.parametrize("make, needle", [
    (lambda: optim.LAMB(weight_decay=-0.1), "weight_decay"),
])
def test_bad_arguments_are_named(make, needle):
    with pytest.raises(ValueError, match=needle):
        make()
