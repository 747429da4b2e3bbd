"""Helpers for tests that launch lmkit scripts as subprocesses."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def have_horovod() -> bool:
    try:
        import horovod.tensorflow  # noqa: F401
        return True
    except Exception:
        return False


def subprocess_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    for key in list(env):  # never inherit a launcher's identity from an outer mpirun
        if key.startswith(("OMPI_COMM_WORLD", "PMIX_", "PMI_", "HOROVOD_")):
            del env[key]
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("LMKIT_INTRA_OP_THREADS", "1")
    if extra:
        env.update(extra)
    return env


def mpirun_cmd(np_: int, args: Sequence[str], env_keys: Sequence[str] = ()) -> List[str]:
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun not found: run `make setup`"
    cmd = [mpirun, "-np", str(np_), "--oversubscribe", "--bind-to", "none"]
    for key in ("PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL", "LMKIT_INTRA_OP_THREADS", *env_keys):
        cmd += ["-x", key]
    return cmd + [sys.executable, *args]


def run(cmd: Sequence[str], timeout: float, env: Optional[Dict[str, str]] = None,
        cwd: str = ROOT, input: Optional[str] = None) -> subprocess.CompletedProcess:
    """Runs ``cmd`` with a hard timeout; a hang kills the whole process group.

    Raises:
      subprocess.TimeoutExpired: the command (and its children) ran longer
        than ``timeout`` seconds; they have been killed.
    """
    from tests import warm  # a fork of a process that has imported TensorFlow, where nothing tells them apart
    server_env = subprocess_env()
    env = warm.rank_env(env or server_env, server_env=server_env)  # mpirun's ranks too
    proc = warm.start(cmd, env, cwd, input, server_env=server_env)
    if proc is not None:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise subprocess.TimeoutExpired(cmd, timeout) from None
        return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)
    proc = subprocess.Popen(list(cmd), cwd=cwd, env=env, text=True,
                            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)


# --------------------------------------------------------------------------
# Generated PTB-format data, served from 127.0.0.1
# --------------------------------------------------------------------------
def write_ptb_corpus(folder: str, num_words: int = 60, seed: int = 0,
                     lines: Sequence[int] = (600, 60, 60)) -> int:
    """Writes ptb.{train,valid,test}.txt of a learnable toy language.

    Returns:
      The vocabulary size the training file yields (words + ``<eos>``).
    """
    import numpy as np
    rng = np.random.RandomState(seed)
    words = [f"w{i}" for i in range(num_words - 2)] + ["<unk>"]
    os.makedirs(folder, exist_ok=True)
    for name, count in zip(("train", "valid", "test"), lines):
        out = []
        for _ in range(count):
            w = rng.randint(len(words))
            sent = []
            for _ in range(rng.randint(4, 12)):
                sent.append(words[w])
                w = (w * 5 + 3) % len(words) if rng.rand() < 0.8 else rng.randint(len(words))
            out.append(" " + " ".join(sent) + " ")
        if name == "train":  # every word appears in training
            out.append(" " + " ".join(words) + " ")
        with open(os.path.join(folder, f"ptb.{name}.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(out) + "\n")
    return len(words) + 1


def make_ptb_archive(path: str, **kwargs) -> int:
    """Writes ``simple-examples.tgz`` in the real archive's layout; returns the vocab size."""
    import tarfile
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "simple-examples", "data")
        vocab = write_ptb_corpus(data, **kwargs)
        with open(os.path.join(data, "README"), "w") as f:
            f.write("generated for lmkit tests\n")
        with tarfile.open(path, "w:gz") as tar:
            tar.add(os.path.join(tmp, "simple-examples"), arcname="simple-examples")
    return vocab


class StaticServer:
    """Serves a folder over HTTP on 127.0.0.1 in a thread; counts requests."""

    def __init__(self, folder: str) -> None:
        import functools
        import http.server
        import threading
        self.requests: List[str] = []
        outer = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_GET(self):  # noqa: N802
                outer.requests.append(self.path)
                super().do_GET()

        self.httpd = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Handler, directory=folder))
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> "StaticServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def tiny_config_file(folder: str, vocab_size: int, **overrides) -> str:
    """A small config (trains in seconds) written as a .py file."""
    values = dict(model="lstm", vocab_size=vocab_size, hidden_size=32, num_layers=2, init_scale=0.1,
                  keep_prob=1.0, batch_size=4, num_steps=8, num_epochs=1, learning_rate=1.0,
                  max_grad_norm=5.0, lr_decay=0.5, lr_decay_start_epoch=1)
    values.update(overrides)
    path = os.path.join(folder, "config_tiny.py")
    with open(path, "w") as f:
        for k, v in values.items():
            f.write(f"{k} = {v!r}\n")
    return path


def assert_relatively_close(actual, desired, rtol: float, name: str = "") -> None:
    """``|actual - desired| <= rtol * |desired|`` in the 2-norm of the whole tensor.

    The relative error of a tensor, not of each element: an element near 0
    (a variable Adam moved by a tiny, rounding-sized gradient) has no useful
    relative error of its own.
    """
    import numpy as np
    a, d = np.asarray(actual, np.float64), np.asarray(desired, np.float64)
    assert a.shape == d.shape, f"{name}: shape {a.shape} != {d.shape}"
    error, scale = float(np.linalg.norm(a - d)), float(np.linalg.norm(d))
    assert error <= rtol * scale, (f"{name}: relative error {error / max(scale, 1e-300):.3g} > {rtol:g} "
                                   f"(largest element difference {float(np.max(np.abs(a - d))):.3g})")


def rounding_envelope(run, ref, names) -> "tuple":
    """How far ``run`` strays from ``ref``: the running maximum over the steps of the relative
    loss difference, and the relative 2-norm difference of each final array in ``names``."""
    import numpy as np
    losses = np.maximum.accumulate(np.abs(run["losses"] - ref["losses"]) / np.abs(ref["losses"]))
    arrays = {k: float(np.linalg.norm(np.asarray(run[k], np.float64) - ref[k]))
              / max(float(np.linalg.norm(np.asarray(ref[k], np.float64))), 1e-30) for k in names}
    return losses, arrays


# Differences below this (16 float32 ulps, relative) are rounding whatever the controls show.
ROUNDING_FLOOR = 16 * 2.0 ** -24
# How much further than the controls a run that computes the same arithmetic may stray.
ROUNDING_FACTOR = 10.0


def assert_within_rounding(run, ref, controls, names) -> None:
    """``run`` trained like ``ref`` up to float32 rounding as training amplifies it on this CPU.

    Two ranks average two half-batch gradients where one process sums the
    whole batch: the same arithmetic in another order, so their losses
    differ by rounding, which training then amplifies (a tiny transformer
    at SGD learning rate 0.1 turns a 1e-7 difference into 1e-4 within 50
    steps on an AVX-512 Xeon; another CPU rounds and amplifies otherwise).
    No fixed tolerance holds on every CPU, so the bound is measured in the
    same test: ``controls`` are one-process runs of the same global batch
    split into micro-batches (gradient accumulation), the same arithmetic
    in yet other orders, amplified by the same dynamics on this CPU. At
    every step the running maximum of ``run``'s relative loss difference
    must stay within ``ROUNDING_FACTOR`` times the controls' (measured:
    at most 1.15 times on that Xeon) plus ``ROUNDING_FLOOR``; likewise each
    final variable in ``names``. A wrong average (gradients summed instead
    of averaged, a rank's rows dropped) moves the loss by 1e-2 within a few
    steps, when the controls are at 1e-7
    (``test_the_rounding_bound_catches_a_wrong_average``).
    """
    import numpy as np
    losses, arrays = rounding_envelope(run, ref, names)
    measured = [rounding_envelope(c, ref, names) for c in controls]
    bound = ROUNDING_FACTOR * np.max([m[0] for m in measured], axis=0) + ROUNDING_FLOOR
    over = np.nonzero(losses > bound)[0]
    assert not len(over), (
        f"step {over[0] + 1}: relative loss difference {losses[over[0]]:.3g} is outside the rounding "
        f"bound {bound[over[0]]:.3g} ({ROUNDING_FACTOR:g} x the controls' + {ROUNDING_FLOOR:.2g})")
    for k in names:
        limit = ROUNDING_FACTOR * max(m[1][k] for m in measured) + ROUNDING_FLOOR
        assert arrays[k] <= limit, (f"{k}: relative difference {arrays[k]:.3g} is outside the rounding "
                                    f"bound {limit:.3g} ({ROUNDING_FACTOR:g} x the controls' + "
                                    f"{ROUNDING_FLOOR:.2g})")


def prefill_then_steps(model, rows, prefill: int, state):
    """The logits [batch, time, vocab] of ``rows`` (token id lists) computed with ``model``'s cache: the
    first ``prefill`` tokens as one window from ``state``, then one ``model.step`` per token."""
    import numpy as np
    import tensorflow as tf
    first, state = model(tf.constant([row[:prefill] for row in rows]), state)
    logits = [first.numpy()]
    for t in range(prefill, len(rows[0])):
        step, state = model.step(tf.constant([row[t] for row in rows]), state)
        logits.append(step.numpy()[:, np.newaxis])
    return np.concatenate(logits, axis=1)


def decidable_greedy(torch_model, atol: float = 1e-4, rtol: float = 1e-4, stop_id: Optional[int] = None,
                     **generate_kwargs) -> List[List[int]]:
    """transformers' greedy ``generate`` (``generate_kwargs``: its inputs and options), each row's ids, checked
    to be decidable across frameworks and CPUs.

    lmkit's logits match transformers' within ``atol + rtol x`` the largest logit (what the logits tests
    assert); where at some step the best (processed) score led the second by less than twice that, rounding
    could pick the other token on another CPU, and the comparison would test the CPU, not lmkit. So this
    fails with its own message there. Rows end after ``stop_id`` when it comes after the first position
    (transformers pads a finished row).
    """
    import numpy as np
    import torch
    with torch.no_grad():
        out = torch_model.generate(do_sample=False, num_beams=1, output_scores=True, return_dict_in_generate=True,
                                   **generate_kwargs)
    scores = torch.stack(out.scores, 1).float().numpy()  # [rows, new tokens, vocab]
    start = out.sequences.shape[1] - scores.shape[1]  # where the generated tokens begin
    rows = []
    for r, row in enumerate(out.sequences.tolist()):
        if stop_id is not None and stop_id in row[1:]:
            row = row[:row.index(stop_id, 1) + 1]
        steps = scores[r, :len(row) - start]
        finite = np.where(np.isfinite(steps), steps, np.nan)
        top = np.sort(np.nan_to_num(finite, nan=-np.inf), axis=-1)
        bound = 2 * (atol + rtol * np.nanmax(np.abs(finite)))
        margins = top[:, -1] - top[:, -2]
        assert margins.min() > bound, (f"row {r}: a near tie at new token {int(margins.argmin())} (margin "
                                       f"{margins.min():.2e} <= {bound:.2e}): this comparison would depend on rounding")
        rows.append(row)
    return rows
