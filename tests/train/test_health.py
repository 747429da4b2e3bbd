"""The non-finite and divergence checks on the losses read back: every rank stops at the same step."""
import math
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from lmkit.core.errors import NonFiniteError
from lmkit.models import build_model
from lmkit.train import Trainer
from tests.scripts.gradient_bomb import GradientBomb
from tests.train.support import VOCAB
from tests.train.support import small_config as _config
from tests.train.support import stream as _ids


def test_non_finite_loss_stops_with_epoch_and_step_and_keeps_last_good_checkpoint(tmp_path):
    # The non-finite value is forced (every gradient Inf from the first step of epoch 2 on):
    # a huge learning rate diverged to NaN on TF 2.18 but stayed finite (loss ~690) on 2.21.
    cfg = _config(keep_prob=1.0, num_epochs=3)
    model_dir = str(tmp_path / "m")

    def trainer(**bomb):
        tf.random.set_seed(11)
        model = GradientBomb(build_model(cfg.model_config()), **bomb)
        return Trainer(model, cfg, model_dir=model_dir, log=lambda s: None)

    trainer(at_call=-1).fit(_ids(), _ids(300, seed=1), num_epochs=1)
    ckpts = sorted(os.listdir(os.path.join(model_dir, "checkpoints")))
    with pytest.raises(NonFiniteError, match=r"non-finite loss or gradient .* at epoch 2, step 1;"):
        trainer(every_call_from=1).fit(_ids(), num_epochs=3)
    assert sorted(os.listdir(os.path.join(model_dir, "checkpoints"))) == ckpts


def test_a_diverging_finite_loss_stops_like_a_non_finite_one_and_keeps_the_last_good_checkpoint(tmp_path):
    cfg = _config(keep_prob=1.0, num_epochs=3)
    model_dir = str(tmp_path / "m")
    steps = len(Trainer(build_model(cfg.model_config()), cfg).epoch_batches(_ids(), 0))

    def trainer(from_call, config=cfg):
        tf.random.set_seed(11)
        return Trainer(GradientBomb(build_model(config.model_config()), blow_up_from=from_call), config,
                       model_dir=model_dir, log=lambda s: None, record_step_losses=True)

    first = trainer(10**9).fit(_ids(), num_epochs=1)
    assert max(first.step_losses) / 5 < 3 * np.log(VOCAB)  # per token (5 steps): a model that learns stays below
    ckpts = sorted(os.listdir(os.path.join(model_dir, "checkpoints")))
    bound = f"{3 * np.log(VOCAB):.2f}"
    with pytest.raises(NonFiniteError,
                       match=rf"the loss diverged: 10 steps in a row above {bound} per token \(divergence_factor 3 x "
                             rf"ln\(vocab_size {VOCAB}\).* at epoch 2, step 10; training stopped "
                             "and the last good checkpoint stays the latest"):
        trainer(steps + 1).fit(_ids(), num_epochs=3)
    assert sorted(os.listdir(os.path.join(model_dir, "checkpoints"))) == ckpts
    # Off: the same blow-up trains on (the checkpoints are then the run's own).
    off = cfg.replace(divergence_factor=0.0)
    shutil.rmtree(model_dir)
    result = trainer(3, off).fit(_ids(), num_epochs=1)
    assert min(result.step_losses[3:]) / 5 > 3 * np.log(VOCAB)


class _Step:
    """A step's result as the loop keeps it (plain values stand for the device's tensors)."""

    def __init__(self, loss, finite=True, applied=True):
        self.loss, self.finite, self.applied = loss, finite, applied


def test_the_pending_steps_are_read_back_together_and_a_skipped_one_is_none():
    from lmkit.train.health import PendingSteps

    pending = PendingSteps(_config(), loss_tokens=5)
    for loss, applied in ((10.0, True), (11.0, False), (9.0, True)):
        pending.add(_Step(loss, applied=applied))
    assert len(pending) == 3
    assert pending.read(epoch=0, last_index=2) == [10.0, None, 9.0] and len(pending) == 0


def test_a_divergence_counts_steps_in_a_row_and_names_where_it_stopped():
    from lmkit.train.health import PendingSteps, divergence_bound

    cfg = _config(divergence_factor=2.0, divergence_steps=3)
    bound = divergence_bound(cfg)
    assert bound == pytest.approx(2 * math.log(VOCAB))
    pending = PendingSteps(cfg, loss_tokens=5)
    high, low = 5 * (bound + 1), 5 * (bound - 1)  # summed over the window's 5 positions
    for loss in (high, high, low, high, high):  # a good step in between starts the count again
        pending.add(_Step(loss))
    assert len(pending.read(epoch=1, last_index=9)) == 5 and pending.diverging == 2
    pending.add(_Step(high))
    with pytest.raises(NonFiniteError, match=r"the loss diverged: 3 steps in a row above .* at epoch 2, step 11;"):
        pending.read(epoch=1, last_index=10)
    assert divergence_bound(_config(divergence_factor=0.0)) == math.inf  # off


def test_a_non_finite_step_stops_the_run_with_its_place_and_the_fix():
    from lmkit.train.health import PendingSteps

    pending = PendingSteps(_config(), loss_tokens=5)
    pending.add(_Step(3.0))
    pending.add(_Step(float("nan"), finite=False, applied=False))
    with pytest.raises(NonFiniteError, match=r"non-finite loss or gradient \(loss nan\) at epoch 1, step 4; the "
                                             "update was not applied"):
        pending.read(epoch=0, last_index=3)
    assert len(pending) == 0  # nothing is read twice
