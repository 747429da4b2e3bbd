"""The per-rank pieces of a run's data (lmkit.data.pipeline): which files a config names, their checks, the
pairs' lines, the model's vocabulary. Plain functions of the config and the files: no ranks, no collectives."""
import os
import subprocess
import sys
import types

import pytest

from lmkit.config import load_config
from lmkit.core.errors import UsageError
from lmkit.data import pipeline
from lmkit.data.errors import DataError
from lmkit.data.tokenizers import train_tokenizer
from tests.helpers import ROOT, subprocess_env


def _text(tmp_path, name, text="the cat sat\non the mat\n"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_the_data_package_imports_nothing_of_distributed():
    code = ("import sys, lmkit.data.pipeline, lmkit.data.token_cache, lmkit.data.tokenizers\n"
            "print(sorted(m for m in sys.modules if m.startswith('lmkit.distributed')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(), capture_output=True,
                         text=True, timeout=300)
    assert (out.returncode, out.stdout.strip()) == (0, "[]"), out.stderr[-2000:]


def test_text_sources_and_their_checks(tmp_path):
    train, valid = _text(tmp_path, "train.txt"), _text(tmp_path, "valid.txt")
    config = load_config("config_tiny_transformer", {"data": "text", "train_file": train, "valid_file": valid})
    sources = pipeline.text_sources(config.data)
    assert {name: [str(f) for f in files] for name, files in sources.items()} == {"train": [train],
                                                                                  "valid": [valid]}
    pipeline.check_sources(sources, cached=False)
    (tmp_path / "train.txt").write_bytes(b"\xff\xfe not UTF-8\n")
    pipeline.check_sources(sources, cached=True)  # with a cache the training text is checked as it is encoded
    with pytest.raises(DataError, match="train_file"):
        pipeline.check_sources(sources, cached=False)
    missing = config.replace(valid_file=str(tmp_path / "nope.txt"))
    with pytest.raises(UsageError, match="nope.txt"):
        pipeline.text_sources(missing.data)


def test_pair_splits_read_their_lines_or_only_check_them_for_the_cache(tmp_path):
    source, target = _text(tmp_path, "src.txt", "a b\nc\n"), _text(tmp_path, "tgt.txt", "x\ny z\n")
    config = load_config("config_seq2seq", {"data": "pairs", "source_file": source, "target_file": target})
    splits = pipeline.pair_splits(config.data)
    assert splits == {"train": (source, target)}
    assert pipeline.read_pair_splits(splits, cached=False) == {"train": (["a b", "c"], ["x", "y z"])}
    assert pipeline.read_pair_splits(splits, cached=True) == {}
    _text(tmp_path, "tgt.txt", "x\n")
    for cached in (False, True):
        with pytest.raises(DataError, match="line"):
            pipeline.read_pair_splits(splits, cached=cached)


@pytest.mark.parametrize("asked, tokenizer, want, said", [
    (40, "char", None, " (the model's vocabulary; the config said vocab_size = 40)"),
    (None, "char", None, ""),
])
def test_a_model_trained_from_scratch_takes_its_tokenizers_vocabulary(tmp_path, asked, tokenizer, want, said):
    text = _text(tmp_path, "t.txt")
    tok = train_tokenizer(tokenizer, text, str(tmp_path / "tok"))
    config = load_config("config_tiny_transformer", {"data": "text", "train_file": text, "tokenizer": tokenizer,
                                                     "vocab_size": asked or tok.vocab_size})
    fitted, line = pipeline.run_vocabulary(config, tok)
    assert fitted.model.get("vocab_size") == tok.vocab_size and line == said


def test_a_pretrained_models_vocabulary_is_fixed_and_must_hold_the_tokenizer(tmp_path):
    tok = train_tokenizer("char", _text(tmp_path, "t.txt"), str(tmp_path / "tok"))

    def pretrained(vocab_size):  # the two settings it reads (a real one needs a Hugging Face folder)
        return types.SimpleNamespace(checkpoints=types.SimpleNamespace(init_from=str(tmp_path)),
                                     model={"vocab_size": vocab_size})

    with pytest.raises(UsageError, match=f"has ids up to {tok.vocab_size - 1} but the model's vocab_size is 5"):
        pipeline.run_vocabulary(pretrained(5), tok)
    roomy = pretrained(tok.vocab_size + 10)
    assert pipeline.run_vocabulary(roomy, tok) == (roomy, "")


def test_a_failed_download_leaves_no_empty_folder_and_names_what_is_missing(tmp_path, http_server):
    url = f"{http_server[0]}/missing.tgz"
    folder = str(tmp_path / "ptb")
    with pytest.raises(DataError, match=f"data folder {folder} does not exist, and downloading PTB failed"):
        pipeline.find_or_download_ptb(folder, url, None)
    assert not os.path.exists(folder)
    os.makedirs(folder)
    (tmp_path / "ptb" / "ptb.train.txt").write_text(" a b \n")
    with pytest.raises(DataError, match="lacks ptb.valid.txt, ptb.test.txt .it has ptb.train.txt."):
        pipeline.find_or_download_ptb(folder, url, None)
