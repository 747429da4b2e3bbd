"""Gradient accumulation in one process: k micro-batches train like one batch of the same global size.

Dropout is off, so a run with ``grad_accum_steps = 4`` must reproduce the
per-step losses and final variables of ``grad_accum_steps = 1`` up to
float32 rounding (the sums run in another order), for every optimizer, with
sparse and dense embedding gradients, with clipping and a warmup schedule
active (they must see optimizer steps, not micro-batches).
"""
import numpy as np
import pytest
import tensorflow as tf

from lmkit import distributed as dist
from lmkit.config import ConfigError, TrainConfig
from lmkit.core.errors import UsageError
from lmkit.models import build_model
from lmkit.train import Trainer
from lmkit.train.accumulation import accumulate_gradients, micro_batch_rows
from tests.helpers import assert_relatively_close
from tests.scripts.train_probe import probe_ids

STEPS = 30
OPTIMIZERS = ["sgd", "momentum", "adam", "adamw", "novograd", "lamb", "larc"]


@pytest.fixture(autouse=True, scope="module")
def _init():
    dist.init(backend="local")


def _config(optimizer="sgd", k=1, **kw):
    larc = optimizer == "larc"
    values = dict(model="lstm", vocab_size=50, hidden_size=16, num_layers=2, init_scale=0.1, keep_prob=1.0,
                  batch_size=8, num_steps=6, num_epochs=100,
                  learning_rate=0.5 if optimizer in ("sgd", "larc") else 0.01,
                  optimizer="sgd" if larc else optimizer,
                  larc_params={"larc_eta": 0.02, "larc_mode": "clip"} if larc else None,
                  # clipping active (the norm is above 0.5 early on) and a warmup over the first steps
                  max_grad_norm=0.5, warmup_epochs=0.3, grad_accum_steps=k, num_heads=2, max_positions=16)
    values.update(kw)
    return TrainConfig.from_dict(values)


def _train(cfg, steps=STEPS):
    tf.random.set_seed(7)
    model = build_model(cfg.model_config())
    trainer = Trainer(model, cfg, record_step_losses=True, log=lambda s: None)
    trainer.initial_values = [v.numpy() for v in model.trainable_variables]
    result = trainer.fit(probe_ids(3000), max_steps=steps)
    return np.array(result.step_losses), [v.numpy() for v in model.trainable_variables], trainer


def _moved(run):
    """The largest change of any variable over the run (the comparison means something only if large)."""
    _, final, trainer = run
    return max(float(np.max(np.abs(a - b))) for a, b in zip(final, trainer.initial_values))


def _assert_same(big, accumulated, rtol=1e-5):
    losses1, vars1, t1 = big
    losses4, vars4, t4 = accumulated
    assert len(losses1) == len(losses4) == STEPS
    np.testing.assert_allclose(losses4, losses1, rtol=rtol)
    for i, (a, b) in enumerate(zip(vars4, vars1)):
        assert_relatively_close(a, b, rtol, f"variable {i}")
    for i, (a, b) in enumerate(zip(t4.optimizer.variables, t1.optimizer.variables)):
        assert_relatively_close(a.numpy(), b.numpy(), rtol, f"optimizer variable {i} ({a.name})")
    # The schedule saw optimizer steps: the same global step and learning rate.
    assert int(t4.progress.global_step.numpy()) == int(t1.progress.global_step.numpy()) == STEPS
    assert float(t4.optimizer.learning_rate.numpy()) == float(t1.optimizer.learning_rate.numpy())


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_four_micro_batches_train_like_one_batch(optimizer):
    big = _train(_config(optimizer, k=1))
    accumulated = _train(_config(optimizer, k=4))
    assert _moved(big) > 1e-3  # 10,000 x the tolerance: the runs really trained
    _assert_same(big, accumulated)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_accumulation_with_sparse_as_dense(optimizer):
    _assert_same(_train(_config(optimizer, k=1, sparse_as_dense=True)),
                 _train(_config(optimizer, k=4, sparse_as_dense=True)))


def test_transformer_accumulates_too():
    cfg = dict(model="transformer", learning_rate=0.1)
    _assert_same(_train(_config("sgd", k=1, **cfg)), _train(_config("sgd", k=2, **cfg)))


def test_accumulated_gradients_equal_the_big_batch_and_stay_sparse():
    tf.random.set_seed(3)
    model = build_model(_config().model_config())
    variables = list(model.trainable_variables)
    ids = tf.constant(probe_ids(8 * 7)[:56].reshape(8, 7))
    x, y = ids[:, :6], ids[:, 1:]
    state = model.initial_state(8)

    def micro(xb, yb, sb):
        with tf.GradientTape() as tape:
            logits, new_state = model(xb, sb, training=True)
            from lmkit.train.losses import window_loss
            loss = window_loss(yb, logits)
        return loss, tape.gradient(loss, variables), new_state

    loss1, grads1, state1 = micro(x, y, state)
    loss4, grads4, state4 = tf.function(lambda: accumulate_gradients(micro, x, y, state, 4))()
    np.testing.assert_allclose(loss4.numpy(), loss1.numpy(), rtol=1e-6)
    sparse = [i for i, g in enumerate(grads1) if isinstance(g, tf.IndexedSlices)]
    assert sparse, "the embedding gradient should be sparse"
    for i, (a, b) in enumerate(zip(grads4, grads1)):
        assert isinstance(a, tf.IndexedSlices) == isinstance(b, tf.IndexedSlices), i
        np.testing.assert_allclose(tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy(),
                                   rtol=1e-5, atol=1e-8, err_msg=f"gradient {i}")
    # Each row block carried its own state: the new state of all rows is the big batch's.
    for a, b in zip(tf.nest.flatten(state4), tf.nest.flatten(state1)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)


def test_micro_batch_rows_and_its_error():
    assert micro_batch_rows(32, 2, 4) == 4
    with pytest.raises(UsageError, match=r"batch_size 20 does not split into 2 worker\(s\) x grad_accum_steps "
                                         r"4 = 8 .*multiple of 8 \(e.g. 16 or 24\)"):
        micro_batch_rows(20, 2, 4)


@pytest.mark.parametrize("values, match", [
    ({"grad_accum_steps": 0}, r"grad_accum_steps = 0 must be >= 1"),
    ({"grad_accum_steps": 3}, r"grad_accum_steps = 3 does not divide batch_size = 8"),
    ({"grad_accum_steps": 2.0}, r"grad_accum_steps = 2.0 must be an integer"),
])
def test_bad_accumulation_settings_are_config_errors(values, match):
    with pytest.raises(ConfigError, match=match):
        _config(**values)


def test_trainer_refuses_micro_batches_that_do_not_split_over_replicas(monkeypatch):
    cfg = _config(batch_size=4, grad_accum_steps=4)
    model = build_model(cfg.model_config())
    assert Trainer(model, cfg, log=lambda s: None).micro_batch == 1  # one worker: 4 micro-batches of 1
    monkeypatch.setattr(dist, "num_replicas", lambda: 2)  # what 2 workers would give
    with pytest.raises(UsageError, match=r"batch_size 4 does not split into 2 worker\(s\) x grad_accum_steps 4"):
        Trainer(model, cfg, log=lambda s: None)
