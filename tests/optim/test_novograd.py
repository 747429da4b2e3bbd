"""NovoGrad (layer-wise second moments), with gradient averaging and weight decay, against NumPy."""

from __future__ import annotations

import functools

import pytest

from lmkit import optim
from tests.optim import reference as ref
from tests.optim.harness import MODES, run_and_compare

CASES = {
    "novograd": (lambda: optim.NovoGrad(beta1=0.9, beta2=0.7, epsilon=1e-3),
                 functools.partial(ref.novograd, beta1=0.9, beta2=0.7, eps=1e-3)),
    "novograd_averaging_wd": (
        lambda: optim.NovoGrad(beta1=0.9, beta2=0.7, epsilon=1e-3, weight_decay=0.01, grad_averaging=True),
        functools.partial(ref.novograd, beta1=0.9, beta2=0.7, eps=1e-3, wd=0.01, grad_averaging=True)),
    "novograd_defaults": (lambda: optim.NovoGrad(),
                          functools.partial(ref.novograd, beta1=0.95, beta2=0.98, eps=1e-8)),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_novograd_matches_numpy(case, mode):
    make, ref_step = CASES[case]
    run_and_compare(make(), ref_step, mode)


@pytest.mark.parametrize("make, needle", [
    (lambda: optim.NovoGrad(grad_averaging=1), "grad_averaging"),
])
def test_bad_arguments_are_named(make, needle):
    with pytest.raises(ValueError, match=needle):
        make()
