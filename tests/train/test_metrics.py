"""Perplexity, the progress bar's lines, the step lines of a plan in steps, TensorBoard scalars."""
import io
import math
import os

import pytest

from lmkit.train.metrics import ProgressBar, StepLines, Summaries, duration, perplexity


def test_perplexity_is_exp_of_the_loss_capped_and_nan_when_not_finite():
    assert perplexity(math.log(40.0)) == pytest.approx(40.0)
    assert perplexity(1e6) == math.exp(700.0)  # a diverged run prints a huge number, not an OverflowError
    assert math.isnan(perplexity(float("inf"))) and math.isnan(perplexity(float("nan")))


def test_the_bar_prints_a_line_every_few_steps_off_a_terminal_and_nothing_when_disabled():
    out = io.StringIO()
    bar = ProgressBar(25, "epoch 1/3", stream=out, every=10)
    for step in range(1, 26):
        bar.update(step, "ppl 5.00")
    bar.close()
    assert out.getvalue().splitlines() == ["epoch 1/3 step 10/25 ppl 5.00", "epoch 1/3 step 20/25 ppl 5.00",
                                           "epoch 1/3 step 25/25 ppl 5.00"]
    quiet = io.StringIO()
    ProgressBar(25, "epoch 1/3", stream=quiet, enabled=False).update(25)
    assert quiet.getvalue() == "" and ProgressBar(25, "e", stream=quiet).every == 2  # about ten lines an epoch


def test_step_lines_average_the_loss_since_the_last_line_and_say_what_is_left():
    lines = []
    step_lines = StepLines(100, 0, lines.append, flops_per_token=1e6, peak_flops_tera=1.0)
    assert step_lines.every == 2 and step_lines.due(2) and step_lines.due(100) and not step_lines.due(3)
    step_lines.add(9.0, 3)  # three steps of per-token losses summing to 9
    line = step_lines.show(10, 0.001, 1e5, 2.0)
    assert line == "step 10/100 | loss 3.0000 | lr 0.001 | 100,000 tokens/s | MFU 10.0% | eta 45s" and lines == [line]
    assert "| loss - |" in step_lines.show(12, 0.001, 0.0, 0.0)  # nothing read since, nothing timed
    assert (duration(42), duration(185), duration(3725)) == ("42s", "3m05s", "1h02m")


def test_summaries_write_only_where_there_is_a_folder(tmp_path):
    Summaries(None).write(1, {"train/perplexity": 3.0})  # rank > 0: nothing, no error
    Summaries(str(tmp_path / "tb")).write(1, {"train/perplexity": 3.0, "valid/perplexity": None})
    assert any(name.startswith("events") for name in os.listdir(tmp_path / "tb"))
