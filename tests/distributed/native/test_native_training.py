"""The native backend (use_horovod=False) trains exactly like one process with the global batch.

* 2 replicas in one process (MirroredStrategy on 2 logical CPU devices);
* 2 worker processes on 127.0.0.1 configured by TF_CONFIG (lmkit.launch,
  MultiWorkerMirroredStrategy);
* checkpoints move between the native and the local backend both ways.

Dropout is off, so the per-step losses of all of them agree to rounding.
"""
import json
import os
import shutil
import sys

import numpy as np

from tests.distributed.native.runs import EPOCH, FIRST_LEG, REFERENCE_STEPS, Run, probe_cmd, run_all
from tests.helpers import assert_within_rounding


def _assert_same_training(run, ref, steps, offset=0):
    assert len(run.losses) == steps
    np.testing.assert_allclose(run.losses, ref.losses[offset:offset + steps], rtol=1e-4)


def test_two_replicas_in_one_process_match_one_process(base_runs):
    ref, nat, _ = base_runs
    assert nat.meta[0]["backend"] == "native" and nat.meta[0]["replicas"] == 2
    assert nat.meta[0]["size"] == 1 and ref.meta[0]["replicas"] == 1
    assert FIRST_LEG >= 50
    # The replica-averaged loss of each step is the loss of the global batch.
    _assert_same_training(nat, ref, FIRST_LEG)
    assert nat.losses[-8:].mean() < nat.losses[:8].mean()  # it did learn something
    # Each replica applied the same update to its own copy of every variable and slot.
    assert float(nat.rank[0]["copy_spread"]) == 0.0
    # Broadcast from the chief at start: initial values are the seeded ones.
    for k in [k for k in ref.rank[0] if k.startswith("init")]:
        np.testing.assert_array_equal(nat.rank[0][k], ref.rank[0][k], err_msg=k)


def test_two_workers_through_launch_have_identical_variables(base_runs, tmp_path):
    ref, _, _ = base_runs
    steps = 2 * EPOCH  # a checkpoint at the end of each epoch
    prefix, model_dir = str(tmp_path / "workers"), str(tmp_path / "model")
    probe = probe_cmd(prefix, "native", "--steps", str(steps), "--model_dir", model_dir)
    # `--backend native` is what LMKIT_BACKEND=native from the launcher says anyway.
    run_all([[sys.executable, "-m", "lmkit.launch", "--hosts", "127.0.0.1", "--num_workers", "2",
              "--", *probe]], timeout=400)
    two = Run(prefix, 2)
    assert [m["rank"] for m in two.meta] == [0, 1]
    assert all(m["size"] == 2 and m["replicas"] == 2 and m["backend"] == "native" for m in two.meta)
    # Both workers hold the same variables and optimizer state, bit for bit ...
    np.testing.assert_array_equal(two.rank[0]["losses"], two.rank[1]["losses"])
    arrays = two.arrays(0)
    assert len(arrays) > 2
    for k, v in arrays.items():
        np.testing.assert_array_equal(v, two.rank[1][k], err_msg=k)
    # ... and trained like one process on the global batch.
    _assert_same_training(two, ref, steps)
    # The chief wrote the checkpoints of both epochs (and nothing else wrote there).
    assert sorted(os.listdir(os.path.join(model_dir, "checkpoints"))) == [
        f"ckpt-{EPOCH:09d}", f"ckpt-{steps:09d}"]


def test_checkpoints_move_between_native_and_local_backends(base_runs, tmp_path):
    ref, nat, nat_dir = base_runs
    model_dir = str(tmp_path / "model")
    shutil.copytree(nat_dir, model_dir)
    # native (steps 1-50) -> local (one epoch) -> native on 2 replicas (one more epoch)
    middle, last = FIRST_LEG + EPOCH, REFERENCE_STEPS
    local_leg, native_leg = str(tmp_path / "local"), str(tmp_path / "native")
    run_all([probe_cmd(local_leg, "local", "--steps", str(middle), "--model_dir", model_dir)])
    run_all([probe_cmd(native_leg, "native", "--steps", str(last), "--model_dir", model_dir, replicas=2)])
    local, native = Run(local_leg, 1), Run(native_leg, 1)
    assert local.meta[0]["resumed_from"].endswith(f"ckpt-{FIRST_LEG:09d}")
    assert native.meta[0]["resumed_from"].endswith(f"ckpt-{middle:09d}")
    assert (local.meta[0]["steps"], native.meta[0]["steps"]) == (middle, last)
    _assert_same_training(local, ref, EPOCH, offset=FIRST_LEG)
    _assert_same_training(native, ref, EPOCH, offset=middle)
    for k, v in native.arrays(0).items():  # three legs end where one straight run ends
        np.testing.assert_allclose(v, ref.rank[0][k], rtol=1e-3, atol=1e-4, err_msg=k)
    with open(os.path.join(model_dir, "results.json")) as f:
        assert json.load(f)["global_step"] == last


def test_two_replicas_with_xla_match_one_process(tmp_path):
    """jit_compile=True (the default on GPUs, forced on the CPU here): each replica's gradients
    and the update are XLA-compiled apart, the strategy's all-reduce runs between them."""
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    xla = ("--steps", "30", "--jit_compile", "True")
    run_all([probe_cmd(one, "local", *xla, "--grad_accum_steps", "1,2,4"),
             probe_cmd(two, "native", *xla, replicas=2)])
    ref, controls = Run(f"{one}.sgd.k1", 1), [Run(f"{one}.sgd.k{k}", 1) for k in (2, 4)]
    nat = Run(two, 1)
    assert nat.meta[0]["xla"] and nat.meta[0]["replicas"] == 2 and len(nat.losses) == 30
    assert float(nat.rank[0]["copy_spread"]) == 0.0  # every replica applied the same update
    assert_within_rounding(nat.rank[0], ref.rank[0], [c.rank[0] for c in controls], list(ref.arrays()))
