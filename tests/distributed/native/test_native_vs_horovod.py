"""The native backend and Horovod (mpirun -np 2) train alike and share checkpoints.

Needs Horovod: excluded from the newest-TensorFlow run (``-m "not horovod"``).
"""
import os

import numpy as np
import pytest

from tests.distributed.native.runs import EPOCH, FIRST_LEG, Run, probe_cmd, run_all
from tests.helpers import mpirun_cmd

pytestmark = [pytest.mark.horovod, pytest.mark.mpi]


def test_native_matches_horovod_and_checkpoints_cross_over(base_runs, tmp_path):
    ref, nat, _ = base_runs
    hvd_prefix, hvd_dir = str(tmp_path / "hvd"), str(tmp_path / "hvd_model")
    probe = probe_cmd(hvd_prefix, "horovod", "--steps", str(FIRST_LEG), "--model_dir", hvd_dir)
    run_all([mpirun_cmd(2, probe[1:])])
    hvd = Run(hvd_prefix, 2)
    assert [m["backend"] for m in hvd.meta] == ["horovod", "horovod"]
    assert hvd.meta[0]["size"] == hvd.meta[0]["replicas"] == 2
    # Horovod on 2 processes and native on 2 replicas: the same steps.
    assert len(hvd.losses) == FIRST_LEG >= 50
    np.testing.assert_allclose(nat.losses, hvd.losses, rtol=1e-4)
    for k, v in nat.arrays(0).items():
        np.testing.assert_allclose(v, hvd.rank[0][k], rtol=1e-3, atol=1e-4, err_msg=k)

    # Horovod's checkpoint (2 processes) resumes under native (2 replicas in one process);
    # the other direction is tests/distributed/native/test_native_training.py (native -> local -> native).
    to_native = str(tmp_path / "to_native")
    run_all([probe_cmd(to_native, "native", "--steps", str(FIRST_LEG + EPOCH), "--model_dir", hvd_dir,
                       replicas=2)])
    leg = Run(to_native, 1)
    assert leg.meta[0]["backend"] == "native"
    assert os.path.basename(leg.meta[0]["resumed_from"]) == f"ckpt-{FIRST_LEG:09d}"
    assert len(leg.losses) == EPOCH
    np.testing.assert_allclose(leg.losses, ref.losses[FIRST_LEG:FIRST_LEG + EPOCH], rtol=1e-4)
