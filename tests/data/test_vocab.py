"""Vocab: frequency order, size limits, specials, files, encode/decode."""

from __future__ import annotations

import os

import pytest

from lmkit.data import DataError, Vocab

LINES = ["b a c a", "d b a", "c e"]  # a:3, b:2, c:2, d:1, e:1


def test_frequency_order_ties_by_token_specials_first():
    vocab = Vocab.build(LINES)
    assert vocab.tokens == ("<unk>", "<eos>", "<bos>", "<pad>", "a", "b", "c", "d", "e")
    assert (vocab.unk_id, vocab.eos_id, vocab.bos_id, vocab.pad_id) == (0, 1, 2, 3)
    assert len(vocab) == vocab.size == 9
    # Input order does not matter.
    assert Vocab.build(list(reversed(LINES))) == vocab


def test_max_size_min_count_and_custom_specials():
    assert Vocab.build(LINES, max_size=6).tokens == ("<unk>", "<eos>", "<bos>", "<pad>", "a", "b")
    assert Vocab.build(LINES, min_count=2).tokens[4:] == ("a", "b", "c")
    vocab = Vocab.build(LINES, bos_token=None, pad_token=None, extra_specials=("<mask>",))
    assert vocab.tokens[:3] == ("<unk>", "<eos>", "<mask>")
    assert vocab.bos_id is None and vocab.pad_id is None
    with pytest.raises(ValueError, match=r"max_size = 3 is smaller than the 4 special tokens"):
        Vocab.build(LINES, max_size=3)


def test_special_already_in_text_is_not_duplicated_and_newline_token_counts():
    # PTB: <unk> is in the text, a newline is <eos>; no other specials.
    lines = [" x <unk> y ", " y <unk> "]
    vocab = Vocab.build(lines, bos_token=None, pad_token=None, newline_token="<eos>")
    assert vocab.tokens == ("<unk>", "<eos>", "y", "x")
    # Without specials, <eos> is ranked by its count (one a line).
    plain = Vocab.build(lines, unk_token=None, eos_token=None, bos_token=None, pad_token=None,
                        newline_token="<eos>")
    assert plain.tokens == ("<eos>", "<unk>", "y", "x")
    assert plain.unk_id is None and plain.eos_id is None  # no roles asked for
    assert Vocab(plain.tokens).eos_id == 0  # looked up by the default names


def test_build_from_file_equals_build_from_lines(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    assert Vocab.build(str(path)) == Vocab.build(LINES) == Vocab.build(path)


def test_save_load_round_trip_is_atomic_and_plain(tmp_path):
    vocab = Vocab.build(["héllo wörld héllo", "日本 語"])
    path = tmp_path / "model" / "vocab.txt"
    vocab.save(str(path))
    assert os.listdir(path.parent) == ["vocab.txt"]  # no temp file left
    assert path.read_text(encoding="utf-8").split("\n")[:-1] == list(vocab.tokens)
    loaded = Vocab.load(str(path))
    assert loaded == vocab and loaded.fingerprint() == vocab.fingerprint()
    assert loaded.token_to_id("héllo") == vocab.token_to_id("héllo") == 4
    # Overwriting replaces the file in one step.
    Vocab.build(["z"]).save(str(path))
    assert Vocab.load(str(path)).tokens[-1] == "z"


def test_encode_decode_and_unknown():
    vocab = Vocab.build(LINES)
    ids = vocab.encode(["a", "e", "zzz", "<eos>"])
    assert ids == [4, 8, 0, 1]
    assert vocab.decode(ids) == ["a", "e", "<unk>", "<eos>"]
    assert vocab.token_to_id("zzz") == vocab.unk_id
    assert vocab.id_to_token(5) == "b"
    assert "a" in vocab and "zzz" not in vocab
    with pytest.raises(DataError, match=r"id 9 is out of range for a vocabulary of 9 entries"):
        vocab.decode([9])
    with pytest.raises(DataError, match=r"id -1 is out of range"):
        vocab.id_to_token(-1)
    no_unk = Vocab.build(LINES, unk_token=None)
    with pytest.raises(DataError, match=r"token 'zzz' is not in the vocabulary .*no unknown-word token"):
        no_unk.encode(["a", "zzz"])


def test_fingerprint_depends_on_tokens_and_order():
    a = Vocab(["x", "y", "z"])
    assert a.fingerprint() == Vocab(["x", "y", "z"]).fingerprint()
    assert a.fingerprint() != Vocab(["y", "x", "z"]).fingerprint()
    assert a.fingerprint() != Vocab(["x", "y"]).fingerprint()
    assert len(a.fingerprint()) == 16


def test_constructor_rejects_bad_tokens():
    with pytest.raises(ValueError, match=r"appears twice \(ids 0 and 2\)"):
        Vocab(["a", "b", "a"])
    with pytest.raises(ValueError, match=r"line break"):
        Vocab(["a", "b\nc"])
    with pytest.raises(ValueError, match=r"tokens\[1\] = '' is not a non-empty string"):
        Vocab(["a", ""])
    with pytest.raises(ValueError, match=r"tokens is empty"):
        Vocab([])


@pytest.mark.parametrize("content, message", [
    (b"", r"is empty"),
    (b"a\n\nb\n", r"empty line 2"),
    (b"a\nb\na\n", r"lists 'a' twice \(lines 1 and 3\)"),
    (b"a\n\xff\n", r"is not UTF-8"),
])
def test_load_rejects_bad_files(tmp_path, content, message):
    path = tmp_path / "vocab.txt"
    path.write_bytes(content)
    with pytest.raises(DataError, match=message) as info:
        Vocab.load(str(path))
    assert str(path) in str(info.value)


def test_load_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"does not exist"):
        Vocab.load(str(tmp_path / "nope.txt"))


def test_load_accepts_windows_line_ends(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes(b"<unk>\r\n<eos>\r\nword\r\n")
    vocab = Vocab.load(str(path))
    assert vocab.tokens == ("<unk>", "<eos>", "word") and vocab.eos_id == 1 and vocab.pad_id is None
