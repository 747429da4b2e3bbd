"""What a run reports: its log lines, results.json and TensorBoard scalars (rank 0)."""
import json
import math
import os

import pytest

from lmkit import distributed as dist
from tests.train.support import small_config as _config
from tests.train.support import train as _train


def test_results_json_and_tensorboard(tmp_path):
    model_dir = tmp_path / "m"
    _train(_config(keep_prob=1.0), str(model_dir), 2)
    results = json.loads((model_dir / "results.json").read_text())
    assert [e["epoch"] for e in results["epochs"]] == [1, 2]
    assert results["world_size"] == dist.size()
    assert any(f.startswith("events") for f in os.listdir(model_dir / "tensorboard"))


def _stats(**changes):
    from lmkit.train.records import EpochStats
    values = dict(epoch=2, train_perplexity=54.991, valid_perplexity=54.8636, learning_rate=0.5,
                  tokens_per_sec=1905.4, epoch_time=0.94, cumulative_time=1.52, steps=55)
    values.update(changes)
    return EpochStats(**values)


def test_the_epoch_line_as_tests_and_users_read_it():
    from lmkit.train.reporting import epoch_line
    assert epoch_line(_stats(), 3, 2) == (
        "Epoch 2/3: lr 0.5 | train ppl 54.99 | valid ppl 54.86 | 1905 tokens/sec (2 worker(s)) | epoch time 0.9 s | "
        "cumulative training time 1.5 s")
    line = epoch_line(_stats(valid_perplexity=None, train_word_perplexity=300.0, loss_scale=1024.0, skipped_steps=2,
                             model_tflops=0.5, mfu=0.25), 3, 1)
    assert "train ppl 54.99 (per word 300.00) | valid ppl - |" in line
    assert line.endswith("| loss scale 1024, 2 step(s) skipped | model 0.5 TFLOP/s, MFU 25.0%")


def test_rank_0_alone_writes_results_json_and_summaries(tmp_path):
    from lmkit.train.records import TrainResult
    from lmkit.train.reporting import Flops, Reporter

    lines = []
    for chief, folder in ((False, tmp_path / "other"), (True, tmp_path / "chief")):
        reporter = Reporter(_config(), lines.append, world=2, loss_tokens=5, flops=Flops(1e6, None, ""))
        reporter.open(str(folder), chief, {"train": [0] * 100}, {"train": 50})
        result = TrainResult()
        reporter.epoch_end(_stats(), 3, 110, result)
        reporter.write_results(str(folder), result)
        assert [s.epoch for s in result.epochs] == [2]
    assert not (tmp_path / "other").exists()
    results = json.loads((tmp_path / "chief" / "results.json").read_text())
    assert results["world_size"] == 2 and results["flops_per_token"] == 1e6 and results["epochs"][0]["steps"] == 55
    assert os.listdir(tmp_path / "chief" / "tensorboard")
    assert reporter.word_perplexity(1.0, "train") == pytest.approx(math.exp(2.0))  # 2 tokens a word
    assert reporter.word_perplexity(1.0, "valid") is None


def test_a_run_in_steps_announces_its_plan_and_prints_step_lines():
    from lmkit.train.reporting import Reporter
    lines = []
    reporter = Reporter(_config(num_epochs=0, max_steps=20, log_every_steps=10), lines.append, world=1,
                        loss_tokens=5)
    reporter.announce(object(), {"local_batch": 4, "micro_batch": 4, "unit": "x 5 steps"}, 59, 0, 1)
    assert lines == ["training object on 1 worker(s): global batch 4 (4 per worker) x 5 steps, 59 steps/epoch, "
                     "20 steps (400 tokens; 1 epoch(s))"]
    assert reporter.step_lines is not None and reporter.step_lines.due(10) and not reporter.step_lines.due(11)
