"""examples/lm_ptb_distributed.py, composed from lmkit's modules, trains as ``lmkit train`` does.

Both run under ``mpirun -np 2`` on a generated PTB-style corpus with the same
config and seed (dropout on, the learning rate decayed after the first
epoch): every epoch's training and validation perplexity, the test
perplexity and the final weights agree to float32 rounding. The example's
folder is a run folder that ``lmkit evaluate`` reads.
"""
import json
import os
import re
import sys

import pytest

from tests.examples.support import (
    EXAMPLES,
    LMKIT_TRAIN,
    assert_same_perplexities,
    assert_same_weights,
    results,
    run_two_ranks,
)
from tests.helpers import run, tiny_config_file, write_ptb_corpus

EXAMPLE = os.path.join(EXAMPLES, "lm_ptb_distributed.py")
EPOCH_LINE = re.compile(r"^Epoch (\d)/3: lr \S+ \| train ppl [\d.]+ \| valid ppl [\d.]+ \| \d+ tokens/sec "
                        r"\(2 worker\(s\)\)", re.MULTILINE)


@pytest.mark.horovod
@pytest.mark.mpi
def test_example_trains_as_lmkit_train_under_mpirun(tmp_path):
    data = str(tmp_path / "data")
    vocab_size = write_ptb_corpus(data, lines=(200, 30, 30))
    config = tiny_config_file(str(tmp_path), vocab_size, num_epochs=3, keep_prob=0.8, hidden_size=16)
    flags = ["--config", config, "--data_path", data]
    example_dir, cli_dir = str(tmp_path / "example"), str(tmp_path / "cli")

    out = run_two_ranks([EXAMPLE, *flags, "--model_dir", example_dir])
    run_two_ranks([*LMKIT_TRAIN, *flags, "--model_dir", cli_dir])

    assert [m.group(1) for m in EPOCH_LINE.finditer(out)] == ["1", "2", "3"], out  # rank 0 alone logs
    example, cli = results(example_dir), results(cli_dir)
    assert_same_perplexities(example, cli, ("train_perplexity", "valid_perplexity", "learning_rate"))
    assert [e["learning_rate"] for e in example["epochs"]] == [1.0, 0.5, 0.25]
    assert example["epochs"][-1]["valid_perplexity"] < example["epochs"][0]["valid_perplexity"] < vocab_size
    assert_same_weights(example_dir, cli_dir)

    # The example's folder is lmkit's run folder: lmkit evaluate scores its test split as the example did.
    res = run([sys.executable, "-m", "lmkit", "evaluate", "--model_dir", example_dir, "--split", "test",
               "--data_path", data, "--json"], timeout=200)
    assert res.returncode == 0, res.stderr[-4000:]
    assert json.loads(res.stdout)["perplexity"] == pytest.approx(example["test_perplexity"], rel=1e-4)


def test_example_refuses_a_model_it_does_not_build(tmp_path):
    res = run([sys.executable, EXAMPLE, "--config", "config_transformer", "--model_dir", str(tmp_path / "m")],
              timeout=200)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "error: this example trains an RNN on PTB; config_transformer has model 'transformer'" in res.stderr
    assert not os.path.exists(tmp_path / "m")
