"""The data cache: text encoded once (in parallel), reused, invalidated, memory-mapped; many files."""
import errno
import json
import os

import numpy as np
import pytest

from lmkit.data import encoding_pool, textfile, token_cache
from lmkit.data.errors import DataError
from lmkit.data.sources import resolve_sources
from lmkit.data.text import load_text_data
from lmkit.data.tokenizers import train_tokenizer

WORDS = "the a cat dog sat ran on under mat log and then quickly slowly big small red blue".split()


def _write_text(path, lines, seed):
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as f:
        for k in range(lines):
            if k % 9 == 4:
                f.write("\n")  # blank lines are skipped
            words = rng.choice(WORDS, size=rng.integers(1, 12))
            f.write(" ".join(words) + (" café\r\n" if k % 7 == 3 else "\n"))
    return str(path)


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    root = tmp_path_factory.mktemp("texts")
    os.makedirs(root / "shards" / "sub")
    files = {"a": _write_text(root / "shards" / "a.txt", 300, 0),
             "b": _write_text(root / "shards" / "b.txt", 200, 1),
             "c": _write_text(root / "shards" / "sub" / "c.txt", 100, 2),
             "valid": _write_text(root / "valid.txt", 80, 3)}
    (root / "shards" / ".hidden").write_text("not text\0")
    return root, files


@pytest.fixture(scope="module", params=["word", "char", "byte", "sentencepiece"])
def tokenizer(request, texts, tmp_path_factory):
    root, files = texts
    options = {"vocab_size": 40} if request.param == "sentencepiece" else {}
    return train_tokenizer(request.param, [files["a"], files["b"]],
                           tmp_path_factory.mktemp(request.param), **options)


def test_cached_ids_equal_the_in_memory_ids_and_a_second_load_reuses_them(texts, tokenizer, tmp_path):
    _, files = texts
    plain = load_text_data(tokenizer, files["a"], files["valid"])
    lines = []
    first = load_text_data(tokenizer, files["a"], files["valid"], cache_dir=str(tmp_path), log=lines.append)
    assert isinstance(first.train, np.memmap) and first.train.dtype == np.uint16
    np.testing.assert_array_equal(first.train, plain.train)
    np.testing.assert_array_equal(first.valid, plain.valid)
    assert (first.train_words, first.valid_words) == (plain.train_words, plain.valid_words)
    assert any(line.startswith("encoding train_file") for line in lines)
    lines.clear()
    again = load_text_data(tokenizer, files["a"], files["valid"], cache_dir=str(tmp_path), log=lines.append)
    assert lines == []  # nothing encoded
    np.testing.assert_array_equal(again.train, plain.train)
    folders = sorted(n for n in os.listdir(tmp_path))
    assert len(folders) == 2 and all(n.startswith(tokenizer.name + "-") for n in folders)
    manifest = json.load(open(tmp_path / folders[0] / "manifest.json"))
    assert manifest["tokenizer"]["fingerprint"] == tokenizer.fingerprint()
    assert {"path", "size", "mtime_ns", "sha256", "token_offset", "num_tokens"} <= set(manifest["files"][0])


def test_parallel_encoding_in_blocks_gives_the_same_ids_as_one_process(texts, tmp_path, monkeypatch):
    _, files = texts
    tokenizer = train_tokenizer("sentencepiece", files["a"], tmp_path / "spm", vocab_size=40)
    monkeypatch.setattr(encoding_pool, "BLOCK_BYTES", 512)  # many blocks, several per worker
    sources = [files["a"], files["b"], files["c"]]
    one = token_cache.encode_to_cache(str(tmp_path / "one"), tokenizer, sources, True, workers=1)
    lines = []
    two = token_cache.encode_to_cache(str(tmp_path / "two"), tokenizer, sources, True, workers=2,
                                      log=lines.append)
    assert "in 2 process(es)" in lines[0]
    plain = load_text_data(tokenizer, sources)
    np.testing.assert_array_equal(one.ids, plain.train)
    np.testing.assert_array_equal(two.ids, plain.train)
    assert one.words == two.words == plain.train_words and not two.reused
    offsets = [f["token_offset"] for f in json.load(open(os.path.join(two.folder, "manifest.json")))["files"]]
    assert offsets[0] == 0 and offsets == sorted(offsets) and len(set(offsets)) == 3


def test_a_changed_source_or_another_tokenizer_makes_a_new_cache(texts, tmp_path):
    root, files = texts
    path = str(tmp_path / "train.txt")
    with open(path, "w") as f:
        f.write(open(files["a"]).read())
    tok = train_tokenizer("word", path, tmp_path / "w")
    first = token_cache.cached_stream(str(tmp_path / "c"), tok, [path], True, what="train_file")
    with open(path, "a") as f:
        f.write("the cat sat on the mat\n")
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))
    second = token_cache.cached_stream(str(tmp_path / "c"), tok, [path], True, what="train_file")
    assert not second.reused and second.folder != first.folder
    assert second.ids.size == first.ids.size + 7
    char = train_tokenizer("char", path, tmp_path / "ch")
    third = token_cache.cached_stream(str(tmp_path / "c"), char, [path], True, what="train_file")
    assert third.folder not in (first.folder, second.folder)


def test_a_cache_from_another_tokenizer_or_a_cut_file_is_refused(texts, tmp_path):
    _, files = texts
    tok = train_tokenizer("word", files["a"], tmp_path / "w")
    stream = token_cache.cached_stream(str(tmp_path / "c"), tok, [files["a"]], True, what="train_file")
    manifest_path = os.path.join(stream.folder, "manifest.json")
    manifest = json.load(open(manifest_path))
    manifest["tokenizer"]["fingerprint"] = "0123456789abcdef"
    json.dump(manifest, open(manifest_path, "w"))
    with pytest.raises(DataError,
                       match="made by the word tokenizer with fingerprint 0123456789abcdef.*delete the folder"):
        token_cache.open_cached(str(tmp_path / "c"), tok, [files["a"]], True)
    stream = token_cache.cached_stream(str(tmp_path / "d"), tok, [files["a"]], True, what="train_file")
    with open(os.path.join(stream.folder, "ids.bin"), "r+b") as f:
        f.truncate(10)
    with pytest.raises(DataError, match="holds 10 bytes, but its manifest says"):
        token_cache.open_cached(str(tmp_path / "d"), tok, [files["a"]], True)


def _no_temporary_folders(root):
    return [n for n in os.listdir(root) if n.startswith(".tmp")] == []


def test_a_source_that_changes_while_encoded_leaves_nothing(texts, tmp_path, monkeypatch):
    _, files = texts
    tok = train_tokenizer("word", files["a"], tmp_path / "w")
    real = textfile.source_identity
    calls = []

    def growing(path):
        found = real(path)
        calls.append(path)
        if len(calls) > 2:  # after the key and the first look: the file grew
            found = dict(found, size=found["size"] + 5)
        return found

    monkeypatch.setattr(textfile, "source_identity", growing)
    root = tmp_path / "c"
    with pytest.raises(DataError, match="changed while it was being encoded.*run again once nothing writes"):
        token_cache.encode_to_cache(str(root), tok, [files["a"]], True)
    assert _no_temporary_folders(root) and os.listdir(root) == []


def test_a_full_disk_is_one_clear_error_and_leaves_nothing(texts, tmp_path, monkeypatch):
    _, files = texts
    tok = train_tokenizer("byte", files["a"], tmp_path / "b")

    def full(folder, *args):
        open(os.path.join(folder, "ids.bin"), "wb").write(b"12")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(token_cache, "_encode_files", full)
    root = tmp_path / "c"
    with pytest.raises(DataError, match="disk of the data cache .* is full.*--data_cache"):
        token_cache.encode_to_cache(str(root), tok, [files["a"]], True)
    assert os.listdir(root) == []


def test_bad_text_is_refused_before_a_cache_folder_exists(tmp_path):
    tok = train_tokenizer("byte", [], tmp_path / "b")
    binary = tmp_path / "x.bin"
    binary.write_bytes(b"hello\nwor\0ld\n")
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"ok\ncaf\xe9\n")
    for path, message in ((binary, "is a binary file"), (latin, "is not UTF-8: line 2")):
        with pytest.raises(DataError, match=message):
            token_cache.cached_stream(str(tmp_path / "c"), tok, [str(path)], True, what="train_file")
        with pytest.raises(DataError, match=message):  # the encoder's own check, without the pre-check
            token_cache.encode_to_cache(str(tmp_path / "c"), tok, [str(path)], True)
    assert not os.path.exists(tmp_path / "c") or os.listdir(tmp_path / "c") == []


def test_sources_folders_globs_and_lists_in_sorted_order(texts):
    root, files = texts
    expected = sorted([files["a"], files["b"], files["c"]])
    assert resolve_sources(str(root / "shards")) == expected  # recursive, hidden file left out
    assert resolve_sources(str(root / "shards" / "**" / "*.txt")) == expected
    assert resolve_sources(f"{files['b']},{files['a']}") == sorted([files["a"], files["b"]])
    assert resolve_sources([files["b"], files["a"], files["b"]]) == sorted([files["a"], files["b"]])
    with pytest.raises(DataError, match="pattern .*nothing.txt' matches no file"):
        resolve_sources(str(root / "*nothing.txt"))
    with pytest.raises(DataError, match="valid_file '.*missing.txt' does not exist"):
        resolve_sources(str(root / "missing.txt"), "valid_file")
    os.makedirs(root / "empty", exist_ok=True)
    with pytest.raises(DataError, match="is a folder without files"):
        resolve_sources(str(root / "empty"))


def test_several_files_are_one_stream_in_sorted_order(texts, tmp_path):
    root, files = texts
    tok = train_tokenizer("word", str(root / "shards"), tmp_path / "w")
    each = [load_text_data(tok, f).train for f in sorted([files["a"], files["b"], files["c"]])]
    for cache in (None, str(tmp_path / "c")):
        data = load_text_data(tok, str(root / "shards"), cache_dir=cache)
        np.testing.assert_array_equal(data.train, np.concatenate(each))
    assert tok.vocab_size == len(set(WORDS) | {"café"}) + 4  # the words of all three files


def test_a_trained_tokenizer_is_kept_in_the_cache_and_copied_into_a_new_model_folder(texts, tmp_path, monkeypatch):
    _, files = texts
    cache = str(tmp_path / "cache")
    first = train_tokenizer("sentencepiece", files["a"], tmp_path / "m1", vocab_size=40, cache_dir=cache)
    from lmkit.data.sentencepiece import SentencePieceTokenizer

    def never(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(SentencePieceTokenizer, "train", classmethod(never))
    second = train_tokenizer("sentencepiece", files["a"], tmp_path / "m2", vocab_size=40, cache_dir=cache)
    assert second.fingerprint() == first.fingerprint()
    assert os.path.isfile(tmp_path / "m2" / "spm.model")
    with pytest.raises(AssertionError, match="trained again"):  # other options: trained
        train_tokenizer("sentencepiece", files["a"], tmp_path / "m3", vocab_size=36, cache_dir=cache)


def test_cache_root_settings(monkeypatch, tmp_path):
    monkeypatch.delenv(token_cache.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert token_cache.cache_root("") == os.path.join(str(tmp_path), "lmkit", "tokens")
    monkeypatch.setenv(token_cache.CACHE_ENV, str(tmp_path / "env"))
    assert token_cache.cache_root("") == str(tmp_path / "env")
    assert token_cache.cache_root(str(tmp_path / "flag")) == str(tmp_path / "flag")
    assert token_cache.cache_root("none") is None and token_cache.cache_root("off") is None


def test_sentencepiece_trains_on_a_seeded_sample_of_a_large_text(texts, tmp_path, monkeypatch):
    from lmkit.data import sentencepiece

    _, files = texts
    sample = str(tmp_path / "sample.txt")
    size = os.path.getsize(files["a"])
    assert sentencepiece._sample_lines([files["a"]], sample, size) == [files["a"]]  # small: as is
    assert sentencepiece._sample_lines([files["a"], files["b"]], sample, size // 2) == [sample]
    first = open(sample, "rb").read()
    sentencepiece._sample_lines([files["a"], files["b"]], sample, size // 2)
    assert open(sample, "rb").read() == first  # the same lines every time
    total = size + os.path.getsize(files["b"])
    assert 0.3 * size < len(first) < 0.7 * size and first.count(b"\n") < 0.7 * (total // 40)
    monkeypatch.setattr(sentencepiece, "TRAINING_BYTES", size // 2)
    made = []
    real = sentencepiece.train_sentencepiece
    monkeypatch.setattr(sentencepiece, "train_sentencepiece",
                        lambda files, *a, **k: made.append(list(files)) or real(files, *a, **k))
    tok = train_tokenizer("sentencepiece", [files["a"], files["b"]], tmp_path / "m", vocab_size=40)
    assert tok.vocab_size == 40 and made[0][0].endswith(".txt") and "spm-sample" in made[0][0]
    assert sorted(os.listdir(tmp_path / "m")) == ["spm.model", "spm.vocab", "tokenizer.json"]  # sample gone
