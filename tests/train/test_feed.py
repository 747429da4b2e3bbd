"""device_prefetch (lmkit.train.feed): windows made ahead on a thread of their own, flags kept on the device; the
same training, window for window, as without it (on a CPU, where the copies are no copies)."""
import os
import threading

import numpy as np
import pytest
import tensorflow as tf

from lmkit.config import ConfigError, TrainConfig
from lmkit.models import build_model
from lmkit.train import Trainer
from lmkit.train.feed import WindowFeed, feed_device, flag_tensors
from tests.scripts.train_probe import ProbeSpecials, probe_pairs


class _Logged:
    """Windows (inputs, targets) of 2 x 3 ids; records which index was made on which thread."""

    def __init__(self, n):
        self.n = n
        self.made = []
        self.lock = threading.Lock()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with self.lock:
            self.made.append((i, threading.current_thread().name))
        return np.full((2, 3), i, np.int32), {"y": np.full((2, 3), 10 * i, np.int32)}


def test_the_feed_makes_the_windows_ahead_on_its_own_thread():
    batches = _Logged(6)
    with WindowFeed(batches, "/CPU:0", ahead=2) as feed:
        x, y = feed.get(0)
        assert x.numpy().tolist() == [[0] * 3] * 2 and y["y"].numpy()[0, 0] == 0
        assert "CPU" in x.device
        for i in (1, 2, 3):
            x, y = feed.get(i)
            assert int(x.numpy()[0, 0]) == i and int(y["y"].numpy()[1, 2]) == 10 * i
        x, _ = feed.get(5)  # a skip (a resume): the windows in between are dropped, the asked one made
        assert int(x.numpy()[0, 0]) == 5
    made = [i for i, _ in batches.made]
    assert made[:3] == [0, 1, 2] and set(made) <= set(range(6)) and made.count(5) == 1
    assert all(name.startswith("lmkit-feed") for _, name in batches.made)
    assert all(made.count(i) == 1 for i in set(made))  # each window made once
    with pytest.raises(ValueError, match="ahead 0 must be >= 1"):
        WindowFeed(batches, "/CPU:0", ahead=0)


def test_flags_are_made_once_per_value():
    flags = flag_tensors("/CPU:0")
    a, b, c = flags(0.0, 0.0)
    assert a is b is c and float(a) == 0.0 and a.dtype == tf.float32
    d, e, f = flags(1, 0.0, 1.0)
    assert float(d) == 1.0 and e is a and f is d
    assert flags(1.0, 1.0)[1] is d
    assert feed_device() == "/CPU:0"  # no GPU here: the host


def _lm_config(**changes):
    values = dict(model="transformer", vocab_size=40, hidden_size=16, num_layers=1, num_heads=2, max_positions=8,
                  batch_size=4, num_steps=8, num_epochs=1, learning_rate=0.01, optimizer="adam", keep_prob=1.0,
                  max_grad_norm=1.0, init_scale=0.1, seed=5)
    values.update(changes)
    return TrainConfig.from_dict(values)


def _losses(cfg, data, model_dir=None, **fit):
    tf.random.set_seed(7)
    trainer = Trainer(build_model(cfg.model_config()), cfg, model_dir=model_dir, record_step_losses=True,
                      vocab=ProbeSpecials() if cfg.data == "pairs" else None, log=lambda s: None)
    return trainer.fit(data, **fit).step_losses


def test_training_with_device_prefetch_is_the_same_training(tmp_path):
    ids = np.random.RandomState(0).randint(0, 40, 4 * 8 * 12 + 1).astype(np.int32)
    plain = _losses(_lm_config(num_epochs=2), ids)
    assert len(plain) == 2 * 12
    fed = _losses(_lm_config(num_epochs=2, device_prefetch=2), ids)
    np.testing.assert_allclose(fed, plain, rtol=1e-6)
    # stopped inside an epoch and resumed: the feed starts at the resumed window
    cfg = _lm_config(num_epochs=2, device_prefetch=3)
    first = _losses(cfg, ids, str(tmp_path / "cut"), max_steps=17)
    rest = _losses(cfg, ids, str(tmp_path / "cut"))
    assert len(first) == 17 and len(rest) == 7
    np.testing.assert_allclose(first + rest, plain, rtol=1e-6)
    # pairs: nests of windows (source, mask, target inputs), (target outputs, weights)
    pairs_cfg = dict(model="transformer_seq2seq", data="pairs", source_file="s.txt", target_file="t.txt",
                     source_vocab_size=50, vocab_size=50, share_embeddings=True, max_positions=16,
                     max_source_positions=16, num_steps=1, batch_size=8)
    pairs = probe_pairs(48)
    plain = _losses(_lm_config(**pairs_cfg), pairs)
    fed = _losses(_lm_config(**pairs_cfg, device_prefetch=1), pairs)
    assert len(plain) == 6
    np.testing.assert_allclose(fed, plain, rtol=1e-6)


@pytest.mark.parametrize("value", [-1, True, 1.5, "2"])
def test_a_bad_device_prefetch_is_named(value):
    with pytest.raises(ConfigError, match=r"device_prefetch = .* must be an integer"):
        _lm_config(device_prefetch=value)


class _Unreadable:
    """Stands for a step's agreed flags on a GPU: reading it would wait for every step queued."""

    def __array__(self, *args, **kwargs):
        raise AssertionError("a one-process run read the step's agreed flags back from the device")


@pytest.mark.parametrize("device_prefetch", [0, 2])
def test_one_process_decides_on_its_own_flags_without_reading_the_device(tmp_path, monkeypatch, device_prefetch):
    """A save asked for at a step (rank 0's clock) is taken one step later, as with the averaged flags, and the
    run never reads a step's flags back: on a GPU that read is a sync per step."""
    from lmkit.train import resume

    cfg = _lm_config(num_epochs=1, device_prefetch=device_prefetch)
    trainer = Trainer(build_model(cfg.model_config()), cfg, model_dir=str(tmp_path / "run"), log=lambda s: None)
    step = trainer.train_step
    monkeypatch.setattr(trainer, "train_step", lambda *a, **k: step(*a, **k)._replace(agreed=_Unreadable()))
    asked = []
    flags = resume.Boundaries.flags

    def save_at_step_3(self):
        stop, save, end = flags(self)
        asked.append(len(asked) + 1)
        return stop, (1.0 if len(asked) == 3 else save), end

    monkeypatch.setattr(resume.Boundaries, "flags", save_at_step_3)
    ids = np.random.default_rng(0).integers(0, 40, 400).astype(np.int32)
    result = trainer.fit(ids, max_steps=6)
    assert result.global_step == 6 and len(asked) == 6
    saved = sorted(os.listdir(tmp_path / "run" / "checkpoints"))
    assert any(name.endswith("000000004") for name in saved), saved  # asked at step 3, taken after step 4








