"""CheckpointManager: atomic saves, rotation, and a kill during a save."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from lmkit.train.checkpoint import CheckpointManager
from tests.helpers import ROOT, subprocess_env


class _Box(tf.Module):
    def __init__(self, n=4):
        super().__init__()
        self.w = tf.Variable(tf.zeros([n]), name="w")


def test_save_restore_and_keep_last_k(tmp_path):
    box = _Box()
    mgr = CheckpointManager(str(tmp_path), tf.train.Checkpoint(box=box), keep=2)
    assert mgr.latest() is None
    for step in (10, 20, 30):
        box.w.assign(tf.fill([4], float(step)))
        mgr.save(step, meta={"epoch": step // 10})
    assert [s for s, _ in mgr.all()] == [20, 30]
    box.w.assign(tf.zeros([4]))
    meta = mgr.restore(mgr.latest())
    assert meta["step"] == 30 and meta["epoch"] == 3
    np.testing.assert_array_equal(box.w.numpy(), np.full([4], 30.0))


def test_incomplete_checkpoint_folders_are_ignored_and_cleaned(tmp_path):
    box = _Box()
    mgr = CheckpointManager(str(tmp_path), tf.train.Checkpoint(box=box), keep=3)
    mgr.save(1)
    # What a killed save leaves behind: a temporary folder, and a final-looking
    # folder without its meta.json (never produced by save, but be safe).
    os.makedirs(tmp_path / "ckpt-000000002.tmp-999")
    os.makedirs(tmp_path / "ckpt-000000003")
    assert mgr.latest().endswith("ckpt-000000001")
    mgr.save(4)
    assert not (tmp_path / "ckpt-000000002.tmp-999").exists()
    assert [s for s, _ in mgr.all()] == [1, 4]


def test_restore_into_a_different_shape_is_a_clear_error(tmp_path):
    from lmkit.errors import CheckpointError
    CheckpointManager(str(tmp_path), tf.train.Checkpoint(box=_Box(4))).save(1)
    mgr = CheckpointManager(str(tmp_path), tf.train.Checkpoint(box=_Box(5)))
    with pytest.raises(CheckpointError, match="does not match"):
        mgr.restore(mgr.latest())


SAVER = r"""
import os, sys, time
import tensorflow as tf
from lmkit.train.checkpoint import CheckpointManager
box = tf.Module(); box.w = tf.Variable(tf.zeros([256, 1024]))  # 1 MiB
mgr = CheckpointManager(sys.argv[1], tf.train.Checkpoint(box=box), keep=5)
box.w.assign(tf.fill([256, 1024], 1.0)); mgr.save(1)
print("first saved", flush=True)
orig = tf.train.Checkpoint.write
def slow_write(self, prefix, options=None):
    out = orig(self, prefix, options)
    print("in the middle of a save", flush=True)
    time.sleep(60)          # the test kills us here
    return out
tf.train.Checkpoint.write = slow_write
box.w.assign(tf.fill([256, 1024], 2.0)); mgr.save(2)
"""


def test_sigkill_during_a_save_leaves_the_previous_checkpoint(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", SAVER, str(tmp_path)], cwd=ROOT, env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        lines = []
        while time.time() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "in the middle of a save" in line:
                break
        assert "in the middle of a save" in "".join(lines), proc.stderr.read() if proc.poll() is not None else lines
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    box = _Box(1)
    box.w = tf.Variable(tf.zeros([256, 1024]))
    mgr = CheckpointManager(str(tmp_path), tf.train.Checkpoint(box=box))
    assert mgr.latest().endswith("ckpt-000000001")
    mgr.restore(mgr.latest())
    assert float(box.w.numpy().mean()) == 1.0


def test_a_stored_run_with_model_params_resumes_and_changed_adapters_are_named(tmp_path):
    """model_params (every Llama run's) compare as model_config() merges them; LoRA keys must not change."""
    from lmkit.config import load_config
    from lmkit.errors import CheckpointError
    from lmkit.train.startup import _check_stored
    from lmkit.fileio import atomic_write_text
    from lmkit.layout import CONFIG_FILE

    config = load_config("config_transformer", {"model_params": {"position_embedding": "sinusoid"}})
    atomic_write_text(str(tmp_path / CONFIG_FILE), config.to_json())
    _check_stored(str(tmp_path), config, None)  # the same run: no error
    for change, message in (({"model_params": {"position_embedding": "learned"}},
                             "position_embedding = 'sinusoid', but the config says 'learned'"),
                            ({"lora_alpha": 32.0}, "lora_alpha = 16.0, but the config says 32.0")):
        with pytest.raises(CheckpointError, match=message):
            _check_stored(str(tmp_path), config.replace(**change), None)
