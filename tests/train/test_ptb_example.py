"""End to end: the PTB examples on generated data served from 127.0.0.1."""
import json
import os
import re
import sys

import pytest

from tests.helpers import ROOT, StaticServer, make_ptb_archive, mpirun_cmd, run, tiny_config_file

TRAIN = ["-m", "lmkit", "train"]  # under mpirun (the distributed example composes modules: tests/examples)
SINGLE = os.path.join(ROOT, "examples", "lm_ptb.py")
EPOCH_LINE = re.compile(r"Epoch (\d+)/(\d+): lr (\S+) \| train ppl ([\d.]+) \| valid ppl ([\d.]+) \| "
                        r"(\d+) tokens/sec \((\d) worker\(s\)\) \| epoch time [\d.]+ s \| "
                        r"cumulative training time [\d.]+ s")


@pytest.fixture()
def served_ptb(tmp_path):
    www = tmp_path / "www"
    www.mkdir()
    vocab = make_ptb_archive(str(www / "simple-examples.tgz"))
    with StaticServer(str(www)) as server:
        yield server, vocab


@pytest.mark.horovod
@pytest.mark.mpi
def test_distributed_example_downloads_trains_and_reports(tmp_path, served_ptb):
    server, vocab = served_ptb
    cfg = tiny_config_file(str(tmp_path), vocab, num_epochs=2)
    data, model_dir = tmp_path / "data", tmp_path / "model"
    args = [*TRAIN, "--config", cfg, "--data_path", str(data), "--model_dir", str(model_dir),
            "--data_url", f"{server.url}/simple-examples.tgz", "--no_verify_data"]
    res = run(mpirun_cmd(2, args), timeout=400)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    # Only rank 0 downloaded, once.
    assert server.requests == ["/simple-examples.tgz"]
    assert sorted(os.listdir(data / "simple-examples" / "data")) == [
        "ptb.test.txt", "ptb.train.txt", "ptb.valid.txt"]
    epochs = [m.groups() for m in EPOCH_LINE.finditer(res.stdout)]
    assert [e[0] for e in epochs] == ["1", "2"], res.stdout  # rank 0 logs, once per epoch
    assert all(e[6] == "2" for e in epochs)
    train_ppl = [float(e[3]) for e in epochs]
    valid_ppl = [float(e[4]) for e in epochs]
    assert 1.0 < valid_ppl[-1] < vocab  # it learned: better than uniform
    assert train_ppl[1] < train_ppl[0]
    assert "Test perplexity:" in res.stdout
    with open(model_dir / "results.json") as f:
        results = json.load(f)
    assert results["world_size"] == 2
    assert [round(e["valid_perplexity"], 2) for e in results["epochs"]] == valid_ppl
    assert results["test_perplexity"] > 1.0
    assert os.path.exists(model_dir / "config.json") and os.path.exists(model_dir / "vocab.txt")
    assert len(os.listdir(model_dir / "checkpoints")) >= 1

    # A second run resumes from the checkpoint on ONE worker and does not download.
    res2 = run([sys.executable, SINGLE, "--config", cfg, "--data_path", str(data), "--model_dir",
                str(model_dir), "--num_epochs", "3", "--data_url", f"{server.url}/simple-examples.tgz",
                "--no_verify_data"],
               timeout=300)
    assert res2.returncode == 0, res2.stderr[-4000:]
    assert server.requests == ["/simple-examples.tgz"]
    assert "resumed from" in res2.stdout and "on 1 worker(s)" in res2.stdout
    assert [m.group(1) for m in EPOCH_LINE.finditer(res2.stdout)] == ["3"]

    # lmkit evaluate on the run's PTB test split: the perplexity the run reported at its end, and per
    # word the same (PTB's words are the ids, each line's end the word <eos>).
    res3 = run([sys.executable, "-m", "lmkit", "evaluate", "--model_dir", str(model_dir), "--split", "test",
                "--data_path", str(data), "--json"], timeout=200)
    assert res3.returncode == 0, res3.stdout[-2000:] + res3.stderr[-4000:]
    report = json.loads(res3.stdout)
    with open(model_dir / "results.json") as f:
        assert report["perplexity"] == pytest.approx(json.load(f)["test_perplexity"], rel=1e-4)
    with open(data / "simple-examples" / "data" / "ptb.test.txt") as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    assert report["tokens"] == report["words"] == sum(len(line.split()) + 1 for line in lines)
    assert report["word_perplexity"] == pytest.approx(report["perplexity"], rel=1e-9)
