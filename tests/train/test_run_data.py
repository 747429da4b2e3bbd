"""A run's data on every rank (lmkit.train.run_data), here on one process: PTB, text with and without the data
cache, pairs with one tokenizer or two. The same calls on two ranks, with hosts that lack the cache or the text,
are in tests/distributed/mpi/test_collectives.py."""
import os

import numpy as np
import pytest

from lmkit import distributed as dist
from lmkit.config import load_config
from lmkit.core.errors import UsageError
from lmkit.data.text import load_text_data
from lmkit.train.run_data import load_ptb_everywhere, load_run_data

TEXT = "the cat sat on the mat\nthe dog ran\n\na cat ran on\n" * 5


@pytest.fixture(autouse=True)
def local():
    dist.init(backend="local")


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("cache", ["cache", "none"])
def test_text_is_encoded_once_into_the_cache_and_equals_the_in_memory_ids(tmp_path, cache):
    train, valid = _write(tmp_path / "train.txt", TEXT), _write(tmp_path / "valid.txt", TEXT[:40])
    config = load_config("config_tiny_transformer", {
        "data": "text", "train_file": train, "valid_file": valid, "tokenizer": "word", "vocab_size": 999,
        "data_cache": str(tmp_path / "cache") if cache == "cache" else "none"})
    lines = []
    data = load_run_data(config, str(tmp_path / "model"), log=lines.append)
    want = load_text_data(data.vocab, train, valid)
    np.testing.assert_array_equal(data.train, want.train)
    np.testing.assert_array_equal(data.valid, want.valid)
    assert data.test is None and data.words == {}  # word-level: a token is a word
    assert os.path.isfile(tmp_path / "model" / "tokenizer.json")
    assert data.config.model.get("vocab_size") == data.vocab.vocab_size != 999
    assert lines[-1] == (f"tokenizer: word, {data.vocab.vocab_size} ids, in {tmp_path / 'model'} (the model's "
                         "vocabulary; the config said vocab_size = 999)")
    if cache == "cache":
        again = []
        load_run_data(config, str(tmp_path / "model"), log=again.append)
        assert not any(line.startswith("encoding ") for line in again), again  # found in the cache


def test_bad_text_is_one_usage_error_before_anything_is_written(tmp_path):
    train = _write(tmp_path / "train.txt", TEXT)
    bad = tmp_path / "valid.txt"
    bad.write_bytes(b"caf\xe9\n")
    config = load_config("config_tiny_transformer", {"data": "text", "train_file": train, "valid_file": str(bad),
                                                     "tokenizer": "char", "data_cache": "none"})
    with pytest.raises(UsageError, match="valid_file"):
        load_run_data(config, str(tmp_path / "model"))
    assert not os.path.exists(tmp_path / "model")


@pytest.mark.parametrize("share_vocab", [True, False])
def test_pairs_get_one_tokenizer_or_one_for_each_side(tmp_path, share_vocab):
    source = _write(tmp_path / "src.txt", "a b c\nd e\nf\n" * 4)
    target = _write(tmp_path / "tgt.txt", "x y\nz\nx z y\n" * 4)
    config = load_config("config_seq2seq", {"data": "pairs", "source_file": source, "target_file": target,
                                            "tokenizer": "char", "share_vocab": share_vocab, "data_cache": "none",
                                            "share_embeddings": share_vocab})
    lines = []
    data = load_run_data(config, str(tmp_path / "model"), log=lines.append)
    assert len(data.train) == 12
    source_folder = tmp_path / "model" / "source_tokenizer"
    assert os.path.isdir(source_folder) != share_vocab
    if share_vocab:
        assert data.source_vocab.fingerprint() == data.vocab.fingerprint()
    else:
        assert data.source_vocab.vocab_size != data.vocab.vocab_size
    assert data.config.model.get("vocab_size") == data.vocab.vocab_size
    assert data.config.model.get("source_vocab_size") == data.source_vocab.vocab_size
    assert lines[0].startswith("train pairs: ")


def test_ptb_is_read_from_its_folder_and_its_vocabulary_must_match(tmp_path):
    folder = tmp_path / "ptb"
    folder.mkdir()
    for split in ("train", "valid", "test"):
        _write(folder / f"ptb.{split}.txt", " the cat sat \n the dog ran \n")
    config = load_config("config_small", {"vocab_size": 7})  # 5 words, <unk> and <eos>
    data = load_run_data(config, str(tmp_path / "model"), data_path=str(folder), verify=False)
    assert len(data.vocab) == 7 and data.train.size == 8 and data.words == {}
    with pytest.raises(UsageError, match="the data has 7 words but the config says vocab_size = 8; set vocab_size = 7"):
        load_run_data(config.replace(vocab_size=8), str(tmp_path / "model"), data_path=str(folder), verify=False)
    # The PTB example reads the files itself: the same check, not an id past the embedding table mid-step.
    assert len(load_ptb_everywhere(str(folder), expected_vocab_size=7, verify=False).vocab) == 7
    with pytest.raises(UsageError, match="the data has 7 words but the config says vocab_size = 10000"):
        load_ptb_everywhere(str(folder), expected_vocab_size=10000, verify=False)
