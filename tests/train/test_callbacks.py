"""Callbacks see every step and evaluation, and stop a run or ask for a checkpoint, on one rank or several."""
import json
import math
import os

import numpy as np
import pytest
import tensorflow as tf

from lmkit.models import build_model
from lmkit.train import Callback, Trainer
from lmkit.train.callbacks import CallbackList
from tests.helpers import ROOT, mpirun_cmd, run
from tests.train.test_trainer import _config, _ids


class Recorder(Callback):
    """Records what it is told; asks for a stop or a save after given steps."""

    def __init__(self, stop_after=0, save_after=0):
        self.stop_after, self.save_after = stop_after, save_after
        self.steps, self.evals, self.ends = [], [], []

    def on_step_end(self, info, control):
        self.steps.append(info)
        if info.step == self.stop_after:
            control.should_stop = True
        if info.step == self.save_after:
            control.should_save = True

    def on_eval_end(self, info, control):
        self.evals.append(info)

    def on_train_end(self, result, control):
        self.ends.append(result)


def _fit(tmp_path, callbacks, **fit):
    cfg = _config(keep_prob=1.0, num_epochs=2)
    tf.random.set_seed(11)
    trainer = Trainer(build_model(cfg.model_config()), cfg, model_dir=str(tmp_path / "m"), log=lambda s: None,
                      record_step_losses=True, callbacks=callbacks)
    return trainer, trainer.fit(_ids(), _ids(300, seed=1), **fit)


def _metas(tmp_path):
    folder = tmp_path / "m" / "checkpoints"
    return [json.loads((folder / name / "meta.json").read_text()) for name in sorted(os.listdir(folder))]


def test_the_hooks_see_every_step_each_evaluation_and_the_end(tmp_path):
    recorder = Recorder()
    trainer, result = _fit(tmp_path, [recorder])
    assert [i.step for i in recorder.steps] == list(range(1, 2 * 59 + 1))  # 59 steps an epoch
    assert [(i.epoch, i.step_in_epoch) for i in recorder.steps[57:61]] == [(0, 58), (0, 59), (1, 1), (1, 2)]
    # record_step_losses reads every step back: each hook gets its step's loss per token.
    losses = [i.loss for i in recorder.steps]
    np.testing.assert_allclose(losses, np.array(result.step_losses) / 5, rtol=1e-6)  # 5 = num_steps
    assert [(e.epoch, e.step) for e in recorder.evals] == [(1, 59), (2, 118)]
    assert [e.perplexity for e in recorder.evals] == [s.valid_perplexity for s in result.epochs]
    assert recorder.ends == [result] and all(i.rank == 0 for i in recorder.steps)


def test_a_loss_not_read_back_is_none():
    cfg = _config(keep_prob=1.0, num_epochs=1, log_every_steps=10)
    recorder = Recorder()
    Trainer(build_model(cfg.model_config()), cfg, log=lambda s: None, callbacks=[recorder]).fit(_ids())
    read = [i.step for i in recorder.steps if i.loss is not None]
    assert read == [1, 11, 21, 31, 41, 51, 59]  # the first step (it compiles), then every 10, the epoch's last
    assert all(math.isfinite(i.loss) for i in recorder.steps if i.loss is not None)


def test_a_stop_ends_the_run_two_steps_later_with_a_checkpoint(tmp_path):
    recorder = Recorder(stop_after=20)
    trainer, result = _fit(tmp_path, [recorder])
    # Asked after step 20: step 21 carries the request, the ranks decide on it after step 22 started.
    assert result.global_step == 22 and recorder.steps[-1].step == 22
    (meta,) = _metas(tmp_path)
    assert (meta["step"], meta["epoch"], meta["steps_in_epoch"], meta["stopped_by"]) == (22, 0, 22, "a callback")
    assert len(result.epochs) == 1 and result.epochs[0].steps == 22 and recorder.ends == [result]
    # The same command again continues from there (nothing asks to stop this time).
    _, rest = _fit(tmp_path, [])
    assert rest.resumed_from.endswith("ckpt-000000022") and rest.global_step == 118


def test_a_save_request_writes_a_checkpoint_and_training_goes_on(tmp_path):
    _, result = _fit(tmp_path, [Recorder(save_after=30)], num_epochs=1)
    assert [(m["step"], m.get("saved_by")) for m in _metas(tmp_path)] == [(32, "schedule"), (59, None)]
    assert result.global_step == 59


def test_callbacks_must_be_callback_objects():
    with pytest.raises(TypeError, match="callbacks= takes lmkit.train.callbacks.Callback objects, not function"):
        CallbackList([lambda info, control: None])
    quiet = CallbackList([Callback()])
    quiet.step_end(None)
    quiet.eval_end(None)
    quiet.train_end(None)  # every hook is a no-op until overridden
    assert not quiet.control.should_stop and not quiet.control.should_save


@pytest.mark.horovod
@pytest.mark.mpi
def test_a_callback_on_one_rank_ends_every_rank_at_the_same_step(tmp_path):
    prefix = str(tmp_path / "probe")
    cmd = mpirun_cmd(2, [f"{ROOT}/tests/scripts/train_probe.py", "--out", prefix, "--steps", "40",
                         "--stop_after", "12", "--stop_rank", "1", "--model_dir", str(tmp_path / "m")])
    res = run(cmd, timeout=400)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    seen = []
    for rank in (0, 1):
        with open(f"{prefix}.rank{rank}.json") as f:
            seen.append(json.load(f)["steps"])
    assert seen == [14, 14]  # rank 1 asked after step 12; both ended after step 14, no hang
    assert [m["stopped_by"] for m in _metas(tmp_path)] == ["a callback"]

