"""examples/lm_ptb_distributed.py, composed from lmkit's modules, trains as ``lmkit train`` does.

Both run under ``mpirun -np 2`` on a generated PTB-style corpus with the same
config and seed (dropout on, the learning rate decayed after the first
epoch): every epoch's training and validation perplexity, the test
perplexity and the final weights agree to float32 rounding. The example's
folder is a run folder that ``lmkit evaluate`` reads.

It keeps lmkit train's promises: a SIGTERM to one rank in the middle of an
epoch stops both ranks at the same step with a checkpoint there and exit
status 75, and the same command again continues to the end with the losses
and weights of a run that was never stopped; rank 0 writes TensorBoard
summaries and a progress line every ``--log_every_steps`` steps.
"""
import glob
import json
import os
import re
import sys

import pytest

from tests.examples.support import (
    EXAMPLES,
    LMKIT_TRAIN,
    RTOL,
    assert_same_perplexities,
    assert_same_weights,
    results,
    run_two_ranks,
)
from tests.helpers import ROOT, mpirun_cmd, run, tiny_config_file, write_ptb_corpus

EXAMPLE = os.path.join(EXAMPLES, "lm_ptb_distributed.py")
SIGNAL = os.path.join(ROOT, "tests", "scripts", "signal_at_step.py")
PREEMPTED = 75
EPOCH_LINE = re.compile(r"^Epoch (\d)/3: lr \S+ \| train ppl [\d.]+ \| valid ppl [\d.]+ \| \d+ tokens/sec "
                        r"\(2 worker\(s\)\)", re.MULTILINE)


@pytest.mark.horovod
@pytest.mark.mpi
def _tiny_run(tmp_path):
    """The flags of a 3-epoch run (55 steps an epoch on 2 ranks, dropout on) and its vocabulary's size."""
    data = str(tmp_path / "data")
    vocab_size = write_ptb_corpus(data, lines=(200, 30, 30))
    config = tiny_config_file(str(tmp_path), vocab_size, num_epochs=3, keep_prob=0.8, hidden_size=16)
    return ["--config", config, "--data_path", data], vocab_size


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The example on 2 ranks from start to end, with its output."""
    tmp_path = tmp_path_factory.mktemp("example")
    flags, vocab_size = _tiny_run(tmp_path)
    example_dir = str(tmp_path / "example")
    res = run(mpirun_cmd(2, [EXAMPLE, *flags, "--model_dir", example_dir, "--log_every_steps", "20"]), timeout=400)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    return flags, vocab_size, example_dir, res


@pytest.mark.horovod
@pytest.mark.mpi
def test_example_trains_as_lmkit_train_under_mpirun(uninterrupted, tmp_path):
    flags, vocab_size, example_dir, res = uninterrupted
    out, cli_dir = res.stdout, str(tmp_path / "cli")
    run_two_ranks([*LMKIT_TRAIN, *flags, "--model_dir", cli_dir])

    assert [m.group(1) for m in EPOCH_LINE.finditer(out)] == ["1", "2", "3"], out  # rank 0 alone logs
    # A progress line every 20 steps and at each epoch's end, from rank 0 alone.
    assert re.findall(r"^epoch 2/3 step (\d+)/55 ppl [\d.]+ \d+ tokens/s$", res.stderr, re.MULTILINE) == \
        ["20", "40", "55"], res.stderr[-3000:]
    assert set(_summaries(example_dir)) == {"train/perplexity", "train/learning_rate", "train/tokens_per_sec",
                                            "valid/perplexity"}
    example, cli = results(example_dir), results(cli_dir)
    assert_same_perplexities(example, cli, ("train_perplexity", "valid_perplexity", "learning_rate"))
    assert [e["learning_rate"] for e in example["epochs"]] == [1.0, 0.5, 0.25]
    assert example["epochs"][-1]["valid_perplexity"] < example["epochs"][0]["valid_perplexity"] < vocab_size
    assert_same_weights(example_dir, cli_dir)

    # The example's folder is lmkit's run folder: lmkit evaluate scores its test split as the example did.
    res = run([sys.executable, "-m", "lmkit", "evaluate", "--model_dir", example_dir, "--split", "test",
               "--data_path", flags[flags.index("--data_path") + 1], "--json"], timeout=200)
    assert res.returncode == 0, res.stderr[-4000:]
    assert json.loads(res.stdout)["perplexity"] == pytest.approx(example["test_perplexity"], rel=1e-4)


def test_example_refuses_a_model_it_does_not_build(tmp_path):
    res = run([sys.executable, EXAMPLE, "--config", "config_transformer", "--model_dir", str(tmp_path / "m")],
              timeout=200)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "error: this example trains an RNN on PTB; config_transformer has model 'transformer'" in res.stderr
    assert not os.path.exists(tmp_path / "m")


@pytest.mark.horovod
@pytest.mark.mpi
def test_sigterm_mid_epoch_stops_both_ranks_and_the_rerun_continues_exactly(uninterrupted, tmp_path):
    flags, _, straight_dir, _ = uninterrupted
    stopped = str(tmp_path / "stopped")
    # Rank 1 alone gets SIGTERM before its step 70 (15 steps into epoch 2): its request rides in step 70's
    # all-reduce, both ranks decide on it after step 71 started, and both stop after it.
    res = run(mpirun_cmd(2, [SIGNAL, "--rank", "1", "--step", "70", "--", EXAMPLE, *flags, "--model_dir", stopped]),
              timeout=400)
    assert res.returncode == PREEMPTED, res.stdout[-3000:] + res.stderr[-5000:]
    assert res.stderr.count("preempted: stopped by ") == 1, res.stderr[-3000:]  # one line, from rank 0
    assert re.search(r"preempted: stopped by a signal on another rank at step 71 \(epoch 2, 16 steps into it\); "
                     r"checkpoint \S+/ckpt-000000071; rerun the same command to continue", res.stderr), \
        res.stderr[-3000:]
    with open(os.path.join(stopped, "checkpoints", "ckpt-000000071", "meta.json")) as f:
        meta = json.load(f)
    assert (meta["epoch"], meta["steps_in_epoch"], meta["stopped_by"], meta["world_size"]) == (1, 16, "preemption", 2)
    assert os.path.isfile(os.path.join(stopped, "checkpoints", "ckpt-000000071", "rnn_state.npz"))

    out = run_two_ranks([EXAMPLE, *flags, "--model_dir", stopped])  # the same command again
    assert "resumed from " in out and "ckpt-000000071 at step 71 (epoch 2, 16 steps into it)" in out, out
    assert [m.group(1) for m in EPOCH_LINE.finditer(out)] == ["2", "3"], out
    resumed, straight = results(stopped), results(straight_dir)
    # Epoch 2's training perplexity covers its last 39 steps only; everything after the resume is the same.
    for mine, theirs in zip(resumed["epochs"], straight["epochs"][1:]):
        for key in ("valid_perplexity", "learning_rate"):
            assert mine[key] == pytest.approx(theirs[key], rel=RTOL), (key, mine, theirs)
    assert resumed["epochs"][1]["train_perplexity"] == pytest.approx(straight["epochs"][2]["train_perplexity"],
                                                                     rel=RTOL)
    assert resumed["test_perplexity"] == pytest.approx(straight["test_perplexity"], rel=RTOL)
    assert_same_weights(stopped, straight_dir)


def _summaries(model_dir):
    """The scalars of ``model_dir/tensorboard``: ``{tag: [(step, value), ...]}``."""
    import tensorflow as tf
    from tensorflow.core.util import event_pb2

    tags = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "tensorboard", "events.*"))):
        for record in tf.data.TFRecordDataset(path):
            event = event_pb2.Event.FromString(record.numpy())
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append((event.step, float(tf.make_ndarray(value.tensor))))
    return tags
