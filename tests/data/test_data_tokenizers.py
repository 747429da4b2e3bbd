"""The tokenizer registry: training into a folder, saving, loading, reuse, readable decoding."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest

from lmkit.data import (
    TOKENIZERS,
    ByteTokenizer,
    CharTokenizer,
    DataError,
    SentencePieceTokenizer,
    Tokenizer,
    Vocab,
    WordTokenizer,
    load_tokenizer,
    tokenizer_class,
    train_tokenizer,
)

# name, options, the files besides tokenizer.json
KINDS = [
    ("word", {}, ["vocab.txt"]),
    ("char", {}, ["chars.txt"]),
    ("byte", {}, []),
    ("sentencepiece", {"vocab_size": 70}, ["spm.model", "spm.vocab"]),
    ("sentencepiece", {"vocab_size": 70, "model_type": "bpe"}, ["spm.model", "spm.vocab"]),
]
KIND_IDS = ["word", "char", "byte", "spm-unigram", "spm-bpe"]


def _corpus(path, lines=200, seed=0):
    """Lines of words from a 120-word lexicon (with a few accented letters)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyzé"
    lexicon = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(120)]
    text = [" ".join(rng.choice(lexicon) for _ in range(rng.randint(3, 10))) for _ in range(lines)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return text


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "data" / "train.txt"
    return path, _corpus(path)


@pytest.mark.parametrize("name, options, files", KINDS, ids=KIND_IDS)
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


@pytest.mark.parametrize("name, options, files", KINDS, ids=KIND_IDS)
def test_line_breaks_are_eos_and_bos_pad_vanish(corpus, tmp_path, name, options, files):
    path, lines = corpus
    tok = train_tokenizer(name, str(path), str(tmp_path / "run"), **options)
    first, second = lines[0], lines[1]
    ids = tok.encode(f"{first}\n{second}")
    assert ids == tok.encode(first) + [tok.eos_id] + tok.encode(second)
    assert tok.encode(f"{first}\r\n{second}") == ids
    framed = [tok.bos_id] + ids + [tok.eos_id, tok.pad_id, tok.pad_id]
    assert tok.decode(np.asarray(framed)) == f"{first}\n{second}\n"


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


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_sentencepiece_keeps_the_unknown_word_mark_of_ptb_and_wikitext_as_one_piece(tmp_path, model_type):
    """WikiText and PTB write <unk> for rare words. SentencePiece reserves that string for its own unknown piece:
    given it as text, it split the mark into 5 pieces and, with a small vocabulary, left '>' out (every mark
    decoded as '<unk ⁇'). Trained here, the mark is one piece (id 4) that decodes back to itself, and
    SentencePiece's unknown piece (a character it never saw) is id 0, <unk_char>."""
    path = tmp_path / "train.txt"
    lines = _corpus(path)
    path.write_text("\n".join(" <unk> ".join(line.split(" ", 1)) for line in lines) + "\n", encoding="utf-8")
    assert ">" not in path.read_text(encoding="utf-8").replace("<unk>", "")  # '>' only inside the marks
    spm = train_tokenizer("sentencepiece", str(path), str(tmp_path / "spm"), vocab_size=70, model_type=model_type)
    text = lines[0].split(" ", 1)[0] + " <unk> ab"
    ids = spm.encode(text)
    assert ids.count(4) == 1 and spm.id_to_piece(4) == "<unk>" and spm.unk_id == 0 not in ids
    assert spm.decode(ids) == text
    assert spm.id_to_piece(0) == "<unk_char>" and spm.decode(spm.encode("a € b")) == "a  \u2047  b"


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


def test_training_is_reproducible(corpus, tmp_path):
    path, _ = corpus
    a = train_tokenizer("sentencepiece", str(path), str(tmp_path / "a"), vocab_size=70, model_type="bpe")
    b = train_tokenizer("sentencepiece", str(path), str(tmp_path / "b"), vocab_size=70, model_type="bpe")
    assert a.fingerprint() == b.fingerprint()


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


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_corpus_too_small_names_the_largest_size_that_works(tmp_path, model_type):
    path = tmp_path / "data" / "small.txt"
    _corpus(path, lines=30)
    folder = tmp_path / "run"
    with pytest.raises(DataError, match=r"vocab_size 5000 failed: Vocabulary size too high") as info:
        train_tokenizer("sentencepiece", str(path), str(folder), vocab_size=5000,
                        model_type=model_type)
    message = str(info.value)
    assert "--vocab_size" in message and str(path) in message
    largest = int(message.split("the largest vocab_size that works is ")[1].split(":")[0])
    assert not folder.exists()  # the failed call leaves no trace of the folder it made
    # The size the message names does work.
    assert train_tokenizer("sentencepiece", str(path), str(folder), vocab_size=largest,
                           model_type=model_type).vocab_size == largest


def test_vocabulary_below_the_alphabet_names_the_smallest_size(tmp_path):
    path = tmp_path / "abc.txt"
    path.write_text("abcdefghijklmnop qrstuvwxyz\n" * 20)
    with pytest.raises(DataError, match=r"vocab_size 10 failed: .* set vocab_size "
                                        r"\(--vocab_size\) to at least (\d+)") as info:
        train_tokenizer("sentencepiece", str(path), str(tmp_path / "run"), vocab_size=10)
    smallest = int(str(info.value).rsplit(" ", 1)[1])
    assert train_tokenizer("sentencepiece", str(path), str(tmp_path / "run"),
                           vocab_size=smallest).vocab_size == smallest


@pytest.mark.parametrize("name", ["word", "char", "sentencepiece"])
def test_bad_training_file_is_checked_first(tmp_path, name):
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"\x00\x01\x02" * 100)
    with pytest.raises(DataError, match=r"train_file .*model.bin' is a binary file"):
        train_tokenizer(name, str(binary), str(tmp_path / "run"), vocab_size=50)
    with pytest.raises(DataError, match=r"train_file .*missing.txt' does not exist"):
        train_tokenizer(name, str(tmp_path / "missing.txt"), str(tmp_path / "run"), vocab_size=50)
    assert not (tmp_path / "run").exists()


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


def _saved(corpus, tmp_path, name="char", **options):
    path, _ = corpus
    folder = tmp_path / "run"
    train_tokenizer(name, str(path), str(folder), **options)
    return folder


def test_load_errors_name_the_file_and_the_fix(corpus, tmp_path):
    with pytest.raises(DataError, match=r"'.*nowhere' holds no tokenizer .* train_tokenizer"):
        load_tokenizer(str(tmp_path / "nowhere"))
    folder = _saved(corpus, tmp_path)
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


def test_missing_sentencepiece_model_is_named(corpus, tmp_path):
    folder = _saved(corpus, tmp_path, "sentencepiece", vocab_size=60)
    (folder / "spm.model").unlink()
    with pytest.raises(DataError, match=r"sentencepiece tokenizer that cannot be read: .*spm.model"):
        load_tokenizer(str(folder))


def test_decode_rejects_ids_out_of_range():
    with pytest.raises(DataError, match=r"id 260 is out of range for the byte tokenizer of 260 ids"):
        ByteTokenizer().decode([5, 260])
    tok = WordTokenizer(Vocab.build(["a b"]))
    with pytest.raises(DataError, match=r"id -1 is out of range for the word tokenizer of 6 ids"):
        tok.decode([-1])
    with pytest.raises(DataError, match=r"encode takes a str, got bytes"):
        tok.encode(b"a b")


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
