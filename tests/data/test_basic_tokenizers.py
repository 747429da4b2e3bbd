"""lmkit's own tokenizers (lmkit.data.basic_tokenizers): word, char and byte."""
import os

import pytest

from lmkit.data import ByteTokenizer, DataError, load_tokenizer, train_tokenizer


def test_char_symbols_survive_the_file(tmp_path):
    """Spaces, form feeds and U+2028 are symbols one a line in chars.txt; a CR is never one."""
    path = tmp_path / "odd.txt"
    path.write_bytes("a b\x0cc\u2028d\r\ne\u00a0f\n".encode("utf-8"))
    tok = train_tokenizer("char", str(path), str(tmp_path / "run"))
    assert "\r" not in tok.vocab and "\n" not in tok.vocab
    again = load_tokenizer(str(tmp_path / "run"))
    assert again.vocab == tok.vocab
    for text in ("a b\x0cc\u2028d", "e\u00a0f"):
        assert tok.unk_id not in tok.encode(text)
        assert again.decode(again.encode(text)) == text


def test_byte_needs_no_training_and_no_file(tmp_path):
    tok = train_tokenizer("byte", str(tmp_path / "never-read.txt"), str(tmp_path / "run"))
    assert tok.vocab_size == 260
    assert os.listdir(tmp_path) == ["run"]
    assert load_tokenizer(str(tmp_path / "run")).fingerprint() == ByteTokenizer().fingerprint()


def test_word_options(corpus, tmp_path):
    path, _ = corpus
    small = train_tokenizer("word", str(path), str(tmp_path / "a"), max_vocab=20)
    assert small.vocab_size == 20 and small.options == {"max_vocab": 20, "min_count": 1}
    assert small.vocab.tokens[:4] == ("<unk>", "<eos>", "<bos>", "<pad>")
    frequent = train_tokenizer("word", str(path), str(tmp_path / "b"), min_count=12)
    full = train_tokenizer("word", str(path), str(tmp_path / "c"))
    assert 4 < frequent.vocab_size < full.vocab_size
    assert load_tokenizer(str(tmp_path / "b")).options == {"max_vocab": None, "min_count": 12}
    with pytest.raises(DataError, match=r"max_vocab = 3 must be an integer >= 5"):
        train_tokenizer("word", str(path), str(tmp_path / "d"), max_vocab=3)
    with pytest.raises(DataError, match=r"min_count = 0 must be an integer >= 1"):
        train_tokenizer("word", str(path), str(tmp_path / "d"), min_count=0)
