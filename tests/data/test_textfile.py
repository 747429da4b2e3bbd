"""Text file checks, word counts and load_text_data (streams + words for perplexity per word)."""

from __future__ import annotations

import numpy as np
import pytest

from lmkit.data import (
    ByteTokenizer,
    DataError,
    TextData,
    Vocab,
    WordTokenizer,
    check_text_file,
    count_words,
    load_text_data,
    train_tokenizer,
)
from lmkit.data.textfile import BINARY_PROBE_BYTES


# --- check_text_file -----------------------------------------------------------------------------
def test_a_good_file_passes(tmp_path):
    path = tmp_path / "ok.txt"
    path.write_text("première ligne\n\nsecond line 世界\n", encoding="utf-8")
    assert check_text_file(path, "train_file") == str(path)


@pytest.mark.parametrize("content, pattern", [
    (None, r"^valid_file '.*bad' does not exist; check the path$"),
    (b"", r"^valid_file '.*bad' is empty; give a file with text"),
    (b"\n  \n\t\r\n", r"^valid_file '.*bad' has only blank lines \(3\); give a file with text"),
    (b"PK\x03\x04\x00\x00 zip", r"^valid_file '.*bad' is a binary file \(a NUL byte at offset 4\), "
                                r"not text; give a UTF-8 text file"),
    (b"fine\nalso fine\ncaf\xe9 au lait\n", r"^valid_file '.*bad' is not UTF-8: line 3 has the byte "
                                            r"0xe9 at byte 4 of the line .*iconv -f LATIN1 -t UTF-8"),
    ("ok\n€ cut: ".encode() + "€".encode()[:2], r"is not UTF-8: line 2 has the byte 0xe2 at byte 10"),
])
def test_bad_files_name_the_file_the_fault_and_the_fix(tmp_path, content, pattern):
    path = tmp_path / "bad"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError, match=pattern):
        check_text_file(str(path), "valid_file")


def test_a_folder_is_not_a_text_file(tmp_path):
    with pytest.raises(DataError, match=r"^text file '.*' is a folder; give the path of a UTF-8"):
        check_text_file(tmp_path)


def test_nul_bytes_are_looked_for_in_the_first_mib_only(tmp_path):
    late = tmp_path / "late.txt"
    late.write_bytes(b"a" * BINARY_PROBE_BYTES + b"\n\x00\n")
    assert check_text_file(late) == str(late)  # a NUL after the probe is not looked for
    early = tmp_path / "early.txt"
    early.write_bytes(b"a" * (BINARY_PROBE_BYTES - 1) + b"\x00\n")
    with pytest.raises(DataError, match=rf"a NUL byte at offset {BINARY_PROBE_BYTES - 1}"):
        check_text_file(early)


# --- count_words ---------------------------------------------------------------------------------
def test_count_words(tmp_path):
    lines = ["the cat  sat", "", "   ", "on\tthe mat."]
    assert count_words(lines) == 6
    assert count_words(lines, line_ends=True) == 8  # two non-blank lines
    path = tmp_path / "t.txt"
    path.write_text("\n".join(lines) + "\n")
    assert count_words(str(path)) == 6 and count_words(path, line_ends=True) == 8


# --- load_text_data ------------------------------------------------------------------------------
def _files(tmp_path):
    texts = {"train": "a b c\n\nb a\nc c c d\n", "valid": "a x\n", "test": "d\n\n b b \n"}
    paths = {}
    for name, text in texts.items():
        paths[name] = tmp_path / f"{name}.txt"
        paths[name].write_text(text, encoding="utf-8")
    return paths


def test_word_streams_and_word_counts(tmp_path):
    paths = _files(tmp_path)
    tok = train_tokenizer("word", paths["train"], tmp_path / "run")
    data = load_text_data(tok, paths["train"], paths["valid"], paths["test"])
    assert isinstance(data, TextData) and data.tokenizer is tok
    eos = tok.eos_id
    expected_train = tok.encode("a b c") + [eos] + tok.encode("b a") + [eos] + tok.encode("c c c d") + [eos]
    np.testing.assert_array_equal(data.train, expected_train)  # the blank line is skipped
    np.testing.assert_array_equal(data.valid, [tok.vocab.token_to_id("a"), tok.unk_id, eos])
    assert all(s.dtype == np.int32 for s in (data.train, data.valid, data.test))
    # Words plus one line end per non-blank line: for word tokens, tokens == words.
    assert (data.train_words, data.valid_words, data.test_words) == (12, 3, 5)
    for name, ids, words in data.splits():
        assert ids.size == words, name
    assert [name for name, _, _ in data.splits()] == ["train", "valid", "test"]


def test_byte_streams_count_words_not_bytes(tmp_path):
    paths = _files(tmp_path)
    data = load_text_data(ByteTokenizer(), paths["train"])
    assert data.valid is None and data.test is None
    assert data.valid_words is None and data.test_words is None
    assert [name for name, _, _ in data.splits()] == ["train"]
    assert data.train.size == len("a b c") + len("b a") + len("c c c d") + 3
    assert data.train_words == 12  # the same words as the word tokenizer's: comparable perplexity
    assert ByteTokenizer().decode(data.train) == "a b c\nb a\nc c c d\n"


def test_no_eos_no_line_ends_counted(tmp_path):
    paths = _files(tmp_path)
    tok = WordTokenizer(Vocab.build(str(paths["train"]), eos_token=None))
    data = load_text_data(tok, paths["train"])
    assert data.train.size == data.train_words == 9


def test_each_bad_file_is_named_by_its_role(tmp_path):
    paths = _files(tmp_path)
    paths["valid"].write_bytes(b"ok\n\xff\xfe\n")
    with pytest.raises(DataError, match=r"^valid_file '.*valid.txt' is not UTF-8: line 2"):
        load_text_data(ByteTokenizer(), paths["train"], paths["valid"])
    with pytest.raises(DataError, match=r"^test_file '.*nope.txt' does not exist"):
        load_text_data(ByteTokenizer(), paths["train"], None, tmp_path / "nope.txt")
    (tmp_path / "blank.txt").write_text("\n\n")
    with pytest.raises(DataError, match=r"^train_file '.*blank.txt' has only blank lines"):
        load_text_data(ByteTokenizer(), tmp_path / "blank.txt")
