"""Gradient accumulation and float16 loss scaling on the native backend.

* 2 replicas in one process: k = 4 micro-batches train like k = 1 with the
  same global batch (SGD and Adam, sparse embedding gradients);
* 2 workers through ``lmkit.launch``: a float16 gradient overflow on one
  worker is skipped by both, which halve their loss scale alike.
"""
import sys

import numpy as np

from tests.distributed.native.runs import Run, probe_cmd, run_all
from tests.helpers import assert_relatively_close


def test_accumulation_on_two_replicas_trains_like_the_big_batch(tmp_path):
    prefix = str(tmp_path / "accum")
    run_all([probe_cmd(prefix, "native", "--optimizer", "sgd,adam", "--grad_accum_steps", "1,4",
                       "--steps", "20", "--max_grad_norm", "0.5", replicas=2)])
    for optimizer in ("sgd", "adam"):
        big, acc = Run(f"{prefix}.{optimizer}.k1", 1), Run(f"{prefix}.{optimizer}.k4", 1)
        assert acc.meta[0]["replicas"] == 2 and acc.meta[0]["steps"] == 20
        np.testing.assert_allclose(acc.losses, big.losses, rtol=1e-5, err_msg=optimizer)
        assert float(acc.rank[0]["copy_spread"]) == 0.0  # both replicas applied the same update
        for k, v in acc.arrays(0).items():
            assert_relatively_close(v, big.rank[0][k], 1e-5, f"{optimizer} {k}")


def test_a_float16_overflow_on_one_worker_is_skipped_on_both(tmp_path):
    prefix = str(tmp_path / "fp16")
    probe = probe_cmd(prefix, "native", "--precision", "mixed_float16", "--bomb_at", "5", "--bomb_rank", "1",
                      "--steps", "12", "--grad_accum_steps", "2")
    run_all([[sys.executable, "-m", "lmkit.launch", "--hosts", "127.0.0.1", "--num_workers", "2", "--", *probe]])
    two = Run(prefix, 2)
    for r in (0, 1):
        losses = two.rank[r]["losses"]
        assert two.meta[r]["size"] == 2
        # The bomb fires on worker 1's 5th micro-batch: optimizer step 3 (2 micro-batches a step).
        assert np.isnan(losses[2]) and np.isfinite(np.delete(losses, 2)).all()
        assert two.meta[r]["skipped_steps"] == 1 and two.meta[r]["loss_scale"] == 32768.0 / 2
    for k, v in two.arrays(0).items():
        np.testing.assert_array_equal(v, two.rank[1][k], err_msg=k)
