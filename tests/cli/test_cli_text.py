"""Your own text, end to end: ``lmkit train`` on 2 workers, then ``lmkit generate``.

Every run is a subprocess with a hard timeout. The corpus is generated
(tests must not depend on ../shared); the built-in ``config_transformer`` is
shrunk with ``--set`` so that a few steps take seconds.
"""
import concurrent.futures
import json
import os
import re
import subprocess
import sys
from typing import List, Sequence, Tuple

import pytest

from tests.helpers import mpirun_cmd, run, subprocess_env

pytestmark = [pytest.mark.horovod, pytest.mark.mpi]

SMALL = ["--set", "hidden_size=32", "--set", "ffn_dim=64", "--set", "num_layers=1", "--set", "num_heads=2",
         "--set", "batch_size=8", "--set", "num_steps=16", "--set", "max_positions=64",
         "--set", "learning_rate=0.005", "--set", "warmup_epochs=0.0"]
PROMPT = "the old cat"

USER_MODEL = '''
"""A user's own model: lmkit modules composed outside lmkit (a GRU, stateful)."""
from lmkit import layers as modules
from lmkit.models import LanguageModel


class TinyLM(LanguageModel):
    stateful = True

    def __init__(self, *, vocab_size, hidden_size, dropout=0.0):
        super().__init__(name="tiny_lm")
        self.vocab_size = vocab_size
        with self.name_scope:
            self.embedder = modules.WordEmbedder(vocab_size=vocab_size, dim=hidden_size)
            self.decoder = modules.RNNDecoder(input_size=hidden_size, hidden_size=hidden_size,
                                              num_layers=1, cell="gru", dropout=dropout)
            self.projection = modules.OutputProjection(dim=hidden_size, vocab_size=vocab_size)

    def initial_state(self, batch_size, max_length=None):
        return self.decoder.initial_state(batch_size)

    def __call__(self, ids, state=None, training=False):
        outputs, state = self.decoder(self.embedder(ids), state, training)
        return self.projection(outputs), state

    def step(self, ids, state):
        outputs, state = self.decoder.step(self.embedder(ids), state)
        return self.projection(outputs), state
'''


def write_corpus(folder: str, lines: int = 400, seed: int = 0) -> dict:
    """English-like sentences (a few accented words, so bytes and chars are not all ASCII)."""
    import random
    rng = random.Random(seed)
    subjects = ["the old cat", "a young dog", "my friend", "the café owner", "our teacher", "the bird"]
    verbs = ["sees", "likes", "finds", "paints", "follows", "greets"]
    objects = ["the red house", "a small boat", "the garden", "her naïve neighbour", "the river"]
    os.makedirs(folder, exist_ok=True)
    files = {}
    for name, count in (("train", lines), ("valid", lines // 8), ("test", lines // 8)):
        text = "\n".join(f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} ."
                         for _ in range(count))
        files[name] = os.path.join(folder, f"{name}.txt")
        with open(files[name], "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return files


def alphabet(files: dict) -> set:
    with open(files["train"], encoding="utf-8") as f:
        return set(f.read()) - {"\n"}


def run_pair(cmds: Sequence[Sequence[str]], env=None, timeout: float = 300) -> list:
    """Two commands side by side (each spends seconds importing TensorFlow)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda cmd: run(cmd, timeout=timeout, env=env), cmds))


def train_cmd(files: dict, model_dir: str, *flags: str, launcher: Sequence[str] = ()) -> List[str]:
    launcher = list(launcher) or mpirun_cmd(2, ["-m", "lmkit"])
    plan = [] if {"--max_steps", "--max_tokens"} & set(flags) else ["--num_epochs", "1"]  # one plan flag
    return [*launcher, "train", "--config", "config_transformer", "--train_file", files["train"],
            "--valid_file", files["valid"], "--test_file", files["test"], "--model_dir", model_dir,
            *plan, *SMALL, *flags]


def generate_cmd(model_dir: str, *flags: str) -> List[str]:
    return [sys.executable, "-m", "lmkit", "generate", "--model_dir", model_dir, "--prompt", PROMPT,
            "--max_length", "40", "--seed", "0", "--num_samples", "2", "--strategy", "top_k",
            "--top_k", "5", *flags]


def check_trained(res, model_dir: str, tokenizer: str) -> dict:
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    with open(os.path.join(model_dir, "results.json"), encoding="utf-8") as f:
        results = json.load(f)
    assert results["world_size"] == 2
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        assert json.load(f)["name"] == tokenizer
    assert results["checkpoint"] and os.path.isdir(results["checkpoint"])
    assert "tokens/sec (2 worker(s))" in res.stdout
    return results


def samples_of(stdout: str) -> List[Tuple[int, int, str]]:
    """``[(prompt, sample, text)]`` of lmkit generate's output (samples may span lines)."""
    parts = re.split(r"(?m)^\[(\d+)\.(\d+)\] ", stdout)
    assert parts[0] == "", stdout[:500]
    return [(int(parts[k]), int(parts[k + 1]), parts[k + 2].rstrip("\n")) for k in range(1, len(parts), 3)]


def check_generated(res, chars: set, count: int = 2) -> List[str]:
    """``count`` samples, each the prompt, then readable text: no pieces' marks, only the corpus' letters."""
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    samples = samples_of(res.stdout)
    assert [(i, j) for i, j, _ in samples] == [(0, n) for n in range(count)], res.stdout
    texts = []
    for _, _, text in samples:
        assert text.startswith(PROMPT), text
        assert "\u2581" not in text and "<unk>" not in text, text  # sentencepiece's space mark
        assert set(text) <= chars | {" ", "\n", "\ufffd"}, set(text) - chars
        texts.append(text)
    return texts


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    return write_corpus(str(tmp_path_factory.mktemp("corpus")))


@pytest.fixture(scope="module")
def spm_dir(tmp_path_factory, corpus) -> str:
    """sentencepiece on 2 workers, stopped by --max_steps inside the first epoch."""
    model_dir = str(tmp_path_factory.mktemp("spm") / "model")
    res = run(train_cmd(corpus, model_dir, "--tokenizer", "sentencepiece", "--vocab_size", "50",
                        "--max_steps", "6"), timeout=400)
    results = check_trained(res, model_dir, "sentencepiece")
    assert results["global_step"] == 6
    # The stop fell inside the epoch, and that state is the checkpoint generation reads.
    epoch = results["epochs"][-1]
    assert epoch["steps"] == 6
    with open(os.path.join(results["checkpoint"], "meta.json"), encoding="utf-8") as f:
        meta = json.load(f)
    assert (meta["step"], meta["stopped_by"], meta["epoch"]) == (6, "max_steps", 0)
    # Subword perplexity is also reported per word, and the model folder holds the tokenizer.
    assert epoch["valid_word_perplexity"] > epoch["valid_perplexity"] > 1
    assert results["test_word_perplexity"] > results["test_perplexity"] > 1
    assert {"spm.model", "tokenizer.json"} <= set(os.listdir(model_dir))
    assert sorted(os.listdir(os.path.dirname(corpus["train"]))) == ["test.txt", "train.txt", "valid.txt"]
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert "keep_prob" not in json.dumps(config) and "model_params" not in config  # by section, 0.3's spelling
    data, model = config["data"], config["model"]
    assert (data["kind"], data["tokenizer"]) == ("text", "sentencepiece")
    assert (model["vocab_size"], model["dropout"]) == (50, 0.1)
    return model_dir


def test_sentencepiece_stopped_inside_an_epoch_then_generate(spm_dir, corpus):
    first, second = run_pair([generate_cmd(spm_dir), generate_cmd(spm_dir)])
    check_generated(first, alphabet(corpus))
    assert second.stdout == first.stdout  # the same seed gives the same text


def test_evaluate_reads_the_text_through_the_data_cache(spm_dir, corpus, tmp_path):
    # lmkit evaluate: a file encoded once into the cache and mapped after; the same figures as in memory
    # and as the test evaluation at the end of training (the same checkpoint and split).
    cache = str(tmp_path / "cache")
    evaluate = [sys.executable, "-m", "lmkit", "evaluate", "--model_dir", spm_dir, "--json"]
    first, in_memory = run_pair([evaluate + ["--text_file", corpus["test"], "--data_cache", cache],
                                 evaluate + ["--split", "test", "--data_cache", "none"]], timeout=200)
    second, missing = run_pair([evaluate + ["--text_file", corpus["test"], "--data_cache", cache],
                                evaluate + ["--text_file", str(tmp_path / "missing.txt")]], timeout=200)
    assert missing.returncode == 2 and re.search(r"(?m)^error: --text_file '.*missing.txt' does not exist",
                                                 missing.stderr), missing.stderr[-2000:]
    for res in (first, in_memory, second):
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    reports = [json.loads(res.stdout) for res in (first, in_memory, second)]
    assert "encoding" in first.stderr and "encoding" not in second.stderr + in_memory.stderr
    assert len(os.listdir(cache)) == 1
    for report in reports[1:]:
        for key in ("tokens", "words", "perplexity", "word_perplexity"):
            assert report[key] == pytest.approx(reports[0][key], rel=1e-6), key
    with open(corpus["test"], encoding="utf-8") as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    assert reports[0]["words"] == sum(len(line.split()) + 1 for line in lines)  # each line's end too
    assert reports[0]["word_perplexity"] > reports[0]["perplexity"] > 1
    with open(os.path.join(spm_dir, "results.json"), encoding="utf-8") as f:
        assert reports[0]["perplexity"] == pytest.approx(json.load(f)["test_perplexity"], rel=1e-4)


def test_char_and_byte_tokenizers_on_two_workers(tmp_path, corpus):
    lmkit = os.path.join(os.path.dirname(sys.executable), "lmkit")  # the installed command
    dirs = {name: str(tmp_path / name) for name in ("char", "byte")}
    for name, model_dir in dirs.items():
        res = run(train_cmd(corpus, model_dir, "--tokenizer", name, "--max_steps", "40",
                            launcher=mpirun_cmd(2, [])[:-1] + [lmkit]), timeout=400)
        results = check_trained(res, model_dir, name)
        assert results["config"]["model"]["vocab_size"] == (4 + 256 if name == "byte" else
                                                             4 + len(alphabet(corpus)))
    for res in run_pair([generate_cmd(dirs["char"]), generate_cmd(dirs["byte"])]):
        check_generated(res, alphabet(corpus))
    # Past the context (64 positions) and over several lines: 300 characters, prompt included.
    long_char, one_line = run_pair([generate_cmd(dirs["char"], "--max_length", "300"),
                                    generate_cmd(dirs["char"], "--max_length", "300", "--stop_at_eos")])
    texts = check_generated(long_char, alphabet(corpus))
    assert all(280 <= len(t) <= 300 and t.count("\n") >= 2 for t in texts), texts  # bos/pad ids print nothing
    assert all("\n" not in t and len(t) < 300 for t in check_generated(one_line, alphabet(corpus)))
    # Into a reader that has left (`| head`): quiet, with the SIGPIPE status, streamed or not.
    # The reading end is closed before the command writes, so every write of it fails.
    for flags in (["--stream"], ["--no_stream"]):
        proc = subprocess.Popen(generate_cmd(dirs["char"], "--num_samples", "1", *flags),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env())
        proc.stdout.close()
        try:
            _, err = proc.communicate(timeout=200)
        finally:
            proc.kill()
        assert proc.returncode == 141 and b"Traceback" not in err and b"Error" not in err, (flags, err[-2000:])


def test_user_model_by_import_path(tmp_path, corpus):
    code = tmp_path / "code"
    code.mkdir()
    (code / "user_lm.py").write_text(USER_MODEL)
    env = subprocess_env({"PYTHONPATH": f"{code}{os.pathsep}{subprocess_env()['PYTHONPATH']}"})
    model_dir = str(tmp_path / "model")
    res = run(train_cmd(corpus, model_dir, "--model", "user_lm:TinyLM", "--tokenizer", "word",
                        "--max_steps", "4", launcher=mpirun_cmd(2, ["-m", "lmkit"])),
              timeout=400, env=env)
    results = check_trained(res, model_dir, "word")
    assert results["config"]["model"]["name"] == "user_lm:TinyLM"
    assert "training TinyLM on 2 worker(s)" in res.stdout
    # generate rebuilds the class from config.json alone (no training script).
    check_generated(run(generate_cmd(model_dir), timeout=200, env=env), alphabet(corpus))


def test_two_workers_encode_once_into_the_cache_and_a_resumed_run_reads_it(tmp_path, corpus):
    """Several files as one corpus; rank 0 encodes while rank 1 waits; the resumed run only maps the cache."""
    shards = tmp_path / "shards"
    shards.mkdir()
    with open(corpus["train"], encoding="utf-8") as f:
        lines = f.readlines()
    for k in range(2):
        (shards / f"part{k}.txt").write_text("".join(lines[k::2]), encoding="utf-8")
    cache, model_dir = str(tmp_path / "cache"), str(tmp_path / "model")
    files = dict(corpus, train=str(shards))
    flags = ["--tokenizer", "char", "--data_cache", cache, "--sampling", "random"]
    first = run(train_cmd(files, model_dir, *flags, "--max_steps", "3"), timeout=400)
    check_trained(first, model_dir, "char")
    assert first.stdout.count("rank 0 encodes train_file; the other 1 rank(s) wait for it") == 1, first.stdout
    assert first.stdout.count("encoding train_file (2 files") == 1
    folders = [n for n in os.listdir(cache) if n.startswith("char-")]
    assert len(folders) == 3  # train, valid, test
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert config["data"]["train_file"] == str(shards) and config["data"]["sampling"] == "random"
    second = run(train_cmd(files, model_dir, *flags, "--max_steps", "6"), timeout=400)
    results = check_trained(second, model_dir, "char")
    assert "resumed from" in second.stdout and results["global_step"] == 6
    assert "encoding " not in second.stdout and "rank 0 encodes" not in second.stdout, second.stdout
    assert re.search(r"text: train \d+ tokens, valid \d+, test \d+ \(char ids, from the data cache ", second.stdout)
    assert sorted(n for n in os.listdir(cache) if n.startswith("char-")) == sorted(folders)  # none new


def test_prepare_encodes_ahead_and_train_then_only_reads_the_cache(tmp_path, corpus):
    cache, model_dir = str(tmp_path / "cache"), str(tmp_path / "model")
    flags = ["--config", "config_transformer", "--train_file", corpus["train"], "--valid_file", corpus["valid"],
             "--tokenizer", "sentencepiece", "--vocab_size", "50", "--data_cache", cache]
    lmkit = [sys.executable, "-m", "lmkit"]
    prepared = run([*lmkit, "prepare", *flags], timeout=300)
    assert prepared.returncode == 0, prepared.stdout[-2000:] + prepared.stderr[-3000:]
    assert "encoding train_file" in prepared.stdout and "encoding valid_file" in prepared.stdout
    assert re.search(r"prepared in [\d.]+ s: sentencepiece tokenizer of 50 ids and the token files in ",
                     prepared.stdout), prepared.stdout
    assert "lmkit-prepare-" not in prepared.stdout  # the temporary folder is not named
    assert sorted(n.split("-")[0] for n in os.listdir(cache)) == ["sentencepiece", "sentencepiece", "tokenizer"]
    trained = run([*lmkit, "train", *flags, *SMALL, "--model_dir", model_dir, "--max_steps", "2"], timeout=300)
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-3000:]
    assert "encoding " not in trained.stdout and "from the data cache" in trained.stdout, trained.stdout
    assert len(os.listdir(cache)) == 3
    bad = run([*lmkit, "prepare", "--config", "config_transformer", "--data_cache", cache], timeout=120)
    assert bad.returncode == 2 and "lmkit prepare encodes your own text; pass --train_file" in bad.stderr


def test_a_run_in_tokens_stops_at_the_same_step_on_one_and_two_workers(tmp_path, corpus):
    # 8 rows x 16 steps = 128 tokens a global step: 1000 tokens are ceil(1000 / 128) = 8 steps, on any number of
    # workers (the global batch is split among them). A warmup longer than the plan warms up over all of it,
    # and one line (rank 0's) says so.
    dirs = [str(tmp_path / "one"), str(tmp_path / "two")]
    flags = ("--tokenizer", "char", "--max_tokens", "1000", "--eval_every_steps", "4", "--eval_steps", "1",
             "--warmup_steps", "20")
    runs = run_pair([train_cmd(corpus, dirs[0], *flags, launcher=[sys.executable, "-m", "lmkit"]),
                     train_cmd(corpus, dirs[1], *flags)], timeout=400)
    for res, model_dir, workers in zip(runs, dirs, (1, 2)):
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
        with open(os.path.join(model_dir, "results.json"), encoding="utf-8") as f:
            results = json.load(f)
        assert (results["world_size"], results["global_step"]) == (workers, 8)
        assert [v["step"] for v in results["validations"]] == [4, 8]
        assert "8 steps (1,024 tokens;" in res.stdout and "step 8/8 | loss " in res.stdout, res.stdout[-3000:]
        assert "step 4/8 | val loss " in res.stdout
        assert res.stdout.count("note: warmup_steps 20 >= the plan's 8 steps: warming up over the whole run") == 1


def test_train_on_jsonl_and_parquet_records_in_one_process(tmp_path, corpus):
    """--train_file x.jsonl (its text under --text_field) and --valid_file v.parquet: one document a record."""
    import pyarrow as pa  # the test extra installs it (lmkit[data])
    import pyarrow.parquet as pq
    texts = {}
    for name in ("train", "valid"):
        with open(corpus[name], encoding="utf-8") as f:
            texts[name] = f.read().splitlines()
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"id": k, "body": line}) + "\n" for k, line in enumerate(texts["train"])),
                     encoding="utf-8")
    valid = str(tmp_path / "valid.parquet")
    pq.write_table(pa.table({"text": texts["valid"]}), valid)
    model_dir = str(tmp_path / "model")
    res = run([sys.executable, "-m", "lmkit", "train", "--config", "config_transformer", "--train_file", str(train),
               "--valid_file", valid, "--text_field", "body", "--tokenizer", "char", "--model_dir", model_dir,
               "--data_cache", str(tmp_path / "cache"), "--max_steps", "2", *SMALL], timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    assert "encoding train_file (" in res.stdout and "train.jsonl" in res.stdout, res.stdout[-3000:]
    with open(os.path.join(model_dir, "results.json"), encoding="utf-8") as f:
        results = json.load(f)
    assert results["global_step"] == 2 and results["epochs"][-1]["valid_perplexity"] > 1
    assert results["config"]["model"]["vocab_size"] == 4 + len(alphabet(corpus))  # the records' characters
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    data = config["data"]
    assert (data["train_file"], data["text_field"], data["text_column"]) == (str(train), "body", "text")
    # lmkit evaluate reads the run's splits as the run did (the field from its config).
    evaluate = [sys.executable, "-m", "lmkit", "evaluate", "--model_dir", model_dir, "--json", "--data_cache", "none"]
    on_valid, on_train = run_pair([evaluate + ["--split", "valid"], evaluate + ["--split", "train"]], timeout=200)
    for res in (on_valid, on_train):
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    valid, trained = json.loads(on_valid.stdout), json.loads(on_train.stdout)
    assert valid["perplexity"] == pytest.approx(results["epochs"][-1]["valid_perplexity"], rel=1e-4)
    assert trained["words"] == sum(len(line.split()) + 1 for line in texts["train"] if line.strip())
