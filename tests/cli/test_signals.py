"""A preemption signal outside training (lmkit.core.preemption): exit status 75, one line, nothing half-written.

Slurm, Kubernetes and spot machines send SIGTERM (or the signal a job asks
for) whatever the job is doing; a job script that requeues on 75 must see
75 also while the corpus is encoded, the tokenizer trained or the test split
evaluated (tests/distributed/reliability/test_preemption.py covers training,
the final evaluation and a distributed start-up). The small cases run
``run_main`` in a bare Python (no TensorFlow); the encoding cases run the
real ``lmkit prepare`` and signal it when it says it is encoding.
"""
import os
import random
import signal
import subprocess
import sys
import time
from typing import Callable, List

import pytest

from lmkit.core.errors import PreemptedError, UsageError
from tests.distributed.reliability.support import run_streamed
from tests.helpers import ROOT, subprocess_env

PREEMPTED = 75
NOTHING_LOST = "nothing is lost (what was written before stays, nothing half-written is kept)"


def run_main_with(body: str) -> subprocess.CompletedProcess:
    """``run_main(main)`` in a fresh Python, ``main``'s body given (``os``, ``signal``, ``time`` imported)."""
    code = ("import os, signal, time\n"
            "from lmkit.cli.common import run_main\n"
            "def main(argv):\n" + "".join(f"    {line}\n" for line in body.strip().splitlines())
            + "run_main(main, [])\n")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(), capture_output=True,
                          text=True, timeout=120)


# ------------------------------------------------------------------ run_main, without TensorFlow
def test_a_signal_before_training_ends_the_command_with_75_and_one_line():
    res = run_main_with("""
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(60)
""")
    assert res.returncode == PREEMPTED, res
    assert res.stderr == (f"preempted: stopped by SIGTERM while starting up; {NOTHING_LOST}; rerun the same "
                          "command to continue\n")


def test_the_message_names_what_was_being_done_and_broad_excepts_do_not_swallow_it():
    # A checkpoint reader that calls any Exception damage, a download that tries the next mirror: the
    # signal passes them by (it is a BaseException), and the clean-ups still run.
    res = run_main_with("""
from lmkit.core.preemption import doing
with doing("encoding train_file into the data cache"):
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(60)
    except Exception:
        print("swallowed", flush=True)
    finally:
        print("cleaned up", flush=True)
return 0
""")
    assert res.returncode == PREEMPTED, res
    assert res.stdout == "cleaned up\n"
    assert res.stderr == (f"preempted: stopped by SIGUSR1 while encoding train_file into the data cache; "
                          f"{NOTHING_LOST}; rerun the same command to continue\n")


def test_whatever_fails_after_the_signal_still_ends_with_75():
    # A rank that waited in a collective sees its peer's failure, not the signal: still 75, no traceback.
    res = run_main_with("""
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(60)
except BaseException:
    raise RuntimeError("a collective was cancelled: another rank left")
""")
    assert res.returncode == PREEMPTED, res
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("preempted: stopped by SIGINT while starting up")
    assert "Traceback" not in res.stderr


def test_a_second_signal_leaves_at_once():
    res = run_main_with("""
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)
finally:  # a clean-up that takes long: the second notice does not wait for it
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(60)
""")
    assert res.returncode == PREEMPTED, res
    assert res.stderr == "rank 0: second signal (SIGINT) while stopping for SIGTERM; leaving at once\n"


def test_after_the_command_a_signal_is_only_noted():
    code = ("import os, signal, time\n"
            "from lmkit.core import preemption\n"
            "preemption.install(0)\n"
            "preemption.leaving()\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "time.sleep(0.01)\n"  # any bytecode runs the handler
            "print(preemption.received())\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(), capture_output=True,
                         text=True, timeout=120)
    assert (res.returncode, res.stdout, res.stderr) == (0, "SIGTERM\n", "")


def test_every_rank_stops_together_when_one_is_signalled_in_shared_work(monkeypatch):
    # dist.agree and as_error (dist.rank0_first) send a signal's stop to every rank as a
    # PreemptedError, ahead of any usage error, so no rank waits in a collective for one that left.
    from lmkit import distributed as dist
    from lmkit.core.preemption import PreemptionSignal, as_error

    def signalled():
        raise PreemptionSignal("stopped by SIGTERM while training the word tokenizer")

    monkeypatch.setattr(dist, "allgather_object", lambda obj: [obj, ("usage", "bad file on rank 1")])
    with pytest.raises(PreemptedError, match="^stopped by SIGTERM while training the word tokenizer$"):
        dist.agree(signalled)
    with pytest.raises(UsageError, match="on rank 1: bad file on rank 1"):
        dist.agree(lambda: 1)
    with pytest.raises(PreemptedError, match="while training the word tokenizer"):
        as_error(signalled)()
    assert as_error(lambda: 7)() == 7


# ------------------------------------------------------------------ lmkit prepare, signalled while it encodes
@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    """18 MB of text: over token_cache.PARALLEL_MIN_BYTES, so LMKIT_ENCODING_WORKERS=2 runs a pool, and
    seconds of encoding with the char tokenizer, so a signal sent at its first line falls inside it."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(400)]
    block = "\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(4000)) + "\n"
    path = str(tmp_path_factory.mktemp("corpus") / "train.txt")
    with open(path, "w") as f:
        f.write(block * ((18 << 20) // len(block) + 1))
    return path


def prepare(corpus: str, cache: str) -> List[str]:
    return [sys.executable, "-m", "lmkit", "prepare", "--config", "config_transformer", "--train_file", corpus,
            "--tokenizer", "char", "--data_cache", cache]


def leftovers(cache: str) -> List[str]:
    """What a stopped encoding left in the cache: temporary names, or a token folder (only the tokenizer's is
    complete before the encoding starts)."""
    found = []
    for root, dirs, files in os.walk(cache):
        found += [os.path.join(root, n) for n in dirs + files
                  if ".tmp" in n or (root == cache and not n.startswith("tokenizer-"))]
    return found


def wait_for(condition: Callable[[], object], what: str, timeout: float = 120.0) -> object:
    """Polls ``condition`` until it returns something true; fails after ``timeout`` s saying ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"gave up waiting for {what}")


def _status(pid: int) -> dict:
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    except OSError:  # gone
        return {}


def pool_workers(parent: int) -> List[int]:
    """The token cache's encoding processes: the spawned children of ``parent``."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and _status(int(name)).get("PPid", "").strip() == str(parent):
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if b"spawn_main" in f.read():
                        out.append(int(name))
            except OSError:
                pass
    return out


def ignores_group_signals(pid: int) -> bool:
    """Whether ``pid`` ignores SIGINT and SIGUSR1 (an encoding process past its start-up)."""
    mask = int(_status(pid).get("SigIgn", "0").strip() or "0", 16)
    return all(mask >> (sig - 1) & 1 for sig in (signal.SIGINT, signal.SIGUSR1))


def running(pid: int) -> bool:
    return _status(pid).get("State", "Z").strip()[:1] not in ("Z", "X")


def check_stopped_cleanly(out, signal_name: str, cache: str) -> None:
    assert out.returncode == PREEMPTED, out.output[-4000:]
    assert out.count("preempted: ") == 1, out.output[-4000:]
    assert (f"preempted: stopped by {signal_name} while encoding train_file into the data cache; {NOTHING_LOST}; "
            "rerun the same command to continue") in out.output, out.output[-4000:]
    for text in ("Traceback", "Error", "died", "leaked", "resource_tracker"):
        assert text not in out.output, out.output[-4000:]
    assert leftovers(cache) == []


def test_sigterm_while_encoding_in_one_process_exits_75_and_leaves_no_temporary_folder(corpus, tmp_path):
    # Measured before: exit 143 (SIGTERM's default action), .tmp-<key>-* left in the cache.
    cache, started, sent = str(tmp_path / "cache"), [], []

    def on_line(line: str) -> None:
        if line.startswith("encoding train_file (") and not sent:
            assert "in 1 process(es)" in line, line
            sent.append(True)
            os.kill(started[0].pid, signal.SIGTERM)

    out = run_streamed(prepare(corpus, cache), timeout=300, env={"LMKIT_ENCODING_WORKERS": "1"},
                       on_line=on_line, on_start=started.append)
    assert sent, out.output[-4000:]
    check_stopped_cleanly(out, "SIGTERM", cache)


def run_with_pool(corpus: str, cache: str, act: Callable[[int, List[int]], None]):
    """``lmkit prepare`` with 2 encoding processes; ``act(pid, workers)`` once both are past their start-up."""
    started: List[subprocess.Popen] = []
    workers: List[int] = []

    def ready(pid: int) -> List[int]:
        found = pool_workers(pid)
        return found if len(found) == 2 and all(ignores_group_signals(w) for w in found) else []

    def on_line(line: str) -> None:
        if line.startswith("encoding train_file (") and not workers:
            assert "in 2 process(es)" in line, line
            pid = started[0].pid
            workers.extend(wait_for(lambda: ready(pid), "2 encoding processes that ignore SIGINT and SIGUSR1"))
            act(pid, workers)

    out = run_streamed(prepare(corpus, cache), timeout=300, env={"LMKIT_ENCODING_WORKERS": "2"},
                       on_line=on_line, on_start=started.append)
    assert len(workers) == 2, out.output[-4000:]
    for w in workers:  # shut down by their parent, none left behind
        wait_for(lambda: not running(w), f"encoding process {w} to end")
    return out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "slurm"])
def test_a_signal_to_every_process_while_a_pool_encodes(corpus, tmp_path, sig):
    # Ctrl-C reaches the terminal's whole process group, Slurm signals every process of a job. The
    # encoding processes ignore SIGINT and the parent shuts them down; SIGTERM ends them (the pool's own
    # terminate() sends it) and the parent stops all the same. They are held stopped (SIGSTOP) while the
    # signal is sent, so the encoding cannot end before it arrives.
    cache = str(tmp_path / "cache")

    def signal_all(pid: int, workers: List[int]) -> None:
        for w in workers:
            os.kill(w, signal.SIGSTOP)
        os.killpg(pid, sig)
        for w in workers:
            try:
                os.kill(w, signal.SIGCONT)
            except ProcessLookupError:  # ended by SIGTERM, stopped or not (a fatal signal wakes it)
                pass

    out = run_with_pool(corpus, cache, signal_all)
    check_stopped_cleanly(out, signal.Signals(sig).name, cache)


def test_an_encoding_process_killed_by_the_oom_killer_fails_the_run_without_a_hang(corpus, tmp_path):
    # The pool ends its other workers with SIGTERM: were it ignored, the parent's shutdown would wait forever.
    # Both workers are held stopped (SIGSTOP) around the kill, so no block can finish before it on a loaded
    # machine; the parent then learns of the death at a submit or at a result, whichever comes first (the
    # submit once ended the run with exit 1 and a raw BrokenProcessPool traceback).
    cache = str(tmp_path / "cache")

    def oom_kill(pid: int, workers: List[int]) -> None:
        for w in workers:
            os.kill(w, signal.SIGSTOP)
        os.kill(workers[0], signal.SIGKILL)
        os.kill(workers[1], signal.SIGCONT)  # SIGTERM from the pool ends it, stopped or not

    out = run_with_pool(corpus, cache, oom_kill)
    assert out.returncode == 2, out.output[-4000:]
    assert "error: an encoding process died while encoding train_file" in out.output, out.output[-4000:]
    assert leftovers(cache) == []
