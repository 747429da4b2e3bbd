"""End to end: train a tiny model with the PTB examples, then generate through examples/generate.py.

Each script runs as a subprocess with a timeout. The generated corpus is kept
small that ``--max_steps 30`` (the run's plan) goes through epochs of 9 steps
and ends with a checkpoint, which generation needs.
"""
import concurrent.futures
import json
import os
import re
import shutil
import sys
from typing import List, Sequence, Set, Tuple

import pytest

from tests.helpers import ROOT, mpirun_cmd, run, tiny_config_file, write_ptb_corpus

GENERATE = os.path.join(ROOT, "examples", "generate.py")
SINGLE = os.path.join(ROOT, "examples", "lm_ptb.py")
TRAIN = ["-m", "lmkit", "train"]  # under mpirun
SAMPLE_LINE = re.compile(r"^\[(\d+)\.(\d+)\] ?(.*)$")
PROMPT = "w1 w8"
MAX_LENGTH = 12
TOP_P = ["--prompt", PROMPT, "--strategy", "top_p", "--top_p", "0.9", "--num_samples", "3",
         "--max_length", str(MAX_LENGTH), "--seed", "0", "--stop_at_eos"]  # one sentence a sample
TRANSFORMER = dict(model="transformer", num_heads=2, max_positions=16, hidden_size=16,
                   optimizer="adam", learning_rate=0.01)

Sample = Tuple[int, int, List[str]]  # (prompt index, sample index, words)


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------
def train(tmp_path, launcher: Sequence[str], **config) -> str:
    """Trains on a generated corpus with ``--max_steps 30``; returns the model folder."""
    data, model_dir = str(tmp_path / "data"), str(tmp_path / "model")
    vocab_size = write_ptb_corpus(data, lines=(30, 10, 10))
    cfg = tiny_config_file(str(tmp_path), vocab_size, **config)
    args = ["--config", cfg, "--data_path", data, "--model_dir", model_dir, "--max_steps", "30"]
    res = run([*launcher, *args], timeout=400)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    assert os.listdir(os.path.join(model_dir, "checkpoints")), res.stdout
    return model_dir


def generate_cmd(model_dir: str, flags: Sequence[str]) -> List[str]:
    return [sys.executable, GENERATE, "--model_dir", model_dir, *flags]


def run_all(cmds: Sequence[Sequence[str]], timeout: float = 240) -> list:
    """Runs independent commands two at a time (each spends seconds importing TensorFlow)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda cmd: run(cmd, timeout=timeout), cmds))


def vocabulary(model_dir: str) -> Set[str]:
    with open(os.path.join(model_dir, "vocab.txt"), encoding="utf-8") as f:
        return {line.rstrip("\n") for line in f}


def check_samples(res, model_dir: str, prompts: Sequence[str], num_samples: int) -> List[Sample]:
    """Asserts the output of a successful run: one line per sample, each continuing its prompt."""
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    lines = res.stdout.splitlines()
    assert len(lines) == len(prompts) * num_samples, res.stdout
    vocab = vocabulary(model_dir) - {"<eos>"}  # a generated <eos> ends a sample, unprinted
    samples = []
    for n, line in enumerate(lines):
        m = SAMPLE_LINE.match(line)
        assert m, line
        i, j, words = int(m.group(1)), int(m.group(2)), m.group(3).split()
        assert (i, j) == divmod(n, num_samples), line
        prompt = [w if w in vocab else "<unk>" for w in prompts[i].split()]
        assert words[:len(prompt)] == prompt, line
        assert len(words) <= MAX_LENGTH, line
        assert set(words) <= vocab, set(words) - vocab
        samples.append((i, j, words))
    return samples


def check_one_error(res, expected: str) -> None:
    """Bad input: exit 2, nothing on stdout, one message on stderr and no traceback."""
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stdout == ""
    assert "Traceback" not in res.stderr, res.stderr
    errors = [line for line in res.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and expected in errors[0], res.stderr


@pytest.fixture(scope="module")
def lstm_dir(tmp_path_factory) -> str:
    return train(tmp_path_factory.mktemp("lstm"), [sys.executable, SINGLE])


@pytest.fixture(scope="module")
def transformer_dir(tmp_path_factory) -> str:
    return train(tmp_path_factory.mktemp("transformer"), [sys.executable, SINGLE], **TRANSFORMER)


# --------------------------------------------------------------------------
# one-process training (LSTM)
# --------------------------------------------------------------------------
def test_top_p_samples_continue_the_prompt_and_repeat_with_the_seed(lstm_dir):
    first, second = run_all([generate_cmd(lstm_dir, TOP_P)] * 2)
    samples = check_samples(first, lstm_dir, [PROMPT], 3)
    assert len({" ".join(words) for _, _, words in samples}) > 1  # rows draw independently
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout == first.stdout  # same seed, same text


def test_greedy_and_beam_run_and_greedy_matches_the_library(lstm_dir):
    import numpy as np

    from lmkit import decoding
    from lmkit.train.checkpoint import load_model

    prompts = [PROMPT, "w3 zzz"]  # zzz is not a word of the corpus
    greedy, beam = run_all([
        generate_cmd(lstm_dir, ["--prompt", prompts[0], "--prompt", prompts[1], "--strategy", "greedy",
                                "--num_samples", "2", "--max_length", str(MAX_LENGTH), "--stop_at_eos"]),
        generate_cmd(lstm_dir, ["--prompt", PROMPT, "--strategy", "beam", "--beam_width", "4",
                                "--num_samples", "3", "--max_length", str(MAX_LENGTH), "--stop_at_eos"]),
    ])
    greedy_samples = check_samples(greedy, lstm_dir, prompts, 2)
    assert greedy_samples[0][2] == greedy_samples[1][2]  # greedy ignores the sample index
    assert re.search(r"warning: prompt 1: 'zzz' not in the vocabulary .* read as <unk>", greedy.stderr)
    assert "prompt 0" not in greedy.stderr

    beam_samples = check_samples(beam, lstm_dir, [PROMPT], 3)
    assert len({" ".join(words) for _, _, words in beam_samples}) == 3  # distinct hypotheses

    # The script's greedy output equals the library's, from the same checkpoint.
    model, tokenizer, _ = load_model(lstm_dir)
    for (_, _, words), prompt in zip(greedy_samples[::2], prompts):
        result = decoding.decode(model, MAX_LENGTH + 1, decoding.GreedySampler(),
                                 prompts=[tokenizer.encode(prompt)],
                                 eos_id=tokenizer.eos_id, start_id=tokenizer.eos_id)
        ids = result.sequences()[0][1:]  # without the start token
        if len(ids) > len(prompt.split()) and ids[-1] == tokenizer.eos_id:
            ids = ids[:-1]
        np.testing.assert_array_equal(words, tokenizer.decode(ids).split())


# --------------------------------------------------------------------------
# transformer and distributed training
# --------------------------------------------------------------------------
def test_transformer_from_one_process(transformer_dir):
    model_dir = transformer_dir
    top_p, beam = run_all([
        generate_cmd(model_dir, TOP_P),
        generate_cmd(model_dir, ["--prompt", PROMPT, "--strategy", "beam", "--num_samples", "2",
                                 "--max_length", str(MAX_LENGTH), "--stop_at_eos"]),
    ])
    check_samples(top_p, model_dir, [PROMPT], 3)
    check_samples(beam, model_dir, [PROMPT], 2)


@pytest.mark.horovod
@pytest.mark.mpi
def test_lstm_from_two_workers(tmp_path):
    model_dir = train(tmp_path, mpirun_cmd(2, TRAIN))
    with open(os.path.join(model_dir, "results.json"), encoding="utf-8") as f:
        assert json.load(f)["world_size"] == 2
    first, second = run_all([generate_cmd(model_dir, TOP_P)] * 2)
    check_samples(first, model_dir, [PROMPT], 3)
    assert second.stdout == first.stdout


# --------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------
def test_bad_input_exits_2_with_one_message(lstm_dir, transformer_dir, tmp_path):
    no_checkpoint = tmp_path / "no_checkpoint"  # a run stopped before its first checkpoint
    no_checkpoint.mkdir()
    for name in ("config.json", "vocab.txt"):
        shutil.copy(os.path.join(lstm_dir, name), no_checkpoint / name)
    (tmp_path / "empty").mkdir()
    cases = [  # the first two load TensorFlow, the others answer before
        (["--model_dir", str(no_checkpoint)], "holds no complete checkpoint"),
        # max_positions 16: other strategies slide the window, beam search cannot
        (["--model_dir", transformer_dir, "--strategy", "beam", "--max_length", "40"],
         "beam search cannot go past the model's context of 16 tokens"),
        (["--model_dir", lstm_dir, "--strategy", "nucleus"], "invalid choice: 'nucleus'"),
        (["--model_dir", str(tmp_path / "missing")], "does not exist"),
        (["--model_dir", str(tmp_path / "empty")], "holds no config.json"),
        (["--model_dir", lstm_dir, "--prompt", " "], "is empty"),
        (["--model_dir", lstm_dir, "--prompt", PROMPT, "--max_length", "2"], "use --max_length 3"),
        (["--model_dir", lstm_dir, "--checkpoint", "ckpt-7"], "is not a checkpoint folder"),
        (["--model_dir", lstm_dir, "--strategy", "beam", "--num_samples", "5"],
         "use --beam_width 5"),
    ]
    results = run_all([[sys.executable, GENERATE, *flags] for flags, _ in cases])
    for (flags, expected), res in zip(cases, results):
        check_one_error(res, expected)
