"""A native (``lmkit.launch``) worker that raises or is killed: the job ends naming it, not a bystander.

When worker 1 fails, TensorFlow aborts rank 0's collectives ("Collective ops
is aborted by: Socket closed"). Rank 0 used to print that as its own failure,
with a traceback of some 5,000 characters that came last and buried worker
1's message (a killed worker prints none). Now rank 0 says in one line that
it stopped because of another rank, and ``lmkit.launch`` ends the output
with the worker that failed first and how.
"""
import re
import sys

import pytest

from tests.distributed.reliability.support import FAULTY, run_streamed

LAUNCH = [sys.executable, "-m", "lmkit.launch", "--hosts", "127.0.0.1", "--num_workers", "2", "--"]
FIRST = re.compile(r"^\[launch\] the job failed: worker (\d) of 2 \(on 127\.0\.0\.1, pid \d+\) failed first "
                   r"\(([^;]+);", re.MULTILINE)


@pytest.mark.parametrize("kind, how", [("raise", "exit status 1"), ("kill", "killed by SIGKILL")])
def test_a_failing_native_worker_is_named_and_the_bystander_says_so_in_one_line(corpus, tmp_path, kind, how):
    out = run_streamed([*LAUNCH, sys.executable, FAULTY, "--fault", f"rank=1,step=3,kind={kind}", "--",
                        "--config", corpus.config, "--data_path", corpus.data, "--model_dir",
                        str(tmp_path / "model"), "--backend", "native", "--max_steps", "10"], timeout=400)
    assert out.returncode == 1, out.explain()
    assert f"rank 1: injecting {kind} before step 3" in out.output, out.explain()
    assert FIRST.findall(out.output) == [("1", how)], out.explain()
    assert out.output.rstrip().splitlines()[-1].startswith("[launch] the job failed: worker 1"), out.explain()
    if kind == "raise":
        assert out.count("rank 1 failed: RuntimeError: injected fault on rank 1 at step 3") == 1, out.explain()
    # Rank 0 only followed: no failure of its own, no traceback.
    assert "rank 0 failed" not in out.output and out.count("Traceback") == (kind == "raise"), out.explain()
