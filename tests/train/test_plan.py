"""A run planned in steps or tokens: it stops at its last step, its learning rate is nanoGPT's at every
step, it prints step lines and evaluates every ``eval_every_steps``."""
import json
import math

import numpy as np
import pytest
import tensorflow as tf

from lmkit.config import TrainConfig
from lmkit.models import build_model
from lmkit.train import Trainer
from tests.optim.test_policy import _nanogpt_get_lr

VOCAB = 30


def _config(**kw):
    values = dict(model="transformer", vocab_size=VOCAB, hidden_size=16, num_layers=1, num_heads=2, ffn_dim=32,
                  max_positions=8, init_scale=0.05, dropout=0.0, batch_size=4, num_steps=8, learning_rate=1e-2,
                  optimizer="adamw", max_grad_norm=1.0, schedule="cosine", seed=5)
    values.update(kw)
    return TrainConfig.from_dict(values)


def _ids(n=800):
    return (np.arange(n, dtype=np.int32) * 7 + np.arange(n) // 13) % VOCAB


def _fit(cfg, logged, model_dir=None, **fit):
    tf.random.set_seed(0)
    trainer = Trainer(build_model(cfg.model_config()), cfg, model_dir=model_dir, log=logged.append,
                      record_step_losses=True)
    rates = []
    step = trainer.train_step

    def recorded(*args, **kwargs):  # the rate each step applied (assigned inside the step, before the update)
        out = step(*args, **kwargs)
        rates.append(float(trainer.optimizer.learning_rate.numpy()))
        return out

    trainer.train_step = recorded
    return trainer, trainer.fit(_ids(), _ids(200), **fit), rates


def test_a_run_in_steps_applies_nanogpts_rate_at_every_step_and_stops_at_the_last(tmp_path):
    # 24 steps an epoch: 30 steps go one epoch and 6 steps into the second, the decay ending at step 30.
    cfg = _config(max_steps=30, warmup_steps=5, min_lr=1e-3)
    logged = []
    trainer, result, rates = _fit(cfg, logged, str(tmp_path))
    want = [_nanogpt_get_lr(s, 1e-2, 5, 30, 1e-3) for s in range(30)]
    np.testing.assert_allclose(rates, want, rtol=1e-5)
    assert result.global_step == 30 and len(result.step_losses) == 30
    assert [e.epoch for e in result.epochs] == [1, 2]
    lines = [line for line in logged if line.startswith("step ")]
    assert lines[-1].startswith("step 30/30 | loss ") and f"| lr {rates[-1]:.3g} |" in lines[-1]
    assert "tokens/s" in lines[-1] and "| MFU " in lines[-1] and "| eta " in lines[-1]
    assert not any(line.startswith("epoch ") for line in logged)  # no epoch bar in a plan in steps
    with open(tmp_path / "results.json") as f:
        assert json.load(f)["global_step"] == 30


def test_changing_max_steps_moves_the_decays_end():
    short, logged = _config(max_steps=10, warmup_steps=2, min_lr=0.0), []
    _, _, rates = _fit(short, logged)
    np.testing.assert_allclose(rates, [_nanogpt_get_lr(s, 1e-2, 2, 10, 0.0) for s in range(10)], rtol=1e-5)


def test_a_run_in_tokens_stops_at_the_step_that_covers_them():
    # 4 x 8 = 32 tokens a step: 100 tokens need ceil(100 / 32) = 4 steps.
    cfg, logged = _config(max_tokens=100), []
    assert cfg.planned_steps == 4
    _, result, _ = _fit(cfg, logged)
    assert result.global_step == 4
    assert any("4 steps (128 tokens; 1 epoch(s))" in line for line in logged), logged


def test_evaluations_every_few_steps_read_a_fixed_sample(tmp_path):
    cfg, logged = _config(max_steps=10, eval_every_steps=5, eval_steps=2, eval_batch_size=2), []
    trainer, result, _ = _fit(cfg, logged)
    assert [v["step"] for v in result.validations] == [5, 10]
    assert [line.split(" | ")[0] for line in logged if "val loss" in line] == ["step 5/10", "step 10/10"]
    # The sample is the validation stream's first 2 batches of 2 rows x 8 steps, evaluated as a whole stream is
    # (the last evaluation is after the last step: the model as it is now).
    sample = _ids(200)[:2 * (2 * 8 + 1)]  # 2 rows of 2 x 8 inputs and the last one's target
    assert result.validations[-1]["valid_loss"] == pytest.approx(trainer.evaluate_loss(sample), rel=1e-6)
    assert trainer.evaluate_loss(_ids(200)) != pytest.approx(trainer.evaluate_loss(sample), rel=1e-6)


def test_fit_max_steps_still_stops_a_run_planned_in_epochs():
    cfg, logged = _config(num_epochs=3), []
    _, result, rates = _fit(cfg, logged, max_steps=7)
    assert result.global_step == 7
    # The schedule is the plan's (a cosine over 3 epochs of 24 steps), not the stop's.
    assert rates[6] == pytest.approx(1e-2 * 0.5 * (1 + math.cos(math.pi * 6 / 72)), rel=1e-5)
