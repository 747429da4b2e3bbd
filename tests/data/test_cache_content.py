"""The caches trust no file by path, size and time alone; ids beyond a tokenizer's vocab_size never wrap."""
import os

import numpy as np
import pytest

from lmkit.data import token_cache
from lmkit.data.errors import DataError
from lmkit.data.text import load_text_data
from lmkit.data.tokenizers import load_tokenizer, train_tokenizer


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
