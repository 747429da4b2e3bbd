"""Adam (L2 weight decay) and AdamW (decoupled), step by step against NumPy, dense and sparse."""

from __future__ import annotations

import functools

import pytest

from lmkit import optim
from tests.optim import reference as ref
from tests.optim.harness import MODES, RB, B, run_and_compare, run_sparse_and_compare

CASES = {
    "adam": (lambda: optim.Adam(**B), functools.partial(ref.adam, **RB)),
    "adam_l2": (lambda: optim.Adam(weight_decay=0.1, **B), functools.partial(ref.adam, wd=0.1, **RB)),
    "adamw": (lambda: optim.AdamW(weight_decay=0.1, **B), functools.partial(ref.adam, wd=0.1, decoupled=True, **RB)),
    "adam_defaults": (lambda: optim.Adam(), functools.partial(ref.adam, beta1=0.9, beta2=0.999, eps=1e-8)),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_adam_matches_numpy(case, mode):
    make, ref_step = CASES[case]
    run_and_compare(make(), ref_step, mode, lr_scale=0.1)


@pytest.mark.parametrize("mode", MODES)
def test_indexed_slices_gradients(mode):
    run_sparse_and_compare(lambda: optim.Adam(**B), functools.partial(ref.adam, **RB), mode, "adam")


@pytest.mark.parametrize("make, needle", [
    (lambda: optim.Adam(beta1=1.0), "beta1"),
    (lambda: optim.Adam(epsilon=0.0), "epsilon"),
    (lambda: optim.AdamW(exclude_from_weight_decay=["("]), "exclude_from_weight_decay"),
])
def test_bad_arguments_are_named(make, needle):
    with pytest.raises(ValueError, match=needle):
        make()
