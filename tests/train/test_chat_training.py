"""Examples with uneven loss weights (conversations' shape) train alike however the global batch is split.

The loss of a step is the global batch's weighted sum over its weighted tokens: with shards and micro-batches
of different weights, k micro-batches train like one batch, 2 Horovod workers like 1 process, 2 native replicas
like 1 process: the same losses and weights to 1e-5, packed and padded, fully and with LoRA adapters
(tests/scripts/chat_probe.py trains; every launch has a timeout).
"""
import sys

import numpy as np
import pytest

from tests.helpers import ROOT, assert_relatively_close, mpirun_cmd, run

PROBE = f"{ROOT}/tests/scripts/chat_probe.py"
RTOL = 1e-5
ONE = ["packed-k1", "packed-k2", "packed-k4", "padded-k1", "padded-k2", "packed-k1-lora"]


def _launch(tmp_path, name, runs, cmd=None, *extra):
    prefix = str(tmp_path / name)
    args = [PROBE, "--out", prefix, "--runs", ",".join(runs), *extra]
    res = run((cmd or [sys.executable]) + args, timeout=400)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    return prefix


def _load(prefix, run_name, rank=0):
    return np.load(f"{prefix}.{run_name}.rank{rank}.npz")


def _assert_same(got, want, what):
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=RTOL, err_msg=what)
    names = [k for k in want.files if k.startswith("var")]
    assert names and sorted(names) == sorted(k for k in got.files if k.startswith("var"))
    for k in names:
        assert_relatively_close(got[k], want[k], RTOL, f"{what}: {k}")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    return _launch(tmp_path_factory.mktemp("one"), "one", ONE)


def test_micro_batches_of_uneven_weights_train_like_the_whole_batch(one_process):
    for layout, ks in (("packed", (2, 4)), ("padded", (2,))):
        whole = _load(one_process, f"{layout}-k1")
        # it trained (random ids: the loss barely falls, but every variable moved): the comparison means something
        assert all(np.abs(whole[f"var{i}"] - whole[f"start{i}"]).max() > 1e-4
                   for i in range(len([k for k in whole.files if k.startswith("var")])))
        assert len(set(whole["total"])) > 1  # global batches of different weights
        if layout == "packed":  # rows of both windows (16 and 32), the shorter with twice the rows
            assert set(zip(whole["length"], whole["rows"])) == {(16, 16), (32, 8)}
        for k in ks:
            _assert_same(_load(one_process, f"{layout}-k{k}"), whole, f"{layout} k={k}")
    lora = _load(one_process, "packed-k1-lora")
    assert len([k for k in lora.files if k.startswith("var")]) == 2 * 3 * 2  # A and B of 3 targets x 2 layers


@pytest.mark.horovod
@pytest.mark.mpi
def test_two_workers_with_uneven_weights_train_like_one_process(tmp_path, one_process):
    runs = ["packed-k1", "padded-k1", "packed-k1-lora"]
    two = _launch(tmp_path, "two", runs, mpirun_cmd(2, []))  # ends with python: the probe's arguments follow
    for name in runs:
        ranks = [_load(two, name, r) for r in (0, 1)]
        # the two shards of a global batch weigh differently, and add up to it (weights x rows / total)
        assert np.any(np.abs(ranks[0]["mine"] - ranks[1]["mine"]) > 0.5), name
        np.testing.assert_allclose(ranks[0]["mine"] + ranks[1]["mine"], ranks[0]["rows"], rtol=1e-6)
        for r in ranks:
            _assert_same(r, _load(one_process, name), f"{name} on 2 workers")


def test_two_native_replicas_with_uneven_weights_train_like_one_process(tmp_path, one_process):
    runs = ["padded-k1", "packed-k1-lora"]
    native = _launch(tmp_path, "native", runs, None, "--backend", "native", "--num_replicas", "2")
    for name in runs:
        _assert_same(_load(native, name), _load(one_process, name), f"{name} on 2 native replicas")
