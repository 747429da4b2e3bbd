"""examples/lm_text.py, a small GPT composed from lmkit's modules, trains as ``lmkit train`` does.

Both run under ``mpirun -np 2`` on the same text, config and seed (a char
tokenizer, dropout, AdamW with warmup and a cosine schedule, shuffled
windows): the loss goes down, and every epoch's perplexities and the final
weights agree to float32 rounding.
"""
import json
import os

import numpy as np
import pytest

from tests.examples.support import (
    EXAMPLES,
    LMKIT_TRAIN,
    assert_same_perplexities,
    assert_same_weights,
    results,
    run_two_ranks,
)

EXAMPLE = os.path.join(EXAMPLES, "lm_text.py")
CONFIG = dict(model="transformer", vocab_size=64, hidden_size=16, num_layers=2, num_heads=2, ffn_dim=32,
              max_positions=16, pre_layer_norm=True, tie_weights=True, init_scale=0.05, keep_prob=0.9,
              batch_size=8, num_steps=16, num_epochs=3, optimizer="adamw",
              optimizer_params={"beta1": 0.9, "beta2": 0.99, "epsilon": 1e-8, "weight_decay": 0.1},
              learning_rate=1e-2, max_grad_norm=1.0, warmup_epochs=0.2, schedule="cosine",
              schedule_params={"warmup_start_factor": 0.0})


def write_text(path: str, lines: int, seed: int) -> str:
    """Lines of a small, learnable language: each letter tends to follow the one before."""
    rng = np.random.RandomState(seed)
    letters = "abcdefghij"
    out = []
    for _ in range(lines):
        k = rng.randint(len(letters))
        word = []
        for _ in range(rng.randint(8, 30)):
            word.append(letters[k])
            k = (k + 3) % len(letters) if rng.rand() < 0.85 else rng.randint(len(letters))
        out.append(" ".join("".join(word[i:i + 4]) for i in range(0, len(word), 4)))
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
    return path


@pytest.mark.horovod
@pytest.mark.mpi
def test_example_trains_as_lmkit_train_under_mpirun(tmp_path):
    config = tmp_path / "config_text.py"
    config.write_text("".join(f"{k} = {v!r}\n" for k, v in CONFIG.items()))
    flags = ["--config", str(config), "--tokenizer", "char",
             "--train_file", write_text(str(tmp_path / "train.txt"), 150, 0),
             "--valid_file", write_text(str(tmp_path / "valid.txt"), 20, 1)]
    example_dir, cli_dir = str(tmp_path / "example"), str(tmp_path / "cli")

    run_two_ranks([EXAMPLE, *flags, "--model_dir", example_dir])
    run_two_ranks([*LMKIT_TRAIN, *flags, "--model_dir", cli_dir])

    example = results(example_dir)
    with open(os.path.join(example_dir, "config.json")) as f:
        vocab_size = json.load(f)["model"]["vocab_size"]  # the char tokenizer's (config.json by section)
    train_ppl = [e["train_perplexity"] for e in example["epochs"]]
    assert train_ppl[2] < train_ppl[1] < train_ppl[0]
    assert example["epochs"][-1]["valid_perplexity"] < vocab_size / 2  # learned: far better than uniform
    assert_same_perplexities(example, results(cli_dir), ("train_perplexity", "valid_perplexity", "learning_rate"))
    assert_same_weights(example_dir, cli_dir)
