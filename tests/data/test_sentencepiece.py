"""SentencePiece subwords (lmkit.data.sentencepiece): training, reuse, the special pieces, a sample of a
large text, and errors that name the vocab_size that works."""
import os

import pytest

from lmkit.data import DataError, SentencePieceTokenizer, load_tokenizer, train_sentencepiece, train_tokenizer
from lmkit.data import sentencepiece as spm_module
from tests.data import samples


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_sentencepiece_round_trip_and_specials(tmp_path, model_type):
    (tmp_path / "data").mkdir()
    lines = samples.subword_corpus(tmp_path / "data" / "train.txt")
    model = train_sentencepiece(str(tmp_path / "data" / "train.txt"), 80,
                                str(tmp_path / "run" / "spm"), model_type=model_type)
    assert model == os.path.join(str(tmp_path), "run", "spm.model")
    assert sorted(os.listdir(tmp_path / "run")) == ["spm.model", "spm.vocab"]
    assert os.listdir(tmp_path / "data") == ["train.txt"]  # nothing written beside the data
    tok = SentencePieceTokenizer(model)
    assert tok.vocab_size == len(tok) == 80
    assert (tok.unk_id, tok.bos_id, tok.eos_id, tok.pad_id) == (0, 1, 2, 3)
    for line in lines[:50] + ["abc zyx", "unseen qqqq words"]:
        ids = tok.encode(line)
        assert all(0 <= i < 80 for i in ids) and len(ids) >= len(line.split())
        assert tok.decode(ids) == line
    assert tok.encode_batch(lines[:3]) == [tok.encode(t) for t in lines[:3]]
    assert tok.encode("ÆØ") and tok.unk_id in tok.encode("ÆØ")  # characters never seen


def test_sentencepiece_cache_is_reused_and_refreshed(tmp_path, monkeypatch):
    data = tmp_path / "train.txt"
    samples.subword_corpus(data)
    prefix = str(tmp_path / "models" / "spm")
    model = train_sentencepiece(str(data), 60, model_prefix=prefix)
    assert model == prefix + ".model"
    stamp = os.stat(model).st_mtime_ns
    fingerprint = SentencePieceTokenizer(model).fingerprint()

    calls = []
    real_train = spm_module._import_sentencepiece().SentencePieceTrainer.train
    spm_trainer = spm_module._import_sentencepiece().SentencePieceTrainer

    def counting_train(*args, **kwargs):
        calls.append(kwargs["vocab_size"])
        return real_train(*args, **kwargs)

    monkeypatch.setattr(spm_trainer, "train", counting_train)
    assert train_sentencepiece(str(data), 60, model_prefix=prefix) == model
    assert calls == [] and os.stat(model).st_mtime_ns == stamp  # cached: not retrained

    # A different vocab_size at the same prefix retrains.
    train_sentencepiece(str(data), 70, model_prefix=prefix)
    assert calls == [70] and SentencePieceTokenizer(model).vocab_size == 70
    # Data newer than the model retrains.
    train_sentencepiece(str(data), 60, model_prefix=prefix)
    future = os.stat(model).st_mtime_ns + 10**9
    os.utime(data, ns=(future, future))
    train_sentencepiece(str(data), 60, model_prefix=prefix)
    assert calls == [70, 60, 60]
    assert SentencePieceTokenizer(model).fingerprint() == fingerprint  # deterministic training
    assert not [f for f in os.listdir(tmp_path / "models") if ".tmp" in f]


def test_sentencepiece_errors(tmp_path):
    samples.subword_corpus(tmp_path / "train.txt", lines=20)
    prefix = str(tmp_path / "run" / "spm")
    with pytest.raises(DataError, match=r"vocab_size 5000 failed: .*Vocabulary size too high"):
        train_sentencepiece(str(tmp_path / "train.txt"), 5000, prefix)
    assert not [f for f in os.listdir(tmp_path / "run") if f.endswith(".model")]
    with pytest.raises(DataError, match=r"training file .*nope.txt' does not exist"):
        train_sentencepiece(str(tmp_path / "nope.txt"), 50, prefix)
    with pytest.raises(ValueError, match=r"unknown sentencepiece model_type 'word'; "
                                         r"choices: unigram, bpe"):
        train_sentencepiece(str(tmp_path / "train.txt"), 50, prefix, model_type="word")
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"not a model")
    with pytest.raises(DataError, match=r"is not a SentencePiece model"):
        SentencePieceTokenizer(str(bad))


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_sentencepiece_keeps_the_unknown_word_mark_of_ptb_and_wikitext_as_one_piece(tmp_path, model_type):
    """WikiText and PTB write <unk> for rare words. SentencePiece reserves that string for its own unknown piece:
    given it as text, it split the mark into 5 pieces and, with a small vocabulary, left '>' out (every mark
    decoded as '<unk ⁇'). Trained here, the mark is one piece (id 4) that decodes back to itself, and
    SentencePiece's unknown piece (a character it never saw) is id 0, <unk_char>."""
    path = tmp_path / "train.txt"
    lines = samples.lexicon_lines(path)
    path.write_text("\n".join(" <unk> ".join(line.split(" ", 1)) for line in lines) + "\n", encoding="utf-8")
    assert ">" not in path.read_text(encoding="utf-8").replace("<unk>", "")  # '>' only inside the marks
    spm = train_tokenizer("sentencepiece", str(path), str(tmp_path / "spm"), vocab_size=70, model_type=model_type)
    text = lines[0].split(" ", 1)[0] + " <unk> ab"
    ids = spm.encode(text)
    assert ids.count(4) == 1 and spm.id_to_piece(4) == "<unk>" and spm.unk_id == 0 not in ids
    assert spm.decode(ids) == text
    assert spm.id_to_piece(0) == "<unk_char>" and spm.decode(spm.encode("a € b")) == "a  \u2047  b"


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_corpus_too_small_names_the_largest_size_that_works(tmp_path, model_type):
    path = tmp_path / "data" / "small.txt"
    samples.lexicon_lines(path, lines=30)
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


def test_missing_sentencepiece_model_is_named(corpus, tmp_path):
    folder = samples.saved_tokenizer(corpus, tmp_path, "sentencepiece", vocab_size=60)
    (folder / "spm.model").unlink()
    with pytest.raises(DataError, match=r"sentencepiece tokenizer that cannot be read: .*spm.model"):
        load_tokenizer(str(folder))


def test_training_is_reproducible(corpus, tmp_path):
    path, _ = corpus
    a = train_tokenizer("sentencepiece", str(path), str(tmp_path / "a"), vocab_size=70, model_type="bpe")
    b = train_tokenizer("sentencepiece", str(path), str(tmp_path / "b"), vocab_size=70, model_type="bpe")
    assert a.fingerprint() == b.fingerprint()


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
