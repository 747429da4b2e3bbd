"""Downloads and exports: their own temporary names, leftovers of killed jobs swept, a size cap.

Each test here failed before issue 47: a fixed ``dest.part`` that a second job removed under the
first, temporary files and folders that stayed forever, and no cap on what a mirror may send.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lmkit.core.fileio import LOCK_FILE, claimed, sweep_unclaimed, work_folder
from lmkit.data import DataError, download, ensure_ptb

FAST = dict(progress=False, backoff=0.0, timeout=10.0)
OLD = time.time() - 3600  # an mtime past lmkit.core.fileio.STALE_AFTER_SECONDS


class _Gate(BaseHTTPRequestHandler):
    """``/slow``: half the body, then waits for ``server.release``; ``/fast``: at once;
    ``/unsized``: the body without a Content-Length (the end is the closed connection)."""

    protocol_version = "HTTP/1.0"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        body = self.server.bodies.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        if self.path != "/unsized":
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path == "/slow":
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.server.halfway.set()
            self.server.release.wait(30)
            self.wfile.write(body[len(body) // 2:])
        else:
            self.wfile.write(body)


@pytest.fixture
def gate_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Gate)
    server.daemon_threads = True
    server.bodies = {"/slow": b"A" * 300_000, "/fast": b"B" * 200_000, "/unsized": b"C" * 300_000}
    server.halfway, server.release = threading.Event(), threading.Event()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()


def test_two_downloads_of_one_file_do_not_write_into_each_others_part(gate_server, tmp_path):
    base, server = gate_server
    dest = str(tmp_path / "ptb.train.txt")
    outcome = {}

    def first() -> None:
        try:
            download(f"{base}/slow", dest, retries=0, **FAST)
            outcome["first"] = "done"
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome["first"] = exc

    thread = threading.Thread(target=first)
    thread.start()
    assert server.halfway.wait(30)
    download(f"{base}/fast", dest, retries=0, **FAST)  # a second job, while the first is halfway
    assert open(dest, "rb").read() == server.bodies["/fast"]
    server.release.set()
    thread.join(30)
    assert outcome["first"] == "done"  # a fixed dest.part removed under it made it fail
    assert open(dest, "rb").read() == server.bodies["/slow"]  # whole, never a mix
    assert sorted(os.listdir(tmp_path)) == ["ptb.train.txt"]


def test_a_download_larger_than_its_cap_stops_before_the_disk_fills(gate_server, tmp_path):
    base, _ = gate_server
    for path in ("/fast", "/unsized"):  # announced length, and none
        with pytest.raises(DataError, match=r"larger than the 0.1 MB expected of it"):
            download(f"{base}{path}", str(tmp_path / "f.txt"), max_bytes=100_000, **FAST)
        assert os.listdir(tmp_path) == []


def _killed_holder(path: str) -> None:
    """``path`` claimed by a process that is then killed (SIGKILL: no clean-up of its own)."""
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from lmkit.core.fileio import claimed\n"
        f"with claimed({path!r}):\n    print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    child.kill()
    child.wait(30)


def test_leftovers_of_killed_jobs_are_swept_and_live_ones_kept(tmp_path):
    dead_part = tmp_path / "ptb.train.txt.k1ll3d.part"
    dead_part.write_bytes(b"x" * 1000)
    _killed_holder(str(dead_part))
    live_part = tmp_path / "ptb.train.txt.l1v3.part"
    live_part.write_bytes(b"y")
    fresh_part = tmp_path / "ptb.train.txt.n3w.part"  # just made, not claimed yet
    fresh_part.write_bytes(b"z")
    other = tmp_path / "notes.k1ll3d.part"  # not this download's
    other.write_bytes(b"keep")
    for p in (dead_part, live_part, other):
        os.utime(p, (OLD, OLD))
    with claimed(str(live_part)):  # another job, still writing
        removed = sweep_unclaimed(str(tmp_path), r"ptb\.train\.txt\.[^.]+\.part")
    assert removed == [str(dead_part)]
    assert sorted(os.listdir(tmp_path)) == sorted([live_part.name, fresh_part.name, other.name])


def test_download_sweeps_its_files_leftover_parts(gate_server, tmp_path):
    base, server = gate_server
    stale = tmp_path / "f.txt.abc123.part"
    stale.write_bytes(b"partial")
    os.utime(stale, (OLD, OLD))
    download(f"{base}/fast", str(tmp_path / "f.txt"), **FAST)
    assert os.listdir(tmp_path) == ["f.txt"]


def test_ptb_and_export_work_folders_of_killed_jobs_are_swept(gate_server, kit, tmp_path):
    """A job killed while it extracted PTB left ``.ptb-download-*`` (was ``.ptb.*.tmp``); the next one sweeps it."""
    from lmkit.hub.folders import write_folder

    base, server = gate_server
    texts = kit.make_corpus(0)
    server.bodies["/simple-examples.tgz"] = kit.ptb_archive(texts)
    stale = tmp_path / ".ptb-download-dead"
    stale.mkdir()
    (stale / "ptb.train.txt.extracted").write_bytes(b"half")
    (stale / LOCK_FILE).touch()  # the lock file of a writer that is gone (nobody holds its lock)
    folder = ensure_ptb(str(tmp_path), url=f"{base}/simple-examples.tgz", verify=False,
                        expected_vocab_size=None, **FAST)
    assert sorted(os.listdir(tmp_path)) == ["simple-examples", "simple-examples.tgz"]
    assert sorted(os.listdir(folder)) == sorted(kit.SPLIT_FILES)

    stale_export = tmp_path / ".export-dead"
    stale_export.mkdir()
    (stale_export / LOCK_FILE).touch()
    write_folder(str(tmp_path / "export"), lambda folder: open(os.path.join(folder, "a.json"), "w").close())
    assert ".export-dead" not in os.listdir(tmp_path)
    assert os.listdir(tmp_path / "export") == ["a.json"]


def test_work_folder_is_removed_whatever_the_end(tmp_path):
    with pytest.raises(RuntimeError):
        with work_folder(str(tmp_path), ".job-") as work:
            open(os.path.join(work, "half"), "w").close()
            raise RuntimeError("killed midway")
    assert os.listdir(tmp_path) == []
    with work_folder(str(tmp_path), ".job-") as work:
        assert os.listdir(work) == [LOCK_FILE]
    assert os.listdir(tmp_path) == []
