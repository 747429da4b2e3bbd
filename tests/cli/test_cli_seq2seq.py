"""Source/target pairs end to end: ``lmkit train`` of an encoder-decoder on 2 workers, then ``lmkit generate
--source_file`` and ``lmkit evaluate --source_file --target_file`` (perplexity, BLEU, exact match), and the
errors of bad pairs and of flags that do not fit the model.

Every run is a subprocess with a hard timeout; the data is a generated reversal task
(:mod:`lmkit.data.synthetic`), the built-in ``config_seq2seq`` shrunk with ``--set``.
"""
import concurrent.futures
import json
import os
import re
import sys

import pytest

from lmkit.data.synthetic import write_task
from tests.helpers import mpirun_cmd, run

SMALL = ["--set", "hidden_size=32", "--set", "ffn_dim=64", "--set", "num_layers=1", "--set", "num_heads=2",
         "--set", "batch_size=32", "--set", "warmup_epochs=0.0", "--set", "max_positions=16",
         "--set", "max_source_positions=16"]


def lmkit(*args):
    return [sys.executable, "-m", "lmkit", *args]


def lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return write_task(str(tmp_path_factory.mktemp("reverse")), "reverse", train=960, valid=40, test=40, symbols=8,
                      min_length=2, max_length=6)


def pair_flags(task, *splits):
    flags = []
    for split in splits:
        prefix = "" if split == "train" else f"{split}_"
        flags += [f"--{prefix}source_file", task[f"{split}_src"], f"--{prefix}target_file", task[f"{split}_tgt"]]
    return flags


@pytest.fixture(scope="module")
def trained(tmp_path_factory, task):
    """config_seq2seq (shrunk) on 2 Horovod workers, 2 epochs."""
    model_dir = str(tmp_path_factory.mktemp("seq2seq") / "run")
    res = run(mpirun_cmd(2, ["-m", "lmkit", "train", "--config", "config_seq2seq", "--model_dir", model_dir,
                             "--num_epochs", "2", *pair_flags(task, "train", "valid", "test"), *SMALL]),
              timeout=400)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    return model_dir, res


@pytest.mark.horovod
@pytest.mark.mpi
def test_two_workers_train_an_encoder_decoder_from_the_command_line(trained, task):
    model_dir, res = trained
    with open(os.path.join(model_dir, "results.json"), encoding="utf-8") as f:
        results = json.load(f)
    assert results["world_size"] == 2 and results["global_step"] == 2 * 960 // 32
    config = results["config"]
    assert config["data"]["kind"] == "pairs" and config["model"]["source_vocab_size"] == 12  # 8 + 4 specials
    assert results["test_perplexity"] < results["epochs"][0]["valid_perplexity"] < 12
    out = res.stdout
    assert "train pairs: kept 960 pairs" in out and "valid pairs: kept 40 pairs" in out
    # Rank 0 encodes the pairs line by line into the data cache while rank 1 waits; both map it.
    assert out.count("rank 0 encodes source_file; the other 1 rank(s) wait for it") == 1, out
    assert "pairs: train 960, valid 40, test 40 (from the data cache" in out
    assert "training TransformerSeq2Seq on 2 worker(s): global batch 32 (16 per worker) pairs" in out
    assert "tokenizer: word, 12 ids" in out and "one tokenizer for both sides" in out
    assert out.count("training TransformerSeq2Seq") == 1  # rank 0 alone logs


@pytest.mark.horovod
@pytest.mark.mpi
def test_generate_writes_one_line_per_source_and_evaluate_scores_them(trained, task, tmp_path):
    model_dir, _ = trained
    output = str(tmp_path / "out.txt")
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:  # each spends seconds starting up
        generated, prompts, evaluated, valid = pool.map(lambda cmd: run(cmd, timeout=300), (
            lmkit("generate", "--model_dir", model_dir, "--source_file", task["test_src"], "--batch_size", "7"),
            lmkit("generate", "--model_dir", model_dir, "--prompt", "s1 s2 s3", "--prompt", "s4 s4",
                  "--strategy", "beam", "--beam_width", "3", "--num_samples", "2"),
            lmkit("evaluate", "--model_dir", model_dir, "--source_file", task["test_src"], "--target_file",
                  task["test_tgt"], "--json", "--output", output),
            lmkit("evaluate", "--model_dir", model_dir, "--split", "valid", "--strategy", "beam")))
    for res in (generated, prompts, evaluated, valid):
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    outputs = generated.stdout.splitlines()
    assert len(outputs) == 40
    # --num_samples 2 with beam search: each source's 2 best hypotheses (fewer if it finished fewer), tagged.
    tagged = [re.fullmatch(r"\[(\d)\.(\d)\] ?(.*)", line) for line in prompts.stdout.splitlines()]
    assert all(tagged), prompts.stdout
    assert [m.group(1) for m in tagged if m.group(2) == "0"] == ["0", "1"] and 2 <= len(tagged) <= 4, prompts.stdout
    symbols = {f"s{n}" for n in range(8)}
    assert all(set(line.split()) <= symbols for line in outputs + [m.group(3) for m in tagged]), outputs
    report = json.loads(evaluated.stdout)
    # evaluate decodes greedily, as generate does: the same outputs, scored against the references.
    assert lines(output) == outputs
    references = lines(task["test_tgt"])
    assert report["exact_match"] == pytest.approx(sum(o == r for o, r in zip(outputs, references)) / 40)
    import sacrebleu
    assert report["bleu"] == pytest.approx(sacrebleu.corpus_bleu(outputs, [references]).score)
    with open(os.path.join(model_dir, "results.json"), encoding="utf-8") as f:
        assert report["perplexity"] == pytest.approx(json.load(f)["test_perplexity"], rel=1e-4)
    assert report["pairs"] == report["scored_pairs"] == 40 and report["strategy"] == "greedy"
    assert re.fullmatch(r"\S+valid.tgt: perplexity [\d.]+ per token \(\d+ target tokens\), BLEU [\d.]+, exact match "
                        r"[\d.]+% of 40 \(beam\)\n", valid.stdout), valid.stdout


@pytest.mark.horovod
@pytest.mark.mpi
def test_flags_that_do_not_fit_an_encoder_decoder_are_named(trained, task):
    model_dir, _ = trained
    cases = [
        (lmkit("generate", "--model_dir", model_dir, "--stop", "x", "--prompt", "s1"),
         "--stop applies to language models; .* holds an encoder-decoder"),
        (lmkit("generate", "--model_dir", model_dir),
         "holds an encoder-decoder: give --source_file .* or --prompt TEXT"),
        (lmkit("generate", "--model_dir", model_dir, "--prompt", "s1", "--num_samples", "2"),
         "--num_samples 2: greedy decoding writes one output per source; use --strategy"),
        (lmkit("generate", "--model_dir", model_dir, "--prompt", "s1", "--max_new_tokens", "40"),
         "--max_new_tokens 40 exceeds what the decoder holds: 15"),
        (lmkit("evaluate", "--model_dir", model_dir, "--source_file", task["test_src"]),
         "give both --source_file and --target_file"),
        (lmkit("evaluate", "--model_dir", model_dir, "--data_cache", "none"),
         "--data_cache is for language models; .* holds an encoder-decoder"),
    ]
    for cmd, message in cases:
        res = run(cmd, timeout=120)
        assert res.returncode == 2, (cmd, res.stdout, res.stderr[-2000:])
        errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, res.stderr
        assert re.search(message, errors[0]), errors[0]


def test_bad_pairs_fail_before_anything_is_written(task, tmp_path):
    short = tmp_path / "short.tgt"
    short.write_text("s1\ns2\n", encoding="utf-8")
    model_dir = str(tmp_path / "never")
    cases = [
        (["--source_file", task["train_src"], "--target_file", str(short)],
         r"error: source_file \S+train.src has 960 lines but target_file \S+short.tgt has 2; the files must be "
         "line-aligned"),
        (["--source_file", task["train_src"]], "target_file = '' is empty but data = 'pairs' needs both sides"),
        (["--config", "config_small", "--source_file", task["train_src"], "--target_file", task["train_tgt"]],
         "model 'lstm' is a language model, but data = 'pairs' is for encoder-decoders"),
        (["--source_file", task["train_src"], "--target_file", task["train_tgt"], "--set", "max_target_length=99"],
         "max_target_length = 99 exceeds what the model holds: max_positions - 1"),
        (["--config", "config_seq2seq", "--train_file", task["train_src"]],
         "model 'transformer_seq2seq' is an encoder-decoder: it trains on source/target pairs"),
    ]
    for flags, message in cases:
        res = run(lmkit("train", "--model_dir", model_dir, "--backend", "local", *flags), timeout=120)
        assert res.returncode == 2, (flags, res.stdout, res.stderr[-2000:])
        errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and re.search(message, errors[0]), res.stderr[-2000:]
        assert not os.path.exists(model_dir), flags


def test_prepare_encodes_the_pairs_ahead_and_train_only_maps_them(task, tmp_path):
    cache, model_dir = str(tmp_path / "cache"), str(tmp_path / "model")
    flags = ["--config", "config_seq2seq", *pair_flags(task, "train", "valid"), "--data_cache", cache,
             "--set", "share_vocab=False", "--set", "share_embeddings=False"]
    prepared = run(lmkit("prepare", *flags), timeout=300)
    assert prepared.returncode == 0, prepared.stdout[-2000:] + prepared.stderr[-3000:]
    for what in ("source_file", "target_file", "valid_source_file", "valid_target_file"):
        assert f"encoding {what} " in prepared.stdout, prepared.stdout
    assert "pairs: train 960, valid 40 (from the data cache" in prepared.stdout
    folders = os.listdir(cache)
    trained = run(lmkit("train", *flags, *SMALL, "--model_dir", model_dir, "--backend", "local", "--max_steps", "2"),
                  timeout=300)
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-3000:]
    assert "encoding " not in trained.stdout and "pairs: train 960, valid 40 (from the data cache" in trained.stdout
    assert sorted(os.listdir(cache)) == sorted(folders)  # nothing new encoded
    assert os.path.isdir(os.path.join(model_dir, "source_tokenizer"))


def test_evaluate_an_rnn_encoder_decoder_gives_its_runs_test_perplexity(task, tmp_path):
    # rnn_seq2seq has no position tables: evaluate takes its source limit from the run's config.
    model_dir = str(tmp_path / "rnn")
    res = run(lmkit("train", "--config", "config_seq2seq_rnn", "--model_dir", model_dir, "--max_steps", "3",
                    *pair_flags(task, "train", "test"), "--set", "hidden_size=16", "--set", "batch_size=32",
                    "--set", "max_positions=16", "--set", "max_source_positions=16"), timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    res = run(lmkit("evaluate", "--model_dir", model_dir, "--json"), timeout=300)  # the run's test split
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    report = json.loads(res.stdout)
    with open(os.path.join(model_dir, "results.json"), encoding="utf-8") as f:
        assert report["perplexity"] == pytest.approx(json.load(f)["test_perplexity"], rel=1e-4)
    assert report["pairs"] == report["scored_pairs"] == 40
