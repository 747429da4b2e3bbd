"""``lmkit train`` on text under the native launcher (no Horovod: runs on the newest TensorFlow too)."""
import json
import os
import sys

from tests.cli.test_cli_text import SMALL, write_corpus
from tests.helpers import run


def test_native_launcher_trains_text_on_two_workers(tmp_path):
    files = write_corpus(str(tmp_path / "corpus"), lines=120)
    model_dir = str(tmp_path / "model")
    cmd = [sys.executable, "-m", "lmkit.launch", "--hosts", "127.0.0.1", "--num_workers", "2", "--",
           sys.executable, "-m", "lmkit", "train", "--backend", "native", "--config", "config_transformer",
           "--train_file", files["train"], "--valid_file", files["valid"], "--tokenizer", "byte",
           "--model_dir", model_dir, "--max_steps", "3", *SMALL]
    res = run(cmd, timeout=400)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    with open(os.path.join(model_dir, "results.json"), encoding="utf-8") as f:
        results = json.load(f)
    assert results["world_size"] == 2 and results["global_step"] == 3
    assert results["config"]["distribution"]["backend"] == "native"
    assert results["epochs"][-1]["valid_word_perplexity"] > results["epochs"][-1]["valid_perplexity"]
    assert os.path.isdir(results["checkpoint"])
