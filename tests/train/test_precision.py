"""Mixed precision in one process: dtypes inside the model, training, dynamic loss scaling, resume."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from lmkit import distributed as dist
from lmkit.config import ConfigError, TrainConfig
from lmkit.core.errors import NonFiniteError
from lmkit.layers import precision
from lmkit.layers.norms import LayerNorm
from lmkit.models import build_model
from lmkit.train import Trainer
from tests.scripts.gradient_bomb import GradientBomb
from tests.scripts.train_probe import probe_ids


@pytest.fixture(autouse=True, scope="module")
def _init():
    dist.init(backend="local")


def _config(model="lstm", precision_name="float32", **kw):
    # Settings under which each model learns visibly within 50 steps of this tiny corpus.
    values = dict(model=model, vocab_size=50, hidden_size=16, num_layers=2, init_scale=0.1, keep_prob=1.0,
                  batch_size=8, num_steps=6, num_epochs=100, optimizer="adam" if model == "lstm" else "sgd",
                  learning_rate=0.03 if model == "lstm" else 0.1,
                  max_grad_norm=5.0, num_heads=2, max_positions=16, precision=precision_name)
    values.update(kw)
    return TrainConfig.from_dict(values)


def _train(cfg, steps=50, bomb=None, model_dir=None, seed=7):
    tf.random.set_seed(seed)
    model = build_model(cfg.model_config())
    if bomb is not None:
        model = GradientBomb(model, **bomb)
    trainer = Trainer(model, cfg, model_dir=model_dir, record_step_losses=True, log=lambda s: None)
    result = trainer.fit(probe_ids(3000), max_steps=steps)
    return np.array(result.step_losses), model, trainer, result


@pytest.mark.parametrize("name, dtype", [("mixed_bfloat16", tf.bfloat16), ("mixed_float16", tf.float16)])
def test_the_model_computes_in_the_policy_dtype_and_keeps_float32_where_it_matters(name, dtype):
    for model_name in ("lstm", "transformer"):
        model = build_model(_config(model_name).model_config())
        ids = tf.constant(probe_ids(48).reshape(8, 6))
        state = model.initial_state(8) if model.stateful else None
        with tf.GradientTape() as tape, precision.scope(name):
            assert precision.compute_dtype() == dtype
            embedded = model.embedder(ids)
            logits, new_state = model(ids, state, training=True)
            loss = tf.reduce_mean(logits)
        assert embedded.dtype == dtype  # the compute dtype from the first layer on
        assert logits.dtype == tf.float32  # the softmax runs in float32
        for s in tf.nest.flatten(new_state) if new_state is not None else []:
            assert s.dtype == tf.float32  # the carried state stays float32
        grads = tape.gradient(loss, model.trainable_variables)
        assert all(v.dtype == tf.float32 for v in model.trainable_variables)
        assert all(g is not None and g.dtype == tf.float32 for g in grads)
        # The low precision really was used: the logits differ from float32's by its rounding.
        reference, _ = model(ids, state, training=True)
        difference = float(tf.reduce_max(tf.abs(reference - logits)))
        assert 0 < difference < 0.05
    assert precision.compute_dtype() == tf.float32  # outside the scope


def test_layer_norm_statistics_run_in_float32():
    norm = LayerNorm(dim=8)
    x = tf.constant(np.random.RandomState(0).randn(4, 8) * 100 + 1000, tf.float32)
    low = tf.cast(x, tf.float16)
    out = norm(low)
    assert out.dtype == tf.float16
    # float16 variance of values near 1000 would overflow (1000**2 > 65504); float32 does not.
    np.testing.assert_allclose(out.numpy().astype(np.float32), norm(tf.cast(low, tf.float32)).numpy(),
                               atol=2e-3)


@pytest.mark.parametrize("model", ["lstm", "transformer"])
def test_mixed_precision_training_learns_like_float32(model):
    reference, _, _, _ = _train(_config(model))
    for name in ("mixed_bfloat16", "mixed_float16"):
        losses, _, trainer, result = _train(_config(model, name))
        finite = losses[np.isfinite(losses)]
        # float16: a few steps may overflow at the start, until the scale has settled.
        assert len(finite) >= 45 and (name == "mixed_float16" or len(finite) == 50)
        assert finite[-10:].mean() < finite[:10].mean() - 0.5  # it learns
        # Within 5% of float32's loss over the last 10 steps: rounding, and for float16 the
        # updates its first skipped steps did not make, not a different model.
        assert abs(finite[-10:].mean() - reference[-10:].mean()) < 0.05 * reference[-10:].mean()
        assert (result.loss_scale is not None) == (name == "mixed_float16")


def test_an_overflowing_step_is_skipped_and_training_goes_on(tmp_path):
    cfg = _config(precision_name="mixed_float16")
    losses, model, trainer, result = _train(cfg, steps=30, bomb={"at_call": 5})
    assert np.isnan(losses[4]) and np.isfinite(np.delete(losses, 4)).all()
    assert result.skipped_steps == 1 and result.loss_scale == 32768.0 / 2
    assert losses[-5:].mean() < losses[:4].mean()  # and it learned on
    # The skipped step changed nothing: the variables after step 5 are those after step 4.
    _, four, _, _ = _train(cfg, steps=4, bomb={"at_call": 5})
    _, five, _, _ = _train(cfg, steps=5, bomb={"at_call": 5})
    for a, b in zip(five.trainable_variables, four.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_resume_restores_the_loss_scale(tmp_path):
    cfg = _config(precision_name="mixed_float16")
    model_dir = str(tmp_path / "run")
    _, _, _, first = _train(cfg, steps=8, bomb={"at_call": 3}, model_dir=model_dir)
    assert first.loss_scale == 16384.0 and first.skipped_steps == 1
    # A fresh process (no bomb) resumes: the scale and the count continue.
    tf.random.set_seed(99)
    trainer = Trainer(GradientBomb(build_model(cfg.model_config())), cfg, model_dir=model_dir,
                      log=lambda s: None)
    result = trainer.fit(probe_ids(3000), max_steps=12)
    assert result.resumed_from is not None and result.global_step == 12
    assert result.loss_scale == 16384.0 and result.skipped_steps == 1
    with open(os.path.join(model_dir, "results.json")) as f:
        saved = json.load(f)
    assert saved["loss_scale"] == 16384.0 and saved["skipped_steps"] == 1


def test_skips_that_do_not_stop_end_training_with_the_non_finite_error():
    cfg = _config(precision_name="mixed_float16", max_consecutive_skips=3)
    with pytest.raises(NonFiniteError, match=r"3 steps in a row had non-finite gradients .* loss scale fell "
                                             r"to 4096"):
        _train(cfg, steps=30, bomb={"every_call_from": 4})


def test_float32_still_stops_at_the_first_non_finite_step():
    with pytest.raises(NonFiniteError, match=r"non-finite loss or gradient .* step 4;"):
        _train(_config(), steps=30, bomb={"at_call": 4})


@pytest.mark.parametrize("values, match", [
    ({"precision": "fp16"}, r"precision = 'fp16' is not one of float32, mixed_bfloat16, mixed_float16"),
    ({"loss_scale": 0.0}, r"loss_scale = 0.0 must be > 0"),
    ({"max_consecutive_skips": 0}, r"max_consecutive_skips = 0 must be a positive integer"),
])
def test_bad_precision_settings_are_config_errors(values, match):
    with pytest.raises(ConfigError, match=match):
        _config(**values)
