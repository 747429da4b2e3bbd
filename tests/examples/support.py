"""What the tests of examples/ share: runs under ``mpirun -np 2`` and the comparison with ``lmkit train``."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Sequence

import numpy as np
import pytest

from tests.helpers import ROOT, assert_relatively_close, mpirun_cmd, run

EXAMPLES = os.path.join(ROOT, "examples")
LMKIT_TRAIN = ["-m", "lmkit", "train"]
RTOL = 1e-5  # float32 rounding: the two runs do the same operations in the same order


def run_two_ranks(args: Sequence[str], timeout: float = 400) -> str:
    """``mpirun -np 2 python ARGS``; returns its output (asserting exit status 0)."""
    res = run(mpirun_cmd(2, list(args)), timeout=timeout)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    return res.stdout


def results(model_dir: str) -> Dict[str, Any]:
    """The ``results.json`` a run wrote (rank 0's perplexities)."""
    with open(os.path.join(model_dir, "results.json")) as f:
        return json.load(f)


def assert_same_perplexities(example: Dict[str, Any], cli: Dict[str, Any], keys: Sequence[str]) -> None:
    """Every epoch's perplexities (and the test perplexity, when ``lmkit train`` has one) agree to ``RTOL``."""
    assert example["world_size"] == cli["world_size"] == 2
    assert len(example["epochs"]) == len(cli["epochs"]) > 0
    for mine, theirs in zip(example["epochs"], cli["epochs"]):
        for key in keys:
            assert mine[key] == pytest.approx(theirs[key], rel=RTOL), (key, mine, theirs)
    if cli.get("test_perplexity") is not None:
        assert example["test_perplexity"] == pytest.approx(cli["test_perplexity"], rel=RTOL)


def model_weights(model_dir: str) -> Dict[str, np.ndarray]:
    """The model's variables in the newest checkpoint of ``model_dir``, by checkpoint key."""
    import tensorflow as tf

    folder = os.path.join(model_dir, "checkpoints")
    reader = tf.train.load_checkpoint(os.path.join(folder, sorted(os.listdir(folder))[-1], "ckpt"))
    return {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map() if key.startswith("model/")}


def assert_same_weights(example_dir: str, cli_dir: str) -> None:
    """The two runs' last checkpoints hold the same model variables, equal to ``RTOL`` (each tensor whole)."""
    mine, theirs = model_weights(example_dir), model_weights(cli_dir)
    assert mine and sorted(mine) == sorted(theirs)
    for key in mine:
        assert_relatively_close(mine[key], theirs[key], RTOL, key)
