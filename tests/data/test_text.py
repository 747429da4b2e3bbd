"""Any-corpus text (lmkit.data.text): TextCorpus, sentence batches."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from lmkit.data import (
    DataError,
    LineBatching,
    TextCorpus,
    Vocab,
    WordTokenizer,
    bptt_arrays,
    sentence_dataset,
)
from tests.data import samples


# --- TextCorpus ----------------------------------------------------------------------------------
def test_word_level_corpus_stream_and_lines(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text("a b c\n\n  b a \nd\n", encoding="utf-8")  # a blank line is skipped
    corpus = TextCorpus.word_level(str(path))
    vocab = corpus.tokenizer.vocab
    assert vocab.tokens == ("<unk>", "<eos>", "<bos>", "<pad>", "a", "b", "c", "d")
    lines = corpus.encode_lines(str(path))
    assert [x.tolist() for x in lines] == [[4, 5, 6, 1], [5, 4, 1], [7, 1]]
    assert all(x.dtype == np.int32 for x in lines)
    stream = corpus.encode_stream(str(path))
    np.testing.assert_array_equal(stream, [4, 5, 6, 1, 5, 4, 1, 7, 1])
    with_bos = TextCorpus(corpus.tokenizer, add_bos=True, add_eos=False)
    assert [x.tolist() for x in with_bos.encode_text_lines(["a zz"])] == [[2, 4, 0]]
    # eos reads as a line break, bos and pad vanish (a deliberate change: readable text).
    assert corpus.tokenizer.decode([2, 4, 5, 1, 6, 3]) == "a b\nc"
    # The stream feeds the BPTT batcher directly.
    x, y = bptt_arrays(stream, batch_size=2, num_steps=2)
    np.testing.assert_array_equal(x[0], [[4, 5], [5, 4]])


def test_subword_corpus_lines_end_with_eos(tmp_path):
    lines = samples.subword_corpus(tmp_path / "train.txt", lines=200)
    corpus = TextCorpus.subword(str(tmp_path / "train.txt"), 60, model_prefix=str(tmp_path / "m"),
                                model_type="bpe")
    encoded = corpus.encode_lines(str(tmp_path / "train.txt"))
    assert len(encoded) == len(lines) and corpus.vocab_size == 60
    for text, ids in zip(lines[:20], encoded):
        assert ids[-1] == corpus.tokenizer.eos_id
        assert corpus.tokenizer.decode(ids[:-1]) == text


def test_corpus_errors(tmp_path):
    vocab = Vocab.build(["a"], eos_token=None, bos_token=None)
    with pytest.raises(ValueError, match=r"add_eos = True but the tokenizer has no eos token"):
        TextCorpus(WordTokenizer(vocab))
    corpus = TextCorpus(WordTokenizer(Vocab.build(["a"])))
    (tmp_path / "blank.txt").write_text("\n \n")
    with pytest.raises(DataError, match=r"blank.txt' is empty"):
        corpus.encode_lines(str(tmp_path / "blank.txt"))
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.txt' is not UTF-8"):
        corpus.encode_stream(str(tmp_path / "latin1.txt"))
    with pytest.raises(DataError, match=r"missing.txt' does not exist"):
        corpus.encode_lines(str(tmp_path / "missing.txt"))


# --- sentence_dataset ----------------------------------------------------------------------------
def _lines(count=40, seed=0):
    rng = np.random.default_rng(seed)
    # Distinct first ids, so that every row names its line.
    return [np.concatenate([[100 + i], rng.integers(4, 90, size=rng.integers(0, 11))]).astype(np.int32)
            for i in range(count)]


def _collect(dataset):
    return [(ids.numpy(), lengths.numpy()) for ids, lengths in dataset]


def _check_padding(batch, lengths, lines, pad_id):
    """Every row is its line followed by pad_id up to the batch width."""
    for row, n in zip(batch, lengths):
        line = lines[row[0] - 100]
        assert n == line.size
        np.testing.assert_array_equal(row[:n], line)
        assert (row[n:] == pad_id).all()


def test_unshuffled_batches_are_lines_in_order_padded():
    lines = _lines(10)
    batches = _collect(sentence_dataset(lines, 4, batching=LineBatching(shuffle=False, pad_id=-7)))
    assert len(batches) == 2  # 10 // 4, the last 2 lines dropped
    for k, (ids, lengths) in enumerate(batches):
        assert ids.dtype == np.int32 and lengths.dtype == np.int32
        assert ids.shape == (4, max(line.size for line in lines[4 * k:4 * k + 4]))
        np.testing.assert_array_equal(ids[:, 0], 100 + np.arange(4 * k, 4 * k + 4))
        _check_padding(ids, lengths, lines, -7)
    last = _collect(sentence_dataset(lines, 4, batching=LineBatching(shuffle=False, drop_remainder=False)))[-1]
    assert last[0].shape[0] == 2


@pytest.mark.parametrize("buckets", [None, [4, 8]])
@pytest.mark.parametrize("size", [2, 4])
def test_rank_shards_reassemble_the_global_batch(buckets, size):
    lines = _lines(48, seed=size)
    batching = LineBatching(shuffle=True, seed=5, bucket_boundaries=buckets, pad_id=0)
    kwargs = dict(batch_size=8, epoch=3, batching=batching)
    global_batches = _collect(sentence_dataset(lines, **kwargs))
    shards = [_collect(sentence_dataset(lines, rank=r, size=size, **kwargs)) for r in range(size)]
    assert global_batches and all(len(s) == len(global_batches) for s in shards)
    seen = []
    for k, (ids, lengths) in enumerate(global_batches):
        parts = [shards[r][k] for r in range(size)]
        assert all(p[0].shape == (8 // size, ids.shape[1]) for p in parts)  # same width on all ranks
        np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), ids)
        np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), lengths)
        _check_padding(ids, lengths, lines, 0)
        if buckets is not None:  # one bucket per batch: [0, 4), [4, 8) or [8, inf)
            assert len({int(np.searchsorted(buckets, n, side="right")) for n in lengths}) == 1
        seen.extend(ids[:, 0].tolist())
    assert len(set(seen)) == len(seen)  # no line twice in an epoch
    if buckets is None:
        assert sorted(seen) == list(range(100, 148))  # 48 lines = 6 full batches


def test_shuffle_is_seeded_and_changes_with_epoch():
    lines = _lines(32)

    def order(seed, epoch):
        dataset = sentence_dataset(lines, 8, epoch=epoch, batching=LineBatching(seed=seed))
        return np.concatenate([ids[:, 0] for ids, _ in _collect(dataset)])

    a = order(seed=1, epoch=0)
    np.testing.assert_array_equal(a, order(seed=1, epoch=0))
    assert sorted(a.tolist()) == list(range(100, 132))
    assert not np.array_equal(a, order(seed=1, epoch=1))
    assert not np.array_equal(a, order(seed=2, epoch=0))
    # TensorFlow's global seed (which ranks may set differently) does not matter.
    tf.random.set_seed(99)
    np.testing.assert_array_equal(a, order(seed=1, epoch=0))


def test_sentence_dataset_in_tf_function():
    lines = _lines(16)
    dataset = sentence_dataset(lines, 4, rank=1, size=2, batching=LineBatching(seed=3))
    expected = sum(int(ids.sum()) + 1000 * int(n.sum()) for ids, n in _collect(dataset))

    @tf.function
    def checksum(ds):
        total = tf.constant(0, tf.int64)
        for ids, n in ds:
            total += tf.reduce_sum(tf.cast(ids, tf.int64)) + 1000 * tf.reduce_sum(tf.cast(n, tf.int64))
        return total

    assert int(checksum(dataset)) == expected


def test_max_length_truncates():
    lines = [np.arange(100, 120, dtype=np.int32), np.arange(200, 203, dtype=np.int32)]
    ids, lengths = _collect(sentence_dataset(lines, 2, batching=LineBatching(shuffle=False, max_length=5)))[0]
    np.testing.assert_array_equal(lengths, [5, 3])
    np.testing.assert_array_equal(ids[0], np.arange(100, 105))


def test_sentence_dataset_errors():
    lines = _lines(8)
    with pytest.raises(DataError, match=r"^batch_size 4 is not divisible by 3 workers; use a multiple of 3$"):
        sentence_dataset(lines, 4, rank=0, size=3)
    with pytest.raises(DataError, match=r"drop_remainder = False with 2 workers"):
        sentence_dataset(lines, 4, rank=0, size=2, batching=LineBatching(drop_remainder=False))
    with pytest.raises(DataError, match=r"8 lines are too few for one batch of batch_size 16"):
        sentence_dataset(lines, 16)
    with pytest.raises(DataError, match=r"strictly increasing"):
        sentence_dataset(lines, 4, batching=LineBatching(bucket_boundaries=[5, 3]))
    with pytest.raises(DataError, match=r"ids_per_line\[1\] must be a 1-D integer sequence"):
        sentence_dataset([[1, 2], [[1], [2]]], 1)
