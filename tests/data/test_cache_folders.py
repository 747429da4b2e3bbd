"""Temporary folders of killed encodings are swept from the data cache; a live writer's never are."""
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from lmkit.core import fileio
from lmkit.data import token_cache
from lmkit.data.tokenizers import train_tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A writer: makes a temporary folder as the encoder does, writes a partial ids.bin, says where, then waits.
WRITER = """
import os, sys, time
from lmkit.core.fileio import TempFolder
folder = TempFolder(sys.argv[1], ".tmp-word-0123456789abcdef01234567-")
with open(os.path.join(folder.path, "ids.bin"), "wb") as f:
    f.write(bytes(300_000))
print(folder.path, flush=True)
time.sleep(600)
"""


@pytest.fixture
def writer(tmp_path):
    """``(process, its temporary folder)``: a live writer in ``tmp_path/cache``, killed at the end."""
    root = tmp_path / "cache"
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], stdout=subprocess.PIPE, env=env,
                            text=True)
    guard = threading.Timer(300, proc.kill)  # a stuck child never hangs the suite
    guard.start()
    try:
        folder = proc.stdout.readline().strip()
        assert folder and os.path.isdir(folder), "the writer did not start"
        yield proc, folder
    finally:
        guard.cancel()
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_a_live_writers_folder_is_kept_and_a_killed_ones_is_swept(writer, tmp_path):
    proc, folder = writer
    root = str(tmp_path / "cache")
    text = tmp_path / "t.txt"
    text.write_text("the cat sat\non the mat\n")
    tokenizer = train_tokenizer("word", str(text), tmp_path / "tok")
    log = []
    stream = token_cache.encode_to_cache(root, tokenizer, [str(text)], True, log=log.append)
    assert os.path.isdir(folder) and not any("removed" in line for line in log)  # alive: kept
    assert token_cache.sweep_temp_folders(root) == (0, 0) and os.path.isdir(folder)
    assert sorted(os.listdir(stream.folder)) == ["ids.bin", "manifest.json", "tokenizer"]  # no lock file
    proc.send_signal(signal.SIGKILL)  # as the OOM killer does: no clean-up ran
    proc.wait()
    assert os.path.isfile(os.path.join(folder, "ids.bin"))
    log.clear()
    text.write_text("the cat sat\n")  # another encoding into the same cache sweeps first
    token_cache.encode_to_cache(root, tokenizer, [str(text)], True, log=log.append)
    assert not os.path.exists(folder)
    swept = [line for line in log if line.startswith("removed")]
    assert swept == [f"removed 1 temporary folder(s) of killed encodings from the data cache {root} (0.3 MB)"]
    assert sorted(n for n in os.listdir(root) if n.startswith(".")) == []


def test_a_folder_locked_in_this_process_is_kept_and_one_left_unlocked_is_swept(tmp_path):
    root = str(tmp_path / "cache")
    live = fileio.TempFolder(root, ".tmp-a-")
    dead = fileio.TempFolder(root, ".tmp-b-")
    with open(os.path.join(dead.path, "ids.bin"), "wb") as f:
        f.write(bytes(1000))
    os.close(dead._fd)  # its process is gone: the kernel let go of the lock, nothing was removed
    dead._fd = None
    assert token_cache.sweep_temp_folders(root) == (1, 1000)
    assert os.path.isdir(live.path) and not os.path.exists(dead.path)
    live.publish(os.path.join(root, "done"))
    live.close()
    assert os.listdir(root) == ["done"] and os.listdir(os.path.join(root, "done")) == []


def test_folders_without_a_lock_are_swept_only_once_stale(tmp_path):
    """An older lmkit's leftovers (the token cache's and the tokenizer cache's) have no lock file: they go
    once nothing in them changed for a day."""
    root = tmp_path / "cache"
    old = [root / ".tmp-word-0123-abc", root / "tokenizer-word-89ab.tmp4242"]
    fresh = root / ".tmp-word-4567-def"
    for folder in old + [fresh]:
        os.makedirs(folder / "tokenizer")
        (folder / "ids.bin").write_bytes(bytes(500))
    day_ago = time.time() - fileio.UNLOCKED_STALE_SECONDS - 60
    for folder in old:
        for path in (folder / "ids.bin", folder / "tokenizer", folder):
            os.utime(path, (day_ago, day_ago))
    text = tmp_path / "t.txt"
    text.write_text("the cat sat\n")
    train_tokenizer("word", str(text), tmp_path / "tok", cache_dir=str(root))  # saving into the cache sweeps
    assert not any(os.path.exists(folder) for folder in old) and os.path.isdir(fresh)


def test_a_killed_encoding_leaves_a_folder_the_next_one_sweeps(tmp_path, monkeypatch):
    """The encoder's own temporary folder, abandoned mid-way (its lock let go as a kill would)."""
    text = tmp_path / "t.txt"
    text.write_text("the cat sat\non the mat\n" * 10)
    tokenizer = train_tokenizer("byte", [], tmp_path / "tok")
    root = str(tmp_path / "cache")
    real_fill = token_cache._encode_files

    def killed(folder, *args):
        real_fill(folder, *args)
        raise KeyboardInterrupt  # stopped before the rename

    class Keep(fileio.TempFolder):
        def close(self):  # as after SIGKILL: nothing removed, the lock gone with the descriptor
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    monkeypatch.setattr(token_cache, "_encode_files", killed)
    monkeypatch.setattr(token_cache, "TempFolder", Keep)
    with pytest.raises(KeyboardInterrupt):
        token_cache.encode_to_cache(root, tokenizer, [str(text)], True, workers=1)
    left = [n for n in os.listdir(root) if n.startswith(".tmp-")]
    assert len(left) == 1 and os.path.getsize(os.path.join(root, left[0], "ids.bin")) > 0
    monkeypatch.undo()
    log = []
    stream = token_cache.encode_to_cache(root, tokenizer, [str(text)], True, workers=1, log=log.append)
    assert [n for n in os.listdir(root) if n.startswith(".")] == []
    assert any(line.startswith("removed 1 temporary folder(s)") for line in log)
    np.testing.assert_array_equal(stream.ids[:3], tokenizer.encode("the"))
