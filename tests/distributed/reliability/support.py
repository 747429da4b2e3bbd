"""Helpers of the reliability tests: streamed runs with a hard timeout, folder digests."""
from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from tests.helpers import ROOT, mpirun_cmd, subprocess_env, write_ptb_corpus

# `lmkit train` under mpirun (what examples/lm_ptb_distributed.py ran before it composed the modules itself).
TRAIN = ["-m", "lmkit", "train"]
SINGLE = os.path.join(ROOT, "examples", "lm_ptb.py")
FAULTY = os.path.join(ROOT, "tests", "scripts", "faulty_ptb.py")
ENV_KEYS = ("LMKIT_COLLECTIVE_TIMEOUT",)  # forwarded by mpirun -x

# The tiny model of every run here: one small LSTM layer, 64 steps per epoch
# on the generated corpus, so a run costs little more than TensorFlow's start-up.
TINY = dict(model="lstm", hidden_size=8, num_layers=1, init_scale=0.1, keep_prob=1.0, batch_size=8,
            num_steps=10, num_epochs=1, learning_rate=1.0, max_grad_norm=5.0)


def write_config(path: str, vocab_size: int, drop: Sequence[str] = (), **overrides) -> str:
    """A config module at ``path`` (minus the keys in ``drop``)."""
    values = dict(TINY, vocab_size=vocab_size)
    values.update(overrides)
    with open(path, "w") as f:
        for k, v in values.items():
            if k not in drop:
                f.write(f"{k} = {v!r}\n")
    return path


def write_corpus(folder: str, seed: int = 0) -> int:
    return write_ptb_corpus(folder, seed=seed)


def horovodrun_gloo_cmd(np_: int, args: Sequence[str]) -> List[str]:
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return [horovodrun, "--gloo", "-np", str(np_), "-H", f"localhost:{np_}", sys.executable, *args]


def mpirun(args: Sequence[str]) -> List[str]:
    """``mpirun -np 2`` whose idle ranks yield the CPU instead of spinning (2 shared cores)."""
    cmd = mpirun_cmd(2, args, env_keys=ENV_KEYS)
    return cmd[:1] + ["--mca", "mpi_yield_when_idle", "1"] + cmd[1:]


# The line that ends a rank's own failure message (lmkit.cli.common.run_main's, the watchdog's;
# a bystander says "rank N stopped: ..."), and lmkit.launch's lines.
RANK_FAILED = re.compile(r"rank (\d+) failed: .*")
LAUNCHER_LINE = re.compile(r"^\[launch\] .*$", re.MULTILINE)


@dataclass
class Outcome:
    """How a launched job ended."""

    returncode: int
    output: str  # stdout and stderr, interleaved as they arrived
    seconds_after_marker: Optional[float]  # from the marker line to the exit

    def count(self, text: str) -> int:
        return self.output.count(text)

    def explain(self, before: int = 2500, tail: int = 2500) -> str:
        """A failed job's story for an assertion message: the cause first, then the end.

        The ranks' output is interleaved and the first rank to fail is not the
        last to speak (the others' errors follow from it), so the end of the
        output alone may not show the cause. This gives the exit status, what
        ``lmkit.launch`` said (it names the worker that failed first, with its
        status or signal), the first ``rank N failed: ...`` line with the
        ``before`` characters that lead to it (its traceback), and the last
        ``tail`` characters.
        """
        parts = [f"exit status {self.returncode}"]
        launcher = LAUNCHER_LINE.findall(self.output)
        if launcher:
            parts.append("lmkit.launch said:\n" + "\n".join(launcher))
        first = RANK_FAILED.search(self.output)
        if first is not None:
            parts.append(f"the first failure reported (rank {first.group(1)}), with what led to it:\n"
                         + self.output[max(0, first.start() - before):first.end()])
        parts.append(f"the last {tail} characters of the output:\n" + self.output[-tail:])
        return "\n\n--- ".join(parts)


def run_streamed(cmd: Sequence[str], timeout: float, marker: Optional[str] = None,
                 env: Optional[Dict[str, str]] = None,
                 on_line: Optional[Callable[[str], None]] = None,
                 on_start: Optional[Callable[[subprocess.Popen], None]] = None) -> Outcome:
    """Runs ``cmd`` in its own process group, reading its output as it comes.

    Args:
      cmd: the command.
      timeout: hard limit in seconds; past it the whole group is killed and
        the test fails with the output so far (a hang must never stall CI).
      marker: text whose first appearance starts the clock of
        ``seconds_after_marker``.
      env: extra environment variables.
      on_line: called with every line (e.g. to kill a rank by its PID).
      on_start: called with the started process (e.g. to signal the launcher later).
    """
    from tests import warm  # mpirun's ranks start warm
    proc = subprocess.Popen(list(cmd), cwd=ROOT, env=warm.rank_env(subprocess_env(env), subprocess_env()), text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    if on_start is not None:
        on_start(proc)
    lines: List[str] = []
    seen: List[float] = []
    broken: List[BaseException] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if marker is not None and not seen and marker in line:
                seen.append(time.monotonic())
            if on_line is not None and not broken:
                try:
                    on_line(line)
                except BaseException as e:  # the test's own callback failed: end the job now, not at timeout
                    broken.append(e)
                    os.killpg(proc.pid, signal.SIGKILL)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(5)
        raise AssertionError(f"{' '.join(cmd)} still ran after {timeout} s (killed):\n"
                             + "".join(lines)[-6000:]) from None
    ended = time.monotonic()
    reader.join(10)
    if broken:
        raise AssertionError(f"the test's on_line callback failed ({broken[0]!r}); output:\n"
                             + "".join(lines)[-6000:]) from broken[0]
    return Outcome(proc.returncode, "".join(lines), ended - seen[0] if seen else None)


def tree_digest(*folders: str) -> Dict[str, str]:
    """Every file and folder below ``folders``: path -> sha256 of the bytes (or "dir")."""
    out: Dict[str, str] = {}
    for top in folders:
        if not os.path.lexists(top):
            out[top] = "absent"
            continue
        if os.path.isfile(top):
            with open(top, "rb") as f:
                out[top] = hashlib.sha256(f.read()).hexdigest()
            continue
        for root, dirs, files in os.walk(top):
            out[root] = "dir"
            for name in files:
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    out[path] = hashlib.sha256(f.read()).hexdigest()
    return out
