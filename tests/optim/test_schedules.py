"""The schedules and the warmup, through the policy that combines them: scaling, warmup, hand-over."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from lmkit import optim

SPE = 10  # steps per epoch


def lr(policy, step):
    return float(policy(step).numpy())


@pytest.mark.parametrize("n, scaling, peak", [
    (1, "none", 0.4), (1, "linear", 0.4), (1, "sqrt", 0.4),
    (4, "none", 0.4), (4, "linear", 1.6), (4, "sqrt", 0.8)])
def test_scaling_and_warmup(n, scaling, peak):
    p = optim.LearningRatePolicy(0.4, n, SPE, scaling=scaling, warmup_epochs=2.0,
                                 schedule="constant")
    assert p.peak_lr == pytest.approx(peak)
    assert p.warmup_steps == 20
    start = peak / n
    assert lr(p, 0) == pytest.approx(start, rel=1e-6)  # Goyal et al.: from peak / N
    for s in (5, 10, 19):  # linear in between
        assert lr(p, s) == pytest.approx(start + (peak - start) * s / 20, rel=1e-6)
    assert lr(p, 20) == pytest.approx(peak, rel=1e-6)  # the end of warmup
    assert lr(p, 1000) == pytest.approx(peak, rel=1e-6)
    if n == 1:
        assert len({lr(p, s) for s in range(25)}) == 1, "one worker: nothing to warm up"


def test_warmup_start_factor_and_fractional_epochs():
    p = optim.LearningRatePolicy(1.0, 1, SPE, warmup_epochs=0.5, warmup_start_factor=0.0)
    assert p.warmup_steps == 5
    assert [lr(p, s) for s in range(7)] == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.0])


def test_epoch_decay_inside_the_warmup_applies_at_the_hand_over():
    p = optim.LearningRatePolicy(1.0, 4, SPE, "linear", 2.0, "exponential",
                                 lr_decay=0.5, lr_decay_start_epoch=1)
    assert lr(p, 15) == pytest.approx(1.0 + 3.0 * 15 / 20)  # warmup ignores the decay
    assert lr(p, 20) == pytest.approx(4.0 * 0.25)  # epoch 2: two decays


def test_piecewise():
    p = optim.LearningRatePolicy(2.0, 1, SPE, schedule="piecewise",
                                 boundaries=[2, 3.5], values=[1.0, 0.1, 0.01])
    want = {0: 2.0, 19: 2.0, 20: 0.2, 34: 0.2, 35: 0.02, 100: 0.02}
    assert {s: lr(p, s) for s in want} == pytest.approx(want)


@pytest.mark.parametrize("n", [1, 4])
def test_polynomial_and_cosine_over_the_remaining_steps(n):
    w, total = 10, 50  # warmup 1 epoch, total 5 epochs
    poly = optim.LearningRatePolicy(0.1, n, SPE, "linear", 1.0, "polynomial",
                                    total_epochs=5, power=2.0, end_lr=0.001)
    cos = optim.LearningRatePolicy(0.1, n, SPE, "linear", 1.0, "cosine", total_epochs=5,
                                   end_lr=0.0)
    peak = 0.1 * n
    for s in (10, 11, 25, 49, 50, 70):
        prog = min(max((s - w) / (total - w), 0.0), 1.0)
        assert lr(poly, s) == pytest.approx(0.001 + (peak - 0.001) * (1 - prog) ** 2, rel=1e-6)
        assert lr(cos, s) == pytest.approx(peak * 0.5 * (1 + math.cos(math.pi * prog)),
                                           rel=1e-6, abs=1e-9)
    assert lr(poly, 9) == pytest.approx(peak / n + (peak - peak / n) * 0.9, rel=1e-6)
    assert lr(cos, 10) == pytest.approx(peak, rel=1e-6)


ALL_POLICIES = {
    "exponential": dict(schedule="exponential", lr_decay=0.8, lr_decay_start_epoch=2),
    "piecewise": dict(schedule="piecewise", boundaries=[1, 4], values=[1.0, 0.3, 0.05]),
    "polynomial": dict(schedule="polynomial", total_epochs=6, power=1.5, end_lr=0.01),
    "cosine": dict(schedule="cosine", total_epochs=6),
    "constant": dict(schedule="constant"),
}


@pytest.mark.parametrize("name", sorted(ALL_POLICIES))
@pytest.mark.parametrize("n, scaling", [(1, "none"), (4, "linear"), (4, "sqrt")])
def test_python_int_and_tensor_steps_agree(name, n, scaling):
    p = optim.LearningRatePolicy(0.7, n, SPE, scaling, 1.5, **ALL_POLICIES[name])
    steps = list(range(0, 80, 3)) + [14, 15, 16]
    from_ints = [lr(p, s) for s in steps]
    from_int32 = [lr(p, tf.constant(s, tf.int32)) for s in steps]
    counter = tf.Variable(0, dtype=tf.int64)

    @tf.function
    def traced(s):
        counter.assign(s)
        return p(counter)  # e.g. optimizer.iterations inside the train step

    from_graph = [float(traced(tf.constant(s, tf.int64)).numpy()) for s in steps]
    assert from_ints == from_int32 == from_graph
    assert p(3).dtype == tf.float32
    assert len(set(from_ints)) > 1 or name == "constant" and n == 1


@pytest.mark.parametrize("kwargs, needle", [
    (dict(schedule="linear"), "schedule"),
    (dict(scaling="cubic"), "lr_scaling"),
    (dict(schedule="cosine"), "total_epochs"),
    (dict(schedule="cosine", total_epochs=5, power=2.0), "'power'"),
    (dict(schedule="exponential", decay=0.5), "'decay'.*did you mean 'lr_decay'"),
    (dict(schedule="piecewise", boundaries=[1, 2], values=[1.0, 0.5]), "values"),
    (dict(schedule="piecewise", boundaries=[2, 1], values=[1.0, 0.5, 0.1]), "increasing"),
    (dict(schedule="polynomial", total_epochs=1, warmup_epochs=2.0), "total_epochs"),
    (dict(warmup_epochs=-1.0), "warmup_epochs"),
])
def test_bad_policy_arguments(kwargs, needle):
    args = dict(base_lr=1.0, world_size=2, steps_per_epoch=SPE)
    args.update(kwargs)
    with pytest.raises(ValueError, match=needle):
        optim.LearningRatePolicy(**args)


def test_steps_must_be_integers():
    p = optim.LearningRatePolicy(1.0, 1, SPE)
    with pytest.raises(ValueError, match="integer"):
        p(tf.constant(1.5))
    assert np.isclose(float(p(np.int64(3))), 1.0)
