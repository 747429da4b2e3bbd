"""The end of a multi-worker run: every worker leaves together after rank 0's last evaluation.

Before, the other workers of a native (``tf.distribute``) job exited while
rank 0 still evaluated the test split; after TensorFlow's heartbeat timeout
(10 s) rank 0's coordination service reported them as failed ("heartbeat
timeout", collectives aborted) in the middle of a successful run.

The waiting workers' watchdog must not trip either. Only that wait runs under
a short watchdog (``watched_end.py``), which the trainer pauses there: a short
``LMKIT_COLLECTIVE_TIMEOUT`` over the whole run (it was 6 s, 11 s for a rank
inside TensorFlow) bounded every training step too, a bound a loaded machine
crossed once (rank 0 died of "Collective ops is aborted by: Socket closed"
from worker 1; the native backend then also traced its step a second time at
step 2, seconds of CPU under load).
"""
import os
import re
import sys

from tests.distributed.reliability.support import run_streamed

LAUNCH = [sys.executable, "-m", "lmkit.launch", "--hosts", "127.0.0.1", "--num_workers", "2", "--"]
WATCHED_END = os.path.join(os.path.dirname(os.path.abspath(__file__)), "watched_end.py")


def test_native_workers_wait_for_rank_0s_long_test_evaluation(corpus, tmp_path):
    # Rank 0's test evaluation lasts 14 s more than usual (past the 10 s heartbeat timeout);
    # worker 1 waits for it under a 2 s watchdog (7 s inside TensorFlow), which must not trip.
    out = run_streamed([*LAUNCH, sys.executable, WATCHED_END, "--fault", "kind=slow_test_eval,step=14", "--",
                        "--config", corpus.config, "--data_path", corpus.data,
                        "--model_dir", str(tmp_path / "model"), "--backend", "native", "--verbose"],
                       timeout=400)
    assert out.returncode == 0, out.explain()
    assert "rank 1: a 2 s watchdog watches the wait for rank 0" in out.output, out.explain()
    assert "rank 0: injecting slow_test_eval (14 s)" in out.output
    assert "Test perplexity: " in out.output and "done: 1 epoch(s)" in out.output
    # --verbose keeps TensorFlow's own log lines: none may be an error ("E0000 ..." from absl,
    # "2026-... : E path" from TensorFlow's logger).
    errors = [line for line in out.output.splitlines() if re.match(r"E\d{4} |\S+ \S+: E ", line)]
    assert not errors, errors
    for bad in ("heartbeat timeout", "StartAbort", "failed", "Traceback"):
        assert bad not in out.output, (bad, out.explain())
