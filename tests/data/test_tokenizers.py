"""The tokenizer registry: training into a folder, saving, loading, reuse, readable decoding."""

from __future__ import annotations

import json
import os

import pytest

from lmkit.data import (
    TOKENIZERS,
    ByteTokenizer,
    CharTokenizer,
    DataError,
    SentencePieceTokenizer,
    Tokenizer,
    WordTokenizer,
    load_tokenizer,
    tokenizer_class,
    train_tokenizer,
)
from tests.data import samples


@pytest.mark.parametrize("name, options, files", samples.KINDS, ids=samples.KIND_IDS)
def test_train_save_load_round_trip(corpus, tmp_path, name, options, files):
    path, lines = corpus
    folder = tmp_path / "run"
    tok = train_tokenizer(name, str(path), str(folder), **options)
    assert isinstance(tok, Tokenizer) and tok.name == name
    assert sorted(os.listdir(folder)) == sorted(files + ["tokenizer.json"])
    assert os.listdir(path.parent) == ["train.txt"]  # nothing beside the user's data
    record = json.loads((folder / "tokenizer.json").read_text())
    assert record == {"name": name, "options": tok.options, "vocab_size": tok.vocab_size,
                      "fingerprint": tok.fingerprint()}
    specials = [tok.unk_id, tok.eos_id, tok.bos_id, tok.pad_id]
    assert None not in specials and len(set(specials)) == 4
    assert all(0 <= i < tok.vocab_size for i in specials)

    again = load_tokenizer(str(folder))
    assert type(again) is type(tok)
    assert (again.vocab_size, again.fingerprint(), again.options) == (
        tok.vocab_size, tok.fingerprint(), tok.options)
    for line in lines[:40]:
        ids = tok.encode(line)
        assert ids and all(0 <= i < tok.vocab_size for i in ids)
        assert again.encode(line) == ids
        assert tok.decode(ids) == line  # every word of these lines was seen in training
    assert tok.encode_batch(lines[:3]) == [tok.encode(t) for t in lines[:3]]


def test_decode_makes_readable_text_per_kind(corpus, tmp_path):
    path, _ = corpus
    spm = train_tokenizer("sentencepiece", str(path), str(tmp_path / "spm"), vocab_size=70)
    pieces = [spm.id_to_piece(i) for i in spm.encode("abc déf")]
    assert pieces[0].startswith("\u2581") and len(pieces) > 2  # pieces, joined back into words
    assert spm.decode(spm.encode("abc déf")) == "abc déf"

    byte = ByteTokenizer()
    text = "naïve 世界 ☃"
    assert byte.encode(text) == [b + 4 for b in text.encode("utf-8")]
    assert byte.decode(byte.encode(text)) == text
    cut = byte.encode("世")[:2]  # half a character: replaced, not an error
    assert byte.decode(cut + byte.encode("x")) == "\ufffdx"
    assert byte.decode([byte.unk_id]) == "\ufffd"

    word = train_tokenizer("word", str(path), str(tmp_path / "word"))
    assert word.decode(word.encode("zzzz qqqq")) == "<unk> <unk>"  # unknown words stay visible

    char = train_tokenizer("char", str(path), str(tmp_path / "char"))
    assert char.encode("a€")[1] == char.unk_id  # a character never seen


def test_a_tokenizer_kinds_version_keys_the_data_cache(corpus, tmp_path, monkeypatch):
    """A kind that trains differently now (sentencepiece, version 1) is trained again, not taken from a cache an
    older lmkit filled."""
    from lmkit.data import tokenizers
    path, _ = corpus
    now = tokenizers._cached_tokenizer_dir(str(tmp_path / "cache"), SentencePieceTokenizer, {"vocab_size": 70},
                                           [str(path)])
    monkeypatch.setattr(SentencePieceTokenizer, "VERSION", 0)
    before = tokenizers._cached_tokenizer_dir(str(tmp_path / "cache"), SentencePieceTokenizer, {"vocab_size": 70},
                                              [str(path)])
    assert now != before


def test_an_existing_tokenizer_is_reused_not_retrained(corpus, tmp_path, monkeypatch):
    path, _ = corpus
    folder = str(tmp_path / "run")
    first = train_tokenizer("sentencepiece", str(path), folder, vocab_size=70)
    stamp = os.stat(os.path.join(folder, "spm.model")).st_mtime_ns

    def no_training(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(SentencePieceTokenizer, "train", classmethod(no_training))
    again = train_tokenizer("sentencepiece", str(path), folder, vocab_size=70, max_vocab=9)
    assert again.fingerprint() == first.fingerprint()  # max_vocab is not a sentencepiece option
    assert os.stat(os.path.join(folder, "spm.model")).st_mtime_ns == stamp


def test_a_different_saved_tokenizer_is_an_error_naming_both(corpus, tmp_path):
    path, _ = corpus
    folder = str(tmp_path / "run")
    train_tokenizer("sentencepiece", str(path), folder, vocab_size=70)
    with pytest.raises(DataError) as info:
        train_tokenizer("sentencepiece", str(path), folder, vocab_size=80)
    message = str(info.value)
    assert os.path.join(folder, "tokenizer.json") in message
    assert "{'vocab_size': 70, 'model_type': 'unigram'}" in message
    assert "{'vocab_size': 80, 'model_type': 'unigram'}" in message
    with pytest.raises(DataError, match=r"holds a sentencepiece tokenizer .* but a char tokenizer"):
        train_tokenizer("char", str(path), folder)
    assert load_tokenizer(folder).vocab_size == 70  # the saved one is untouched


def test_unknown_kind_and_missing_size(corpus, tmp_path):
    path, _ = corpus
    with pytest.raises(DataError, match=r"^unknown tokenizer 'sentencepeice'; did you mean "
                                        r"'sentencepiece'\?"):
        train_tokenizer("sentencepeice", str(path), str(tmp_path / "run"))
    with pytest.raises(DataError, match=r"unknown tokenizer 'xyz'; choices: word, sentencepiece, "
                                        r"char, byte"):
        tokenizer_class("xyz")
    with pytest.raises(DataError, match=r"sentencepiece tokenizer needs a vocab_size.*--vocab_size"):
        train_tokenizer("sentencepiece", str(path), str(tmp_path / "run"))
    with pytest.raises(DataError, match=r"did you mean 'bpe'"):
        train_tokenizer("sentencepiece", str(path), str(tmp_path / "run"), vocab_size=50,
                        model_type="bep")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["word", "char", "sentencepiece"])
def test_bad_training_file_is_checked_first(tmp_path, name):
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"\x00\x01\x02" * 100)
    with pytest.raises(DataError, match=r"train_file .*model.bin' is a binary file"):
        train_tokenizer(name, str(binary), str(tmp_path / "run"), vocab_size=50)
    with pytest.raises(DataError, match=r"train_file .*missing.txt' does not exist"):
        train_tokenizer(name, str(tmp_path / "missing.txt"), str(tmp_path / "run"), vocab_size=50)
    assert not (tmp_path / "run").exists()


def test_load_errors_name_the_file_and_the_fix(corpus, tmp_path):
    with pytest.raises(DataError, match=r"'.*nowhere' holds no tokenizer .* train_tokenizer"):
        load_tokenizer(str(tmp_path / "nowhere"))
    folder = samples.saved_tokenizer(corpus, tmp_path)
    meta = folder / "tokenizer.json"
    record = json.loads(meta.read_text())

    def broken(**changes):
        meta.write_text(json.dumps(dict(record, **changes)))
        with pytest.raises(DataError) as info:
            load_tokenizer(str(folder))
        assert str(meta) in str(info.value) and "train the tokenizer again" in str(info.value)
        return str(info.value)

    assert "unknown tokenizer 'chars'; did you mean 'char'?" in broken(name="chars")
    assert "unknown key 'max_vocab'" in broken(options={"max_vocab": 4})
    assert "12 ids with fingerprint" in broken(vocab_size=12)
    meta.write_text("{not json")
    with pytest.raises(DataError, match=r"tokenizer.json is not readable JSON"):
        load_tokenizer(str(folder))
    meta.write_text(json.dumps(record))
    # A symbol file changed after saving: the fingerprint tells.
    chars = folder / "chars.txt"
    chars.write_text(chars.read_text(encoding="utf-8") + "Q\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"the files in .* give \d+ ids with fingerprint .* "
                                        r"\(changed after saving\)"):
        load_tokenizer(str(folder))
    chars.unlink()
    with pytest.raises(DataError, match=r"names a char tokenizer that cannot be read: .*chars.txt' "
                                        r"does not exist"):
        load_tokenizer(str(folder))


def test_one_registry():
    from lmkit.hub.tokenizer import HFTokenizer
    assert list(TOKENIZERS) == ["word", "sentencepiece", "char", "byte", "hf"]
    classes = [tokenizer_class(name) for name in TOKENIZERS]
    for name, cls in zip(TOKENIZERS, classes):
        assert cls.name == name and issubclass(cls, Tokenizer)
    assert set(classes) == {WordTokenizer, SentencePieceTokenizer, CharTokenizer, ByteTokenizer, HFTokenizer}
    # The pretrained kind is not trained: asking for it without a model to take it from is one clear error.
    with pytest.raises(DataError, match=r"tokenizer = 'hf' comes with a pretrained model .* --init_from"):
        HFTokenizer.train("train.txt", "folder")


def test_a_pretrained_tokenizer_setting_is_the_hf_kind_and_its_source(tmp_path):
    from lmkit.data.tokenizers import split_tokenizer
    assert split_tokenizer("hf:gpt2") == ("hf", "gpt2")
    assert split_tokenizer("hf:/models/tok") == ("hf", "/models/tok")
    assert split_tokenizer("char") == ("char", "") and split_tokenizer("hf") == ("hf", "")
    assert split_tokenizer("hf:") == ("hf:", "")  # nothing after the prefix: no kind
    with pytest.raises(DataError, match=r"unknown tokenizer 'hf:'"):
        train_tokenizer("hf:", "train.txt", str(tmp_path / "run"))
    with pytest.raises(DataError, match=r"tokenizer hf:gpt2 and source '/models/gpt2' name two tokenizers"):
        train_tokenizer("hf:gpt2", "train.txt", str(tmp_path / "run"), source="/models/gpt2")
    assert not (tmp_path / "run").exists()
