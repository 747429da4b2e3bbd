"""The training loop: where it stops and saves (max_steps, a usage error, every few steps), exact resume."""
import os

import numpy as np
import pytest
import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.models import build_model
from lmkit.train import Callback, Trainer
from tests.train.support import checkpoint_metas
from tests.train.support import small_config as _config
from tests.train.support import stream as _ids
from tests.train.support import train as _train


def test_max_steps_inside_an_epoch_leaves_a_checkpoint(tmp_path):
    cfg = _config(keep_prob=1.0)
    model_dir = str(tmp_path / "m")
    tf.random.set_seed(11)
    trainer = Trainer(build_model(cfg.model_config()), cfg, model_dir=model_dir, log=lambda s: None)
    result = trainer.fit(_ids(), max_steps=7)
    (meta,) = checkpoint_metas(model_dir)
    assert (meta["step"], meta["stopped_by"], meta["steps_in_epoch"], meta["epoch"]) == (7, "max_steps", 7, 0)
    assert result.checkpoint.endswith("ckpt-000000007") and result.global_step == 7


def test_a_usage_error_after_training_began_keeps_what_was_trained(tmp_path):
    from lmkit.data import DataError

    class BadValidation(Trainer):
        def evaluate_loss(self, ids):
            raise DataError("the validation file vanished")

    cfg = _config(keep_prob=1.0)
    model_dir = str(tmp_path / "m")
    trainer = BadValidation(build_model(cfg.model_config()), cfg, model_dir=model_dir, log=lambda s: None)
    with pytest.raises(DataError, match="vanished"):
        trainer.fit(_ids(), _ids(300, seed=1))
    (meta,) = checkpoint_metas(model_dir)
    assert meta["stopped_by"] == "a usage error" and meta["step"] == int(trainer.progress.global_step.numpy()) > 0


def test_eval_data_too_small_fails_before_training(tmp_path):
    cfg = _config(keep_prob=1.0)
    trainer = Trainer(build_model(cfg.model_config()), cfg, model_dir=str(tmp_path / "m"), log=lambda s: None)
    with pytest.raises(UsageError, match="the valid data has 10 tokens, too few for one evaluation batch"):
        trainer.fit(_ids(), _ids(10))
    assert not os.path.exists(tmp_path / "m")
    assert int(trainer.progress.global_step.numpy()) == 0


@pytest.mark.parametrize("model", ["lstm", "transformer"])
def test_resume_inside_an_epoch_is_exact_with_dropout_on(tmp_path, model):
    cfg = _config(keep_prob=0.7, model=model, num_heads=2)
    straight, _, _ = _train(cfg, str(tmp_path / "a"), 2)
    interrupted = str(tmp_path / "b")
    tf.random.set_seed(11)
    first = Trainer(build_model(cfg.model_config()), cfg, model_dir=interrupted, log=lambda s: None)
    first.fit(_ids(), _ids(300, seed=1), num_epochs=2, max_steps=37)  # inside epoch 1 (59 steps)
    (meta,) = checkpoint_metas(interrupted)
    assert (meta["step"], meta["epoch"], meta["steps_in_epoch"]) == (37, 0, 37)
    assert ("rnn_state.npz" in os.listdir(first.loop.checkpoints.manager.latest())) == (model == "lstm")
    resumed, _, result = _train(cfg, interrupted, 2, seed=999)  # the init seed must not matter
    assert result.resumed_from and result.epochs[0].steps == 59 - 37
    for a, b in zip(straight.trainable_variables, resumed.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6, err_msg=a.name)


def test_checkpoints_every_steps_keep_the_last_few(tmp_path):
    cfg = _config(keep_prob=1.0, checkpoint_every_steps=10, keep_checkpoints=2, num_epochs=1)
    model_dir = str(tmp_path / "m")
    _train(cfg, model_dir, 1)
    steps = [m["step"] for m in checkpoint_metas(model_dir)]
    assert steps == [50, 59]  # every 10 steps, the epoch's end; the folder keeps 2
    assert [m.get("saved_by") for m in checkpoint_metas(model_dir)] == ["schedule", None]


class _AskAtStep(Callback):
    """Asks for a save or a stop after a given step, so that the ranks decide on it at an epoch's last step."""

    def __init__(self, step, stop):
        self.step, self.stop = step, stop

    def on_step_end(self, info, control):
        if info.step == self.step:
            control.should_stop, control.should_save = self.stop, not self.stop


@pytest.mark.parametrize("stop", [False, True])
def test_a_request_decided_at_an_epochs_last_step_is_the_epochs_checkpoint(tmp_path, stop):
    """Asked after step 57 of 59: decided after step 59 starts, the epoch's own end saves it (every epoch
    would not save here: checkpoint_every_epochs = 2)."""
    cfg = _config(keep_prob=1.0, checkpoint_every_epochs=2, num_epochs=3)
    model_dir = str(tmp_path / "m")
    _, _, result = _train(cfg, model_dir, 3, callbacks=[_AskAtStep(57, stop)])
    metas = checkpoint_metas(model_dir)
    assert (metas[0]["step"], metas[0]["epoch"], metas[0]["steps_in_epoch"]) == (59, 1, 0)
    if stop:  # the run ends there: no epoch 2
        assert metas[0]["stopped_by"] == "a callback" and len(metas) == 1 and result.global_step == 59
    else:  # then every 2 epochs and the last
        assert "stopped_by" not in metas[0] and [m["step"] for m in metas] == [59, 118, 177]


def test_no_resume_starts_again_and_keeps_writing_there(tmp_path):
    model_dir = str(tmp_path / "m")
    cfg = _config(keep_prob=1.0)
    _train(cfg, model_dir, 1)
    _, _, result = _train(cfg, model_dir, 1, resume=False)
    assert result.resumed_from is None and result.global_step == 59  # from step 0 again
    assert [m["step"] for m in checkpoint_metas(model_dir)] == [59]  # its own checkpoint replaced the first
