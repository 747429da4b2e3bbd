"""A rank that raises, is killed or hangs ends the whole job soon, with a message naming it.

Each test launches the real PTB example on 2 ranks through
tests/scripts/faulty_ptb.py, which injects one fault from outside the
library, and measures the time from the fault to the end of the job.
"""
import os
import re
import signal

import pytest

from tests.distributed.reliability.support import FAULTY, horovodrun_gloo_cmd, mpirun, run_streamed

pytestmark = [pytest.mark.horovod, pytest.mark.mpi]

LIMIT = 60.0  # the job must be gone this soon after the fault (an upper bound, not a speed check)
TIMEOUT = 400  # hard limit for one job, start-up and compilation included (2 busy cores)
FAILED = re.compile(r"rank (\d+) failed: ")


def _args(corpus, tmp_path, fault, *extra):
    return [FAULTY, "--fault", fault, "--", "--config", corpus.config, "--data_path", corpus.data,
            "--model_dir", str(tmp_path / "model"), *extra]


def _assert_ended_soon(out, rank):
    assert out.returncode != 0, out.output[-4000:]
    assert out.seconds_after_marker is not None, out.output[-4000:]
    assert out.seconds_after_marker < LIMIT, out.output[-4000:]
    failures = FAILED.findall(out.output)
    assert failures and failures[0] == str(rank), out.output[-4000:]  # the culprit reports first


def test_mpirun_rank_that_raises_mid_epoch(corpus, tmp_path):
    out = run_streamed(mpirun(_args(corpus, tmp_path, "rank=1,step=3,kind=raise", "--max_steps", "10")),
                       TIMEOUT, marker="rank 1: injecting raise")
    _assert_ended_soon(out, rank=1)
    assert out.count("rank 1 failed: RuntimeError: injected fault on rank 1 at step 3") == 1
    assert FAILED.findall(out.output) == ["1"], out.output[-4000:]  # one message: no echo from rank 0


def test_mpirun_rank_killed_by_sigkill_mid_epoch(corpus, tmp_path):
    pid_dir = tmp_path / "pids"  # the ranks' printed "PID .. RANK .." lines may run together in one pipe

    def kill_rank_1(line):
        if "rank 1: injecting hang" in line:  # rank 1 is mid-epoch, rank 0 waits in a collective
            os.kill(int((pid_dir / "rank1.pid").read_text()), signal.SIGKILL)

    out = run_streamed(mpirun(_args(corpus, tmp_path, f"rank=1,step=3,kind=hang,pid_dir={pid_dir}",
                                    "--max_steps", "10")),
                       TIMEOUT, marker="rank 1: injecting hang", on_line=kill_rank_1,
                       env={"LMKIT_COLLECTIVE_TIMEOUT": "0"})  # only the kill may end this job
    assert out.returncode != 0, out.output[-4000:]
    assert out.seconds_after_marker < LIMIT, out.output[-4000:]
    assert re.search(r"process rank 1 with PID \d+ on node \S+ exited on signal 9 \(Killed\)",
                     out.output), out.output[-4000:]
    assert not FAILED.findall(out.output), out.output[-4000:]  # rank 0 adds no misleading message


def test_mpirun_rank_0_raises_in_its_evaluation_while_rank_1_waits(corpus, tmp_path):
    # Two epochs: after the first, rank 1 goes on to the next step's collective
    # while rank 0 alone evaluates, and fails there.
    out = run_streamed(mpirun(_args(corpus, tmp_path, "rank=0,kind=eval_raise", "--num_epochs", "2")),
                       TIMEOUT, marker="rank 0: injecting eval_raise")
    _assert_ended_soon(out, rank=0)
    assert out.count("rank 0 failed: RuntimeError: injected fault in rank 0's evaluation") == 1
    assert FAILED.findall(out.output) == ["0"], out.output[-4000:]


def test_mpirun_rank_that_hangs_is_ended_by_the_watchdog(corpus, tmp_path):
    out = run_streamed(mpirun(_args(corpus, tmp_path, "rank=1,step=3,kind=hang", "--max_steps", "10")),
                       TIMEOUT, marker="rank 1: injecting hang", env={"LMKIT_COLLECTIVE_TIMEOUT": "10"})
    _assert_ended_soon(out, rank=1)
    assert re.search(r"rank 1 failed: no progress for \d+ s since training step 2 finished; it is at "
                     r"\S*faulty_ptb\.py:\d+ in train_step \(time\.sleep\(3600\)\), the other ranks wait "
                     r"for this one .*LMKIT_COLLECTIVE_TIMEOUT=10 s", out.output), out.output[-4000:]


def test_gloo_rank_that_raises_mid_epoch(corpus, tmp_path):
    out = run_streamed(horovodrun_gloo_cmd(2, _args(corpus, tmp_path, "rank=1,step=3,kind=raise",
                                                    "--max_steps", "10")),
                       TIMEOUT, marker="rank 1: injecting raise")
    _assert_ended_soon(out, rank=1)
    assert out.count("rank 1 failed: RuntimeError: injected fault on rank 1 at step 3") == 1
    # Gloo tells rank 0 its peer is gone; rank 0 says so in one line, without a traceback.
    assert FAILED.findall(out.output) == ["1"], out.output[-4000:]
    assert "[0]<stderr>:Traceback" not in out.output, out.output[-4000:]

