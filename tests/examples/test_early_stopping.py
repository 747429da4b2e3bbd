"""examples/early_stopping.py: callbacks of the user's own print the loss and stop the run early.

A ``min_delta`` no fall of the loss can reach makes the second evaluation
(every 5 steps) end the run: rank 0 asks after step 10, every rank ends
after step 12 with a checkpoint there, and the command exits 0. Under
``mpirun -np 2`` the request of rank 0 ends rank 1 at the same step.
"""
import json
import os
import sys

import pytest

from tests.examples.support import EXAMPLES, run_two_ranks
from tests.examples.test_lm_text import CONFIG, write_text
from tests.helpers import run

EXAMPLE = os.path.join(EXAMPLES, "early_stopping.py")


def _flags(tmp_path):
    config = tmp_path / "config_text.py"
    config.write_text("".join(f"{k} = {v!r}\n" for k, v in CONFIG.items()))
    return ["--config", str(config), "--tokenizer", "char", "--patience", "1", "--min_delta", "1e9",
            "--train_file", write_text(str(tmp_path / "train.txt"), 150, 0),
            "--valid_file", write_text(str(tmp_path / "valid.txt"), 20, 1), "--set", "run.eval_every_steps=5"]


def _last_checkpoint(model_dir):
    folder = os.path.join(model_dir, "checkpoints")
    with open(os.path.join(folder, sorted(os.listdir(folder))[-1], "meta.json")) as f:
        return json.load(f)


def _check(out, model_dir):
    assert "no improvement of the validation loss for 1 evaluation(s): stopping" in out, out[-3000:]
    assert out.count("step 1: loss ") == 1, out[-3000:]  # LossPrinter, rank 0 alone: the first step is read back
    meta = _last_checkpoint(model_dir)
    assert (meta["step"], meta["stopped_by"]) == (12, "a callback")
    with open(os.path.join(model_dir, "results.json")) as f:
        assert json.load(f)["global_step"] == 12


def test_the_example_stops_early_through_a_callback(tmp_path):
    model_dir = str(tmp_path / "m")
    res = run([sys.executable, EXAMPLE, *_flags(tmp_path), "--model_dir", model_dir], timeout=400)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    _check(res.stdout, model_dir)


@pytest.mark.horovod
@pytest.mark.mpi
def test_rank_0s_stop_ends_both_ranks_at_the_same_step(tmp_path):
    model_dir = str(tmp_path / "m")
    _check(run_two_ranks([EXAMPLE, *_flags(tmp_path), "--model_dir", model_dir]), model_dir)
