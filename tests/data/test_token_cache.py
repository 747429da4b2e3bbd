"""The data cache: text encoded once (in parallel), reused, invalidated, memory-mapped; many files."""
import errno
import json
import os

import numpy as np
import pytest

from lmkit.data import encoding_pool, textfile, token_cache
from lmkit.data.errors import DataError
from lmkit.data.text import load_text_data
from lmkit.data.tokenizers import load_tokenizer, train_tokenizer
from tests.data import samples


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


def test_several_files_are_one_stream_in_sorted_order(texts, tmp_path):
    root, files = texts
    tok = train_tokenizer("word", str(root / "shards"), tmp_path / "w")
    each = [load_text_data(tok, f).train for f in sorted([files["a"], files["b"], files["c"]])]
    for cache in (None, str(tmp_path / "c")):
        data = load_text_data(tok, str(root / "shards"), cache_dir=cache)
        np.testing.assert_array_equal(data.train, np.concatenate(each))
    assert tok.vocab_size == len(set(samples.WORDS) | {"café"}) + 4  # the words of all three files


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


# ----------------------------------------------------------------------------------------------------
# The caches trust no file by path, size and time alone; ids beyond a tokenizer's vocab_size never wrap.
def _rewrite_keeping_size_and_time(path, text):
    """``text`` into ``path`` as ``cp -p`` or ``rsync -t`` would copy an edited file back: the old size
    and modification time."""
    before = os.stat(path)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def test_a_source_edited_with_the_same_size_and_time_is_encoded_again(tmp_path):
    path = str(tmp_path / "train.txt")
    old, new = "the cat sat on the mat\n" * 50, "a big dog ran to a log\n" * 50
    assert len(old) == len(new)
    with open(path, "w") as f:
        f.write(old)
    vocab_text = tmp_path / "both.txt"
    vocab_text.write_text(old + new)
    tokenizer = train_tokenizer("word", str(vocab_text), tmp_path / "tok")
    root = str(tmp_path / "cache")
    first = token_cache.cached_stream(root, tokenizer, [path], True, what="train_file")
    _rewrite_keeping_size_and_time(path, new)
    second = token_cache.cached_stream(root, tokenizer, [path], True, what="train_file")
    assert not second.reused and second.folder != first.folder
    np.testing.assert_array_equal(second.ids, load_text_data(tokenizer, path).train)
    lines = token_cache.cached_lines(root, tokenizer, path, what="source_file")
    _rewrite_keeping_size_and_time(path, old)
    again = token_cache.cached_lines(root, tokenizer, path, what="source_file")
    assert not again.reused and again.line(0).tolist() == tokenizer.encode("the cat sat on the mat")
    assert lines.line(0).tolist() == tokenizer.encode("a big dog ran to a log")


def test_a_tokenizer_cached_for_a_file_edited_with_the_same_size_and_time_is_trained_again(tmp_path):
    path = str(tmp_path / "train.txt")
    with open(path, "w") as f:
        f.write("the cat sat on the mat\n" * 20)
    cache = str(tmp_path / "cache")
    first = train_tokenizer("word", path, tmp_path / "m1", cache_dir=cache)
    _rewrite_keeping_size_and_time(path, "a big dog ran to a log\n" * 20)
    second = train_tokenizer("word", path, tmp_path / "m2", cache_dir=cache)
    assert "dog" in second.vocab.tokens and "cat" not in second.vocab.tokens
    assert second.fingerprint() != first.fingerprint()


# -- HFTokenizer.vocab_size: the largest id + 1 -----------------------------------------------------
def _word_level(vocab):
    """An hf tokenizer over ``vocab`` (token -> id), words split at spaces; "\\n" is a token (the eos)."""
    tokenizers = pytest.importorskip("tokenizers")
    from lmkit.hub.tokenizer import HFTokenizer

    tk = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = tokenizers.pre_tokenizers.Split(" ", behavior="removed")
    return HFTokenizer(tk, "test")


def test_hf_vocab_size_is_the_largest_id_plus_one():
    tokenizer = _word_level({"<unk>": 0, "\n": 1, "a": 2, "b": 7})  # ids 3..6 unused
    assert tokenizer.vocab_size == 8 and tokenizer.eos_id == 1
    assert tokenizer.encode("a b") == [2, 7]
    assert tokenizer.decode([2, 7]) == "a b"  # 7 is in range


def test_ids_above_65535_are_kept_whole_in_the_cache(tmp_path):
    tokenizer = _word_level({"<unk>": 0, "\n": 1, "a": 2, "b": 70_000})
    assert tokenizer.vocab_size == 70_001
    tokenizer.save(tmp_path / "tok")
    assert load_tokenizer(tmp_path / "tok").vocab_size == 70_001
    path = tmp_path / "t.txt"
    path.write_text("a b a\n\nb b\n")
    stream = token_cache.encode_to_cache(str(tmp_path / "cache"), tokenizer, [str(path)], True, workers=1)
    assert stream.ids.dtype == np.uint32
    np.testing.assert_array_equal(stream.ids, [2, 70_000, 2, 1, 70_000, 70_000, 1])
    np.testing.assert_array_equal(stream.ids, load_text_data(tokenizer, str(path)).train)


def test_an_id_beyond_the_vocab_size_is_refused_not_wrapped(tmp_path, monkeypatch):
    """A tokenizer whose vocab_size understates its ids (the old count of tokens): one DataError, no cache."""
    from lmkit.hub.tokenizer import HFTokenizer

    tokenizer = _word_level({"<unk>": 0, "\n": 1, "a": 2, "b": 70_000})
    monkeypatch.setattr(HFTokenizer, "vocab_size", property(lambda self: self.hf.get_vocab_size()))
    assert tokenizer.vocab_size == 4
    path = tmp_path / "t.txt"
    path.write_text("a b a\n")
    root = tmp_path / "cache"
    with pytest.raises(DataError, match=r"the hf tokenizer gave the id 70000, outside its vocab_size 4 "
                                        r"\(ids 0..3\).*repair or replace the tokenizer"):
        token_cache.encode_to_cache(str(root), tokenizer, [str(path)], True, workers=1)
    with pytest.raises(DataError, match=r"gave the id 70000, outside its vocab_size 4"):
        token_cache.encode_lines_to_cache(str(root), tokenizer, str(path), workers=1)
    assert os.listdir(root) == []
