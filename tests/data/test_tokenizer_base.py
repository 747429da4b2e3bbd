"""What every tokenizer kind shares (lmkit.data.tokenizer_base.Tokenizer): line breaks are eos both ways,
ids out of range are refused, and a save killed half-way leaves no tokenizer."""
import os

import numpy as np
import pytest

from lmkit.data import ByteTokenizer, DataError, Vocab, WordTokenizer, load_tokenizer, train_tokenizer
from tests.data import samples


@pytest.mark.parametrize("name, options, files", samples.KINDS, ids=samples.KIND_IDS)
def test_line_breaks_are_eos_and_bos_pad_vanish(corpus, tmp_path, name, options, files):
    path, lines = corpus
    tok = train_tokenizer(name, str(path), str(tmp_path / "run"), **options)
    first, second = lines[0], lines[1]
    ids = tok.encode(f"{first}\n{second}")
    assert ids == tok.encode(first) + [tok.eos_id] + tok.encode(second)
    assert tok.encode(f"{first}\r\n{second}") == ids
    framed = [tok.bos_id] + ids + [tok.eos_id, tok.pad_id, tok.pad_id]
    assert tok.decode(np.asarray(framed)) == f"{first}\n{second}\n"


def test_decode_rejects_ids_out_of_range():
    with pytest.raises(DataError, match=r"id 260 is out of range for the byte tokenizer of 260 ids"):
        ByteTokenizer().decode([5, 260])
    tok = WordTokenizer(Vocab.build(["a b"]))
    with pytest.raises(DataError, match=r"id -1 is out of range for the word tokenizer of 6 ids"):
        tok.decode([-1])
    with pytest.raises(DataError, match=r"encode takes a str, got bytes"):
        tok.encode(b"a b")


def test_a_killed_save_leaves_no_tokenizer(corpus, tmp_path, monkeypatch):
    path, _ = corpus
    folder = tmp_path / "run"
    train_tokenizer("word", str(path), str(folder), max_vocab=30)
    real_write = WordTokenizer._write_files

    def killed(self, target):
        real_write(self, target)
        raise KeyboardInterrupt  # killed after the vocabulary, before tokenizer.json

    monkeypatch.setattr(WordTokenizer, "_write_files", killed)
    with pytest.raises(KeyboardInterrupt):
        WordTokenizer(Vocab.build(str(path), max_size=40), max_vocab=40).save(str(folder))
    # The old tokenizer.json is gone rather than describing the new vocab.txt.
    assert not (folder / "tokenizer.json").exists()
    with pytest.raises(DataError, match=r"holds no tokenizer \(tokenizer.json is missing\)"):
        load_tokenizer(str(folder))
    monkeypatch.setattr(WordTokenizer, "_write_files", real_write)
    assert train_tokenizer("word", str(path), str(folder), max_vocab=30).vocab_size == 30
    assert not [f for f in os.listdir(folder) if f.endswith(".tmp")]
