"""lmkit.distributed's seams on the native backend with 2 replicas in one process, against NumPy."""
import json
import os
import sys

import numpy as np
import pytest

from tests.helpers import ROOT, run

SCRIPT = os.path.join(ROOT, "tests", "distributed", "native", "replica_collectives.py")
REPLICAS = 2


@pytest.fixture(scope="module")
def result():
    res = run([sys.executable, SCRIPT, str(REPLICAS)], timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-5000:]
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_one_process_holds_every_replica(result):
    assert (result["backend"], result["size"], result["rank"]) == ("native", 1, 0)
    assert result["num_replicas"] == result["local_replicas"] == REPLICAS


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_rows_are_split_in_contiguous_blocks_and_reduced_over_replicas(result, mode):
    x = np.arange(2 * REPLICAS * 3, dtype=np.float32).reshape(2 * REPLICAS, 3)
    blocks = np.split(x, REPLICAS)  # replica r: rows [2r, 2r+2), as rank r with Horovod
    got = result[mode]
    np.testing.assert_array_equal(got["gathered"], x)  # all-gather in replica order = the rows
    assert got["sum"] == pytest.approx(sum(b.sum() for b in blocks))
    assert got["average"] == pytest.approx(np.mean([b.sum() for b in blocks]))
    assert got["min"] == min(b[0, 0] for b in blocks) and got["max"] == max(b[0, 0] for b in blocks)
    np.testing.assert_array_equal(got["from_root"], blocks[0][0])


def test_state_carried_between_runs_stays_with_its_replica(result):
    x = np.arange(2 * REPLICAS * 3, dtype=np.float32).reshape(2 * REPLICAS, 3)
    np.testing.assert_array_equal(result["carried_first"], 3.0 * x[:2])  # x + 2x of replica 0
    assert result["per_replica_none"] is True
    assert result["carried_traces"] == 1  # a state from per_replica and one from run are of one kind


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_gradient_tape_averages_over_replicas(result, sparse_as_dense):
    got = result[f"grads_dense={sparse_as_dense}"]
    assert got["sparse"] is (not sparse_as_dense)
    scales = [r + 1.0 for r in range(REPLICAS)]  # replica r weighs its loss by r + 1
    np.testing.assert_allclose(got["w"], 2 * np.array([1.0, 2.0, 3.0]) * np.mean(scales), rtol=1e-6)
    expected = np.zeros([4, 2])
    ids = np.arange(2 * REPLICAS) % 4
    for r in range(REPLICAS):
        for i in ids[2 * r:2 * r + 2]:
            expected[i] += scales[r] / REPLICAS
    np.testing.assert_allclose(got["emb"], expected, rtol=1e-6)


def test_process_collectives_and_broadcast(result):
    assert result["objects"] == [[{"r": 0}], "hi", 42]
    assert result["after_broadcast"] == [5.0, 6.0]
    assert "'outside:0'" in result["outside_scope_error"]
    assert "dist.scope()" in result["outside_scope_error"]


def test_fp16_compression_averages_values_whose_sum_overflows_float16(result):
    got = result["fp16_average"]
    assert got["dtype"] == "float32"
    scales = np.arange(1, REPLICAS + 1)
    np.testing.assert_allclose(got["dense"], np.float16([30000.0 * scales.mean(), 1.5]), rtol=2 ** -10)
    rows = np.zeros([4, 2])
    for r in range(REPLICAS):
        rows[2 * r] += (r + 1.0) / REPLICAS  # replica r's first id is 2r
    np.testing.assert_allclose(got["rows"], rows, rtol=1e-6)
