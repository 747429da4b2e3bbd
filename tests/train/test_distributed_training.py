"""Training on 2 workers equals training on 1 with the same global batch.

These tests launch ``mpirun -np 2`` themselves (with a timeout) and compare
against the same script run in one process.
"""
import json
import sys

import numpy as np
import pytest

from tests.helpers import ROOT, assert_relatively_close, assert_within_rounding, mpirun_cmd, run

pytestmark = [pytest.mark.horovod, pytest.mark.mpi]
PROBE = f"{ROOT}/tests/scripts/train_probe.py"


def _load(prefix, rank):
    data = np.load(f"{prefix}.rank{rank}.npz")
    with open(f"{prefix}.rank{rank}.json") as f:
        meta = json.load(f)
    return data, meta


_SHARED = {}


def _run_shared(tmp_path_factory, np_, *extra):
    """``_run`` once per module for the same arguments (a reference two tests compare against)."""
    key = (np_, *extra)
    if key not in _SHARED:
        _SHARED[key] = _run(tmp_path_factory.mktemp("shared"), "run", np_, *extra)
    return _SHARED[key]


def _run(tmp_path, name, np_, *extra):
    prefix = str(tmp_path / name)
    args = [PROBE, "--out", prefix, *extra]
    cmd = mpirun_cmd(np_, args) if np_ > 1 else [sys.executable, *args]
    res = run(cmd, timeout=400)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    return prefix


# SGD: Adam divides by the gradient's own scale, so it turns the rounding
# differences of a different summation order into visible ones (e.g. the
# attention key bias, whose exact gradient is zero); its slots are checked
# rank against rank below instead.
@pytest.mark.parametrize("model, extra", [("lstm", ()), ("lstm", ("--sparse_as_dense",)),
                                          ("transformer", ("--learning_rate", "0.1"))])
def test_two_workers_match_one_process(tmp_path, tmp_path_factory, model, extra):
    # One process trains the global batch whole (k1) and, as controls, split into 2 and 4
    # micro-batches (k2, k4): the same arithmetic in other summation orders.
    one = _run_shared(tmp_path_factory, 1, "--model", model, "--grad_accum_steps", "1,2,4", *extra)
    two = _run(tmp_path, "two", 2, "--model", model, *extra)
    ref, meta1 = _load(f"{one}.sgd.k1", 0)
    controls = [_load(f"{one}.sgd.k{k}", 0)[0] for k in (2, 4)]
    r0, meta_a = _load(two, 0)
    r1, meta_b = _load(two, 1)
    assert meta1["size"] == 1 and meta_a["size"] == meta_b["size"] == 2
    assert len(ref["losses"]) == 50 == len(r0["losses"])
    assert ref["losses"][-1] < ref["losses"][0]  # it did learn something
    # The ranks agree bit for bit: every rank applied the same averaged update.
    np.testing.assert_array_equal(r0["losses"], r1["losses"])
    names = [k for k in ref.files if k.startswith(("var", "slot"))]
    for k in names:
        np.testing.assert_array_equal(r0[k], r1[k], err_msg=k)
    # The rank-averaged loss of each step is the loss of the global batch, up to rounding
    # as training amplifies it; the bound comes from the controls on this CPU.
    assert_within_rounding(r0, ref, controls, names)


# jit_compile=True on 2 ranks: the replica's gradients (with the accumulation loop) and the
# update after the averaging are two XLA-compiled functions, Horovod's collectives run between
# them (the default on GPUs; forced here on the CPU). The reference is one process compiled whole.
@pytest.mark.parametrize("model, extra", [("lstm", ()),
                                          ("transformer", ("--learning_rate", "0.1", "--precision",
                                                           "mixed_bfloat16", "--sparse_as_dense"))])
def test_two_workers_with_xla_match_one_process(tmp_path, model, extra):
    xla = ("--model", model, "--jit_compile", "True", *extra)
    one = _run(tmp_path, "one", 1, *xla, "--grad_accum_steps", "2,4,8")
    two = _run(tmp_path, "two", 2, *xla, "--grad_accum_steps", "2")
    ref = _load(f"{one}.sgd.k4", 0)[0]  # 2 ranks x 2 micro-batches: 4 blocks of the global batch
    controls = [_load(f"{one}.sgd.k{k}", 0)[0] for k in (2, 8)]
    (r0, meta0), (r1, _) = _load(two, 0), _load(two, 1)
    assert meta0["xla"] and meta0["size"] == 2 and len(r0["losses"]) == 50
    names = [k for k in ref.files if k.startswith(("var", "slot"))]
    for k in names + ["losses"]:
        np.testing.assert_array_equal(r0[k], r1[k], err_msg=k)
    assert_within_rounding(r0, ref, controls, names)


def test_the_rounding_bound_catches_a_wrong_average(tmp_path, tmp_path_factory):
    """Guards the bound above: summing the 2 ranks' gradients instead of averaging them
    doubles SGD's step, which training at learning rate 0.2 reproduces in one process."""
    one = _run_shared(tmp_path_factory, 1, "--model", "transformer", "--grad_accum_steps", "1,2,4",
                      "--learning_rate", "0.1")
    wrong = _run(tmp_path, "wrong", 1, "--model", "transformer", "--learning_rate", "0.2")
    ref = _load(f"{one}.sgd.k1", 0)[0]
    controls = [_load(f"{one}.sgd.k{k}", 0)[0] for k in (2, 4)]
    with pytest.raises(AssertionError, match="outside the rounding bound"):
        assert_within_rounding(_load(wrong, 0)[0], ref, controls, [])


def test_broadcast_makes_ranks_identical_despite_different_seeds_and_so_do_the_optimizer_slots(tmp_path):
    # One mpirun run trains Adam, then NovoGrad, 10 steps each, every rank from its own seed.
    prefix = _run(tmp_path, "seeds", 2, "--optimizer", "adam,novograd", "--steps", "10", "--seed_by_rank")
    for optimizer in ("adam", "novograd"):
        (r0, _), (r1, _) = _load(f"{prefix}.{optimizer}.k1", 0), _load(f"{prefix}.{optimizer}.k1", 1)
        inits = [k for k in r0.files if k.startswith("init")]
        # The seeds really differed before the broadcast ...
        assert any(not np.allclose(r0[k], r1[k]) for k in inits), optimizer
        slots = [k for k in r0.files if k.startswith("slot")]
        assert len(slots) > 2  # learning rate, iterations and real slots
        assert any(np.abs(r0[k]).sum() > 0 for k in slots), optimizer
        # ... and after it every variable and optimizer slot is identical.
        for k in slots + [k for k in r0.files if k.startswith("var")]:
            np.testing.assert_array_equal(r0[k], r1[k], err_msg=f"{optimizer} {k}")


ACCUM_OPTIMIZERS = "sgd,momentum,adam,adamw,novograd,lamb,larc"


@pytest.mark.parametrize("extra, optimizers", [((), ACCUM_OPTIMIZERS), (("--sparse_as_dense",), "sgd,adam")])
def test_accumulation_on_two_workers_trains_like_the_big_batch(tmp_path, extra, optimizers):
    # One mpirun run trains every optimizer with k = 1 and k = 4 (micro-batches of 1 row per
    # rank), with clipping and a warmup active: they must see optimizer steps, not micro-batches.
    prefix = _run(tmp_path, "accum", 2, "--optimizer", optimizers, "--grad_accum_steps", "1,4",
                  "--steps", "30", "--max_grad_norm", "0.5", "--warmup_epochs", "0.3", *extra)
    for optimizer in optimizers.split(","):
        big, _ = _load(f"{prefix}.{optimizer}.k1", 0)
        acc0, meta0 = _load(f"{prefix}.{optimizer}.k4", 0)
        acc1, meta1 = _load(f"{prefix}.{optimizer}.k4", 1)
        assert meta0["size"] == 2 and meta0["steps"] == meta1["steps"] == 30
        np.testing.assert_allclose(acc0["losses"], big["losses"], rtol=1e-5, err_msg=optimizer)
        np.testing.assert_array_equal(acc0["losses"], acc1["losses"])
        for k in [k for k in big.files if k.startswith(("var", "slot"))]:
            np.testing.assert_array_equal(acc0[k], acc1[k], err_msg=f"{optimizer} {k}")
            assert_relatively_close(acc0[k], big[k], 1e-5, f"{optimizer} {k}")


@pytest.mark.parametrize("jit", ["False", "True"])
def test_a_float16_overflow_on_one_rank_is_skipped_on_both(tmp_path, jit):
    prefix = _run(tmp_path, "fp16", 2, "--precision", "mixed_float16", "--bomb_at", "5", "--bomb_rank", "1",
                  "--steps", "20", "--optimizer", "adam", "--learning_rate", "0.03", "--jit_compile", jit)
    ranks = [_load(prefix, r) for r in (0, 1)]
    for data, meta in ranks:
        losses = data["losses"]
        assert np.isnan(losses[4]) and np.isfinite(np.delete(losses, 4)).all()  # step 5 skipped ...
        assert meta["skipped_steps"] == 1 and meta["loss_scale"] == 32768.0 / 2  # ... and the scale halved
        assert losses[-5:].mean() < losses[:4].mean()  # training went on
    (r0, _), (r1, _) = ranks
    for k in [k for k in r0.files if k.startswith(("var", "slot"))]:
        np.testing.assert_array_equal(r0[k], r1[k], err_msg=k)
