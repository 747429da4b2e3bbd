"""CheckpointManager: atomic saves, rotation, and a kill during a save."""
import os
import re
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
    from lmkit.core.errors import CheckpointError
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


# ---------------------------------------------------------------- a checkpoint on disk before meta.json

def test_every_file_of_a_checkpoint_is_flushed_before_meta_json(tmp_path, monkeypatch):
    """meta.json marks a checkpoint complete: after a power cut its data and index must be there too."""
    import lmkit.train.checkpoint as checkpoint_module
    flushed, at_meta = [], []
    real_fsync = os.fsync

    def fsync(fd):
        flushed.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    real_write_text = checkpoint_module.atomic_write_text

    def write_text(path, text):
        if os.path.basename(path) == "meta.json":
            at_meta.extend(flushed)
        return real_write_text(path, text)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(checkpoint_module, "atomic_write_text", write_text)
    CheckpointManager(str(tmp_path), tf.train.Checkpoint(box=_Box())).save(1, files={"extra.bin": b"x"})
    assert {"ckpt.index", "ckpt.data-00000-of-00001"} <= set(at_meta), at_meta
    assert any(name.startswith("extra.bin") for name in at_meta), at_meta


# ---------------------------------------------------------------- a corrupt checkpoint

def _truncate_data(path):
    data = os.path.join(path, "ckpt.data-00000-of-00001")
    os.truncate(data, os.path.getsize(data) // 2)


def _flip_a_data_byte(path):
    data = os.path.join(path, "ckpt.data-00000-of-00001")
    raw = bytearray(open(data, "rb").read())
    raw[len(raw) // 2] ^= 0xFF
    open(data, "wb").write(bytes(raw))


DAMAGE = {
    "truncated data": (_truncate_data, r"IndexError: Read less bytes than requested"),
    "empty index": (lambda p: os.truncate(os.path.join(p, "ckpt.index"), 0), r"sstable"),
    "a flipped byte": (_flip_a_data_byte, r"[Cc]hecksum"),
    "data file gone": (lambda p: os.remove(os.path.join(p, "ckpt.data-00000-of-00001")),
                       r"No such file or directory"),
    "meta.json not JSON": (lambda p: open(os.path.join(p, "meta.json"), "w").write('{"step": 3'),
                           r"meta\.json: JSONDecodeError"),
}


def _three_checkpoints(tmp_path, n=64):
    box = _Box(n)
    mgr = CheckpointManager(str(tmp_path), tf.train.Checkpoint(box=box), keep=3)
    for step in (1, 2, 3):
        box.w.assign(tf.fill([n], float(step)))
        mgr.save(step, meta={"epoch": step})
    box.w.assign(tf.zeros([n]))
    return box, mgr


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_corrupt_latest_checkpoint_is_named_and_the_previous_one_is_used(tmp_path, damage):
    box, mgr = _three_checkpoints(tmp_path)
    hurt, reason = DAMAGE[damage]
    hurt(mgr.latest())
    lines = []
    path, meta, _ = mgr.restore_latest(lines.append)
    assert path.endswith("ckpt-000000002") and meta["step"] == 2
    np.testing.assert_array_equal(box.w.numpy(), np.full([64], 2.0))
    assert len(lines) == 2, lines
    assert re.fullmatch(rf"warning: checkpoint \S+/ckpt-000000003 is corrupt \(.*{reason}.*\); skipping it",
                        lines[0]), lines[0]
    assert re.fullmatch(r"warning: continuing from the previous complete checkpoint \S+/ckpt-000000002 "
                        r"\(step 2\) instead of the corrupt one\(s\) after it", lines[1]), lines[1]


def test_no_readable_checkpoint_is_one_clear_error(tmp_path):
    from lmkit.core.errors import CheckpointError
    _, mgr = _three_checkpoints(tmp_path)
    for _, path in mgr.all():
        _truncate_data(path)
    lines = []
    with pytest.raises(CheckpointError, match=r"none of the 3 checkpoint\(s\) in \S+ reads back: the newest, "
                                              r"checkpoint \S+/ckpt-000000003 is corrupt \(IndexError"):
        mgr.restore_latest(lines.append)
    assert len(lines) == 3 and all("is corrupt" in line for line in lines), lines


def test_a_newest_checkpoint_of_another_shape_is_an_error_not_a_fallback(tmp_path):
    """A changed config is the user's to fix: an older checkpoint that fits is not silently used instead."""
    from lmkit.core.errors import CheckpointError
    box, mgr = _three_checkpoints(tmp_path)
    CheckpointManager(str(tmp_path), tf.train.Checkpoint(box=_Box(65))).save(4)
    lines = []
    with pytest.raises(CheckpointError, match=r"ckpt-000000004 does not match the model or optimizer of this "
                                              r"config \(ValueError: .*shape"):
        mgr.restore_latest(lines.append)
    assert lines == []


def test_a_corrupt_carried_state_falls_back_too(tmp_path):
    from lmkit.train.resume import STATE_FILE, _read_state
    box = _Box()
    mgr = CheckpointManager(str(tmp_path), tf.train.Checkpoint(box=box))
    state = io_bytes_of_npz(np.arange(6.0))
    for step in (1, 2):
        box.w.assign(tf.fill([4], float(step)))
        mgr.save(step, files={STATE_FILE: state})
    latest = os.path.join(mgr.latest(), STATE_FILE)
    os.truncate(latest, os.path.getsize(latest) - 10)
    lines = []
    path, _, data = mgr.restore_latest(lines.append, read_more=_read_state)
    assert path.endswith("ckpt-000000001") and data == state
    assert "ckpt-000000002 is corrupt (rnn_state.npz: " in lines[0], lines


def io_bytes_of_npz(*arrays):
    import io
    buffer = io.BytesIO()
    np.savez(buffer, *arrays)
    return buffer.getvalue()


# ---------------------------------------------------------------- a full disk

def _disk_fills_in_write(tmp_path, monkeypatch, how):
    """Checkpoint writes that fail half-way as TensorFlow (or Python) does when the disk is full."""
    real_write = tf.train.Checkpoint.write

    def write(self, prefix, options=None):
        if how == "tensorflow":  # what SaveV2 raises on ENOSPC (measured on a 1 MB tmpfs, TF 2.18)
            os.makedirs(prefix + "_temp")
            with open(os.path.join(prefix + "_temp", "part-00000-of-00001.data-00000-of-00001"), "wb") as f:
                f.write(b"\0" * 5000)
            raise tf.errors.ResourceExhaustedError(
                None, None, f"{prefix}_temp/part-00000-of-00001.data-00000-of-00001.tempstate1; No space left "
                "on device [Op:SaveV2]")
        out = real_write(self, prefix, options)
        if how == "python":
            raise OSError(28, "No space left on device", prefix + ".data-00000-of-00001")
        return out

    monkeypatch.setattr(tf.train.Checkpoint, "write", write)


@pytest.mark.parametrize("how", ["tensorflow", "python"])
def test_a_full_disk_removes_the_partial_checkpoint_and_says_what_to_do(tmp_path, monkeypatch, how):
    from lmkit.core.errors import CheckpointError
    box = _Box(256)
    mgr = CheckpointManager(str(tmp_path), tf.train.Checkpoint(box=box), keep=1)
    box.w.assign(tf.fill([256], 1.0))
    first = mgr.save(1)
    before = tree_of(tmp_path)
    _disk_fills_in_write(tmp_path, monkeypatch, how)
    box.w.assign(tf.fill([256], 2.0))
    with pytest.raises(CheckpointError) as raised:
        mgr.save(2)
    text = str(raised.value)
    assert f"cannot write checkpoint {tmp_path}/ckpt-000000002: no space left on the disk of {tmp_path} (" in text
    assert re.search(r"\(\d+(\.\d)? [KMG]B free; a checkpoint needs about 1 KB, as the previous one\)", text), text
    assert f"the previous checkpoint {first} is kept" in text
    assert text.endswith("Free space on that disk and rerun the same command (it continues from there), or "
                         "pass a --model_dir on a disk with room")
    assert "\n" not in text
    assert tree_of(tmp_path) == before  # nothing of the failed save is left, the previous one untouched
    monkeypatch.undo()
    box.w.assign(tf.zeros([256]))
    mgr.restore(mgr.latest())
    assert float(box.w.numpy().mean()) == 1.0


def tree_of(folder):
    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                out[os.path.relpath(os.path.join(root, name), folder)] = f.read()
    return out


def test_another_write_error_is_one_clear_error_too(tmp_path, monkeypatch):
    from lmkit.core.errors import CheckpointError

    def write(self, prefix, options=None):
        raise tf.errors.PermissionDeniedError(None, None, f"{prefix}_temp; Permission denied")

    monkeypatch.setattr(tf.train.Checkpoint, "write", write)
    with pytest.raises(CheckpointError, match=r"cannot write checkpoint \S+/ckpt-000000001 \(PermissionDeniedError: "
                                              r"\S+; Permission denied\); the partial checkpoint was removed and "
                                              r"there is no earlier checkpoint. Check that \S+ is writable"):
        CheckpointManager(str(tmp_path), tf.train.Checkpoint(box=_Box())).save(1)
    assert os.listdir(tmp_path) == []


def test_leftovers_of_killed_saves_are_removed_before_the_next_save_needs_their_space(tmp_path, monkeypatch):
    mgr = CheckpointManager(str(tmp_path), tf.train.Checkpoint(box=_Box()))
    mgr.save(1)
    os.makedirs(tmp_path / "ckpt-000000002.tmp-999")
    seen = []
    real_write = tf.train.Checkpoint.write
    monkeypatch.setattr(tf.train.Checkpoint, "write",
                        lambda self, prefix, options=None: (seen.append(sorted(os.listdir(tmp_path))),
                                                            real_write(self, prefix, options))[1])
    mgr.save(2)
    assert seen == [["ckpt-000000001", "ckpt-000000002.tmp-%d" % os.getpid()]]


@pytest.fixture()
def small_tmpfs(tmp_path):
    """A 1.6 MB tmpfs (root only: CI runs as root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root; the monkeypatched full-disk tests cover the rest")
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1600k", "tmpfs", str(mount)],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (no CAP_SYS_ADMIN?): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=60)


def test_a_really_full_disk(small_tmpfs):
    """One 1 MiB checkpoint fits on the tmpfs, a second one does not: the first is kept, the space freed."""
    import shutil

    from lmkit.core.errors import CheckpointError
    box = tf.Module()
    box.w = tf.Variable(tf.fill([256, 1024], 1.0))
    folder = str(small_tmpfs / "checkpoints")
    mgr = CheckpointManager(folder, tf.train.Checkpoint(box=box), keep=1)
    first = mgr.save(1)
    free = shutil.disk_usage(folder).free
    box.w.assign(tf.fill([256, 1024], 2.0))
    with pytest.raises(CheckpointError, match=r"no space left on the disk of \S+ \(\d+ KB free; a checkpoint "
                                              r"needs about 1\.0 MB, as the previous one\)"):
        mgr.save(2)
    assert os.listdir(folder) == [os.path.basename(first)]
    assert shutil.disk_usage(folder).free == free  # the partial checkpoint's space is given back
    box.w.assign(tf.zeros([256, 1024]))
    mgr.restore(mgr.latest())
    assert float(box.w.numpy().mean()) == 1.0


# ---------------------------------------------------------------- re-saving a step

@pytest.mark.parametrize("exchange", ["renameat2", "two renames"])
def test_saving_a_step_again_replaces_it(tmp_path, monkeypatch, exchange):
    import lmkit.train.checkpoint as checkpoint_module
    used = []
    real = checkpoint_module._exchange
    monkeypatch.setattr(checkpoint_module, "_exchange",
                        lambda a, b: used.append(a) or (real(a, b) if exchange == "renameat2" else False))
    box = _Box()
    mgr = CheckpointManager(str(tmp_path), tf.train.Checkpoint(box=box), keep=1)
    box.w.assign(tf.fill([4], 1.0))
    mgr.save(7, meta={"epoch": 0})
    box.w.assign(tf.fill([4], 2.0))
    mgr.save(7, meta={"epoch": 1})
    assert len(used) == 1 and os.listdir(tmp_path) == ["ckpt-000000007"]
    box.w.assign(tf.zeros([4]))
    assert mgr.restore(mgr.latest())["epoch"] == 1
    assert float(box.w.numpy().mean()) == 2.0


def test_renameat2_exchanges_two_folders_where_the_system_can(tmp_path):
    from lmkit.train.checkpoint import _exchange
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_text("a")
    (tmp_path / "b").mkdir()
    if not _exchange(str(tmp_path / "a"), str(tmp_path / "b")):
        pytest.skip("no renameat2(RENAME_EXCHANGE) here: re-saves take two renames")
    assert os.listdir(tmp_path / "b") == ["x"] and os.listdir(tmp_path / "a") == []


def test_a_re_save_killed_between_its_renames_keeps_the_step(tmp_path):
    """Without an atomic exchange a re-save renames ckpt-N away, then the new one in: a kill between the two
    leaves ckpt-N.old-PID (and the new ckpt-N.tmp-PID). That is still step N, with keep_checkpoints = 1 too."""
    box = _Box()
    mgr = CheckpointManager(str(tmp_path), tf.train.Checkpoint(box=box), keep=1)
    box.w.assign(tf.fill([4], 5.0))
    final = mgr.save(5)
    os.rename(final, final + ".old-4242")
    os.makedirs(final + ".tmp-4242")  # the new copy, renamed in never
    open(final + ".tmp-4242/ckpt.index", "wb").close()
    assert mgr.all() == [(5, final + ".old-4242")]
    box.w.assign(tf.zeros([4]))
    path, meta, _ = mgr.restore_latest(print)
    assert meta["step"] == 5 and float(box.w.numpy().mean()) == 5.0
    mgr.recover()  # what the trainer's restore does first (Checkpointer.restore, rank 0)
    assert os.listdir(tmp_path) == ["ckpt-000000005"] and mgr.all() == [(5, final)]
    mgr.save(6)
    assert [s for s, _ in mgr.all()] == [6]
