"""Fixtures of the server's tests: a tiny trained run (one per session), a chat template, free ports, and
``lmkit serve`` in a subprocess."""
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.helpers import ROOT, run, subprocess_env

#: A chat template for a run trained from scratch (lmkit serve --chat_template).
TEMPLATE = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
WORDS = "the cat sat on a mat dog ran fast blue sky and to of in".split()


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory):
    """A tiny character-level transformer trained for 20 steps (its greedy output is not all one letter)."""
    folder = tmp_path_factory.mktemp("serve-run")
    rng = random.Random(0)
    text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(800)) + "\n"
    train = folder / "train.txt"
    train.write_text(text, encoding="utf-8")
    model_dir = str(folder / "run")
    res = run([sys.executable, "-m", "lmkit", "train", "--config", "config_tiny_transformer", "--train_file",
               str(train), "--valid_file", str(train), "--test_file", str(train), "--tokenizer", "char",
               "--model_dir", model_dir, "--max_steps", "20", "--set", "warmup_steps=2"], timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return model_dir


@pytest.fixture(scope="session")
def template_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve-template") / "chat.jinja"
    path.write_text(TEMPLATE, encoding="utf-8")
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``lmkit serve`` on a free port; ``url`` is its base address."""

    def __init__(self, model_dir, *flags, env=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(os.path.dirname(model_dir), f"serve-{self.port}.log"), "w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "lmkit", "serve", "--model_dir", model_dir, "--port",
                                      str(self.port), *flags], cwd=ROOT, env=subprocess_env(env),
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.output()
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise AssertionError("lmkit serve did not answer /health within 300 s:\n" + self.output())

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(timeout=60)


def get(url, headers=None, timeout=30):
    """``(status, body text)`` of a GET."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
