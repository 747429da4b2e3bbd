"""Fixtures for the data tests: a tiny PTB-like corpus, archives, an HTTP server."""

from __future__ import annotations

import io
import os
import random
import re
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional, Tuple

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SPLIT_FILES = ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt")


def make_corpus(seed: int = 0, num_words: int = 30, lines: Tuple[int, int, int] = (60, 12, 12)) -> Dict[str, str]:
    """PTB-formatted text (leading space, ``<unk>`` present) for the three splits.

    The training split uses every word at least once, so the training
    vocabulary is ``num_words`` words + ``<unk>`` + ``<eos>``.
    """
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(num_words)] + ["<unk>"]
    texts = {}
    for name, count in zip(SPLIT_FILES, lines):
        out = []
        for n in range(count):
            line = [rng.choice(words) for _ in range(rng.randint(2, 9))]
            if name == "ptb.train.txt" and n < len(words):
                line.append(words[n])  # every word occurs in train
            out.append(" " + " ".join(line) + " \n")
        texts[name] = "".join(out)
    return texts


def corpus_vocab_size(texts: Dict[str, str]) -> int:
    return len(set(texts["ptb.train.txt"].split()) | {"<eos>"})


def tgz_bytes(members: List[Tuple[str, Optional[bytes], str]]) -> bytes:
    """A gzip'd tar of ``(name, data, kind)``; kind is file, symlink, dir or fifo.

    For a symlink, ``data`` is the link target.
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data, kind in members:
            info = tarfile.TarInfo(name)
            info.mtime = 1_000_000_000
            if kind == "file":
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            elif kind == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = data.decode()
                tar.addfile(info)
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
                tar.addfile(info)
    return buffer.getvalue()


def ptb_archive(texts: Dict[str, str], prefix: str = "./simple-examples/data/",
                skip: Tuple[str, ...] = ()) -> bytes:
    """A ``simple-examples.tgz`` in the real layout (with some decoy members)."""
    members = [("./simple-examples/", None, "dir"), ("./simple-examples/data/", None, "dir"),
               ("./simple-examples/README", b"decoy\n", "file")]
    members += [(prefix + name, texts[name].encode(), "file") for name in SPLIT_FILES if name not in skip]
    return tgz_bytes(members)


class ServerState:
    """What the test HTTP server serves and what it saw."""

    def __init__(self) -> None:
        self.files: Dict[str, bytes] = {}
        self.requests: List[Tuple[str, Optional[str]]] = []  # (path, Range header)
        self.cut_first = False  # the first GET sends half the body, then hangs up
        self.cut_always = False  # every GET does
        self.first_status: Optional[int] = None  # answer the first GET with this error status
        self.honor_range = True  # answer Range requests with 206
        self.lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one request per connection; closing ends the body

    def log_message(self, *args) -> None:  # keep the test output clean
        pass

    def do_GET(self) -> None:  # noqa: N802
        state: ServerState = self.server.state
        range_header = self.headers.get("Range")
        with state.lock:
            state.requests.append((self.path, range_header))
            first = len(state.requests) == 1
        if first and state.first_status is not None:
            self.send_error(state.first_status)
            return
        body = state.files.get(self.path)
        if body is None:
            self.send_error(404, "Not Found")
            return
        match = re.fullmatch(r"bytes=(\d+)-", range_header or "")
        if match and state.honor_range:
            start = int(match.group(1))
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            payload = body[start:]
        else:
            self.send_response(200)
            payload = body
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if state.cut_always or (first and state.cut_first):
            self.wfile.write(payload[: len(payload) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(payload)


@pytest.fixture
def http_server():
    """``(base_url, state)`` of an HTTP server on 127.0.0.1 in a thread."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.state = ServerState()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture(autouse=True)
def _no_internet(monkeypatch):
    """No test reaches the real PTB hosts: both default addresses point at a closed local port."""
    from lmkit.data import ptb

    monkeypatch.setattr(ptb, "DEFAULT_URL", "http://127.0.0.1:9/simple-examples.tgz")
    monkeypatch.setenv(ptb.FALLBACK_ENV, "http://127.0.0.1:9/ptb")
    monkeypatch.delenv(ptb.URL_ENV, raising=False)


@pytest.fixture
def kit():
    """The archive and corpus helpers above (conftest modules are not importable by name)."""
    import types

    return types.SimpleNamespace(make_corpus=make_corpus, corpus_vocab_size=corpus_vocab_size,
                                 tgz_bytes=tgz_bytes, ptb_archive=ptb_archive, SPLIT_FILES=SPLIT_FILES)


@pytest.fixture
def corpus(tmp_path):
    """``(path, lines)`` of a 200-line text of a 120-word lexicon (tests.data.samples.lexicon_lines)."""
    from tests.data.samples import lexicon_lines

    path = tmp_path / "data" / "train.txt"
    return path, lexicon_lines(path)


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """``(root, {"a", "b", "c", "valid": path})``: text shards and a validation file (tests.data.samples.text_files)."""
    from tests.data.samples import text_files

    return text_files(tmp_path_factory.mktemp("texts"))
