"""The learning rate of a run: a config's policy in epochs (Zaremba's, large batches) or in steps (nanoGPT's)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from lmkit import optim
from lmkit.config import TrainConfig, load_config
from lmkit.core.errors import UsageError
from lmkit.optim.policy import LearningRatePolicy
from tests.optim import reference as ref

SPE = 10  # steps per epoch


def lr(policy, step):
    return float(policy(step).numpy())


def test_zaremba_schedule_is_reproduced_exactly():
    """config_small, one worker: lr(epoch) = 1.0 * 0.5 ** max(epoch - 4 + 1, 0)."""
    cfg = load_config("config_small")
    p = optim.LearningRatePolicy.from_config(cfg, world_size=1, steps_per_epoch=SPE)
    for epoch in range(cfg.optimization.num_epochs):
        want = ref.lr_zaremba(epoch, lr=1.0, decay=0.5, max_epoch=4)
        for s in (epoch * SPE, epoch * SPE + 3, epoch * SPE + SPE - 1):
            assert lr(p, s) == want, f"epoch {epoch} step {s}"
    assert lr(p, 3 * SPE) == 1.0 and lr(p, 4 * SPE) == 0.5 and lr(p, 12 * SPE) == 0.5 ** 9


def test_large_batch_config_hands_over_from_warmup_to_decay():
    """config_small_large_batch on 4 workers: sqrt scaling, 1 epoch warmup, decay from epoch 4."""
    p = optim.LearningRatePolicy.from_config(load_config("config_small_large_batch"), 4, SPE)
    peak = 2.0  # 1.0 * sqrt(4)
    assert lr(p, 0) == pytest.approx(0.5)
    assert lr(p, 9) == pytest.approx(0.5 + 1.5 * 0.9)
    assert lr(p, 10) == pytest.approx(peak)  # hand-over: first step of epoch 1
    assert lr(p, 39) == pytest.approx(peak)
    assert lr(p, 40) == pytest.approx(peak * 0.5)
    assert lr(p, 55) == pytest.approx(peak * 0.25)


def test_cosine_total_epochs_defaults_to_num_epochs():
    cfg = load_config("config_transformer")
    p = optim.LearningRatePolicy.from_config(cfg, world_size=1, steps_per_epoch=SPE)
    assert p.schedule.total_steps == cfg.optimization.num_epochs * SPE
    assert lr(p, cfg.optimization.num_epochs * SPE) == pytest.approx(0.0, abs=1e-12)


def test_from_config_rejects_ignored_or_misplaced_keys():
    cfg = load_config("config_small")
    with pytest.raises(ValueError, match="lr_decay"):  # 0.5 would be silently ignored
        optim.LearningRatePolicy.from_config(cfg.replace(schedule="cosine"), 1, SPE)
    with pytest.raises(ValueError, match="top-level"):
        optim.LearningRatePolicy.from_config(
            cfg.replace(schedule_params={"lr_decay": 0.1}), 1, SPE)
    p = optim.LearningRatePolicy.from_config(
        cfg.replace(schedule="piecewise", lr_decay=1.0,
                    schedule_params={"boundaries": [1], "values": [1.0, 0.5],
                                     "warmup_start_factor": 0.0},
                    warmup_epochs=1.0), 1, SPE)
    assert lr(p, 0) == 0.0 and lr(p, 5) == pytest.approx(0.5) and lr(p, 10) == pytest.approx(0.5)


def _nanogpt_get_lr(it, learning_rate, warmup_iters, lr_decay_iters, min_lr):
    """nanoGPT's schedule (train.py's get_lr), written out from its definition as the reference."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


@pytest.mark.parametrize("warmup, total", [(100, 2000), (0, 50), (3, 4)])
def test_a_run_planned_in_steps_has_nanogpts_rate_at_every_step(warmup, total):
    policy = LearningRatePolicy.in_steps(1e-3, total_steps=total, warmup_steps=warmup, min_lr=1e-4)
    steps = list(range(total + 100))  # past the end: the floor
    got = [float(policy(s)) for s in steps] if total < 100 else policy(tf.range(total + 100)).numpy()
    want = [_nanogpt_get_lr(s, 1e-3, warmup, total, 1e-4) for s in steps]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_plan_in_steps_names_what_does_not_fit():
    with pytest.raises(UsageError, match="cannot be planned in steps"):
        LearningRatePolicy.in_steps(1e-3, total_steps=10, schedule="exponential")
    with pytest.raises(UsageError, match="max_steps = 0"):
        LearningRatePolicy.in_steps(1e-3, total_steps=0)
    with pytest.raises(UsageError, match="max_steps = 10 must be more than warmup_steps = 10"):
        LearningRatePolicy.in_steps(1e-3, total_steps=10, warmup_steps=10)


def test_a_config_planned_in_steps_has_nanogpts_rate_at_every_step():
    # nanoGPT's Shakespeare-char recipe: 100 warmup steps, a cosine to 1e-4 at step 2000, the floor after.
    cfg = TrainConfig.from_dict(dict(model="transformer", vocab_size=65, hidden_size=16, num_layers=1, num_heads=2,
                                     init_scale=0.02, dropout=0.0, batch_size=12, num_steps=8, max_positions=8,
                                     learning_rate=1e-3, max_grad_norm=1.0, schedule="cosine", max_steps=2000,
                                     warmup_steps=100, min_lr=1e-4))
    policy = LearningRatePolicy.from_config(cfg, world_size=1, steps_per_epoch=77)  # the data's epochs play no part
    got = policy(tf.range(2100)).numpy()
    np.testing.assert_allclose(got, [_nanogpt_get_lr(s, 1e-3, 100, 2000, 1e-4) for s in range(2100)], rtol=1e-6)
    # A plan in epochs: the cosine ends with num_epochs (changing it moves the end).
    epochs = cfg.replace(max_steps=0, warmup_steps=0, num_epochs=4)
    for num_epochs in (4, 8):
        p = LearningRatePolicy.from_config(epochs.replace(num_epochs=num_epochs), world_size=1, steps_per_epoch=10)
        assert float(p(10 * num_epochs)) == pytest.approx(1e-4) and float(p(10 * num_epochs - 20)) > 1.5e-4


def test_a_warmup_longer_than_a_plan_in_steps_warms_up_over_the_whole_run():
    """nanoGPT's recipe (100 warmup steps to 1e-3, a cosine to 1e-4 at the plan's end) cut to 20 steps: every
    step is a warmup step at the recipe's slope, as nanoGPT's get_lr gives it with max_iters = 20."""
    cfg = load_config("config_tiny_transformer", {"data": "text", "train_file": "t.txt", "max_steps": 20})
    policy = LearningRatePolicy.from_config(cfg, world_size=1, steps_per_epoch=77)
    got = policy(tf.range(20)).numpy()
    np.testing.assert_allclose(got, [1e-3 * (s + 1) / 101 for s in range(20)], rtol=1e-6)
    np.testing.assert_allclose(got, [_nanogpt_get_lr(s, 1e-3, 100, 2000, 1e-4) for s in range(20)], rtol=1e-6)
    assert optim.warmup_note(cfg).startswith("note: warmup_steps 100 >= the plan's 20 steps")
    # As long as the plan: the same; one step shorter: the warmup, then the decay's last step at min_lr.
    same = LearningRatePolicy.from_config(cfg.replace(warmup_steps=20), world_size=1, steps_per_epoch=77)
    assert float(same(19)) == pytest.approx(1e-3 * 20 / 21) and optim.warmup_note(cfg.replace(warmup_steps=20))
    shorter = LearningRatePolicy.from_config(cfg.replace(warmup_steps=19), world_size=1, steps_per_epoch=77)
    assert float(shorter(19)) == pytest.approx(1e-3) and optim.warmup_note(cfg.replace(warmup_steps=19)) == ""
