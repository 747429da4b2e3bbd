"""Line-aligned pairs: alignment errors, counted skips, length-bucketed batches and rank sharding."""

import numpy as np
import pytest

from lmkit.data.errors import DataError
from lmkit.data.paired import bucketed_batches, encode_pairs, pad_rows, read_pairs, shard_rows


def _write(path, text):
    path.write_bytes(text.encode("utf-8"))
    return str(path)


def _encode(text):
    return [len(word) for word in text.split()]


def test_read_pairs_checks_alignment_and_keeps_inner_empty_lines(tmp_path):
    source = _write(tmp_path / "src.txt", "a b\r\n\nc d e\n")  # CRLF, an empty line, a final line end
    target = _write(tmp_path / "tgt.txt", "x\ny\nz")  # no final line end
    assert read_pairs(source, target) == (["a b", "", "c d e"], ["x", "y", "z"])
    short = _write(tmp_path / "short.txt", "x\ny\n")
    with pytest.raises(DataError, match=r"source_file \S+src.txt has 3 lines but target_file \S+short.txt has 2; "
                                        "the files must be line-aligned"):
        read_pairs(source, short)
    with pytest.raises(DataError, match="target_file .*missing.txt does not exist"):
        read_pairs(source, str(tmp_path / "missing.txt"))
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError, match="is not UTF-8 text"):
        read_pairs(str(tmp_path / "latin1.txt"), target)
    with pytest.raises(DataError, match="holds no lines"):
        read_pairs(_write(tmp_path / "empty.txt", ""), target)


def test_empty_sides_and_long_pairs_are_counted_and_named():
    source = ["a b", "", "c", "a b c d e", "d", "  ", "e f"]
    target = ["x", "y", "", "z", "w w w w", "v", "u"]
    pairs = encode_pairs(source, target, _encode, _encode, max_source_length=3, max_target_length=3)
    assert len(pairs) == 2 and [p.tolist() for p in pairs.source] == [[1, 1], [1, 1]]
    report = pairs.report
    assert (report.kept, report.empty, report.too_long) == (2, 3, 2)
    assert report.empty_lines == [2, 3, 6] and report.too_long_lines == [4, 5]
    assert report.summary("train") == ("kept 2 pairs of train; skipped 3 with an empty side (lines 2, 3, 6); "
                                       "skipped 2 longer than the limits (lines 4, 5)")
    with pytest.raises(DataError, match="no pair is left .*raise the length limits"):
        encode_pairs(["a b c"], ["x"], _encode, _encode, max_source_length=2, max_target_length=2)
    with pytest.raises(DataError, match="max_source_length = 0 must be a positive integer"):
        encode_pairs(["a"], ["x"], _encode, _encode, max_source_length=0, max_target_length=2)


def test_bucketed_batches_cover_each_pair_once_with_less_padding():
    rng = np.random.default_rng(0)
    source_lengths, target_lengths = rng.integers(1, 60, 1000), rng.integers(1, 60, 1000)
    batches = bucketed_batches(source_lengths, target_lengths, 16, epoch=0, seed=7, pool_batches=10)
    assert batches.shape == (62, 16)  # 1000 // 16 full batches
    assert len(np.unique(batches)) == batches.size  # no pair twice in an epoch
    np.testing.assert_array_equal(batches, bucketed_batches(source_lengths, target_lengths, 16, epoch=0, seed=7,
                                                            pool_batches=10))  # the same on every rank
    other = bucketed_batches(source_lengths, target_lengths, 16, epoch=1, seed=7, pool_batches=10)
    assert not np.array_equal(batches, other)  # another order every epoch

    def padding(b):
        return int(sum(source_lengths[rows].max() * len(rows) - source_lengths[rows].sum() for rows in b))

    shuffled = np.random.default_rng(1).permutation(1000)[:992].reshape(62, 16)
    assert padding(batches) < padding(shuffled) / 3  # sorted pools: rows of similar lengths
    with pytest.raises(DataError, match="3 pairs make no batch of batch_size 4"):
        bucketed_batches([1, 2, 3], [1, 2, 3], 4, epoch=0, seed=0)


def test_ranks_take_equal_disjoint_rows_that_stack_to_the_global_batch():
    batches = bucketed_batches(np.arange(1, 101), np.arange(1, 101), 12, epoch=3, seed=1)
    for batch in batches:
        shards = [shard_rows(batch, rank, 4) for rank in range(4)]
        assert all(len(s) == 3 for s in shards)
        np.testing.assert_array_equal(np.concatenate(shards), batch)
    with pytest.raises(DataError, match="batch_size 12 is not divisible by 5 workers"):
        shard_rows(batches[0], 0, 5)


def test_pad_rows_pads_to_the_longest_or_a_fixed_length():
    ids, lengths = pad_rows([np.array([3, 4]), np.array([5]), np.array([6, 7, 8])], pad_id=0)
    np.testing.assert_array_equal(ids, [[3, 4, 0], [5, 0, 0], [6, 7, 8]])
    np.testing.assert_array_equal(lengths, [2, 1, 3])
    assert pad_rows([np.array([1])], pad_id=9, length=4)[0].tolist() == [[1, 9, 9, 9]]
    with pytest.raises(DataError, match="a row of 3 ids does not fit length 2"):
        pad_rows([np.array([1, 2, 3])], pad_id=0, length=2)


def _pairs(lengths):
    from lmkit.data.paired import PairReport, Pairs
    rng = np.random.default_rng(5)
    sources = [rng.integers(4, 30, n).astype(np.int32) for n in lengths]
    targets = [rng.integers(4, 30, n + 1).astype(np.int32) for n in lengths]
    return Pairs(sources, targets, PairReport(kept=len(lengths)))



def _special():
    from lmkit.data.paired import SpecialIds
    return SpecialIds(bos=2, eos=1, pad=3)


def test_pair_batches_shard_the_global_batch_and_weigh_each_target_token_alike():
    from lmkit.data.paired import PAD_MULTIPLE, PairBatches
    pairs = _pairs(np.random.default_rng(0).integers(1, 20, 100))
    one = PairBatches(pairs, 8, _special(), epoch=2, seed=3)
    shards = [PairBatches(pairs, 8, _special(), epoch=2, seed=3, rank=r, size=4) for r in range(4)]
    assert len(one) == 12 and all(len(s) == 12 for s in shards)  # equal steps on every rank
    source_lengths, target_lengths = pairs.lengths()
    for i in range(len(one)):
        (source, mask, target_in), (target_out, weights) = one[i]
        parts = [s[i] for s in shards]
        # The ranks' rows, in rank order, are the single-process batch (padded to the same lengths).
        for k, whole in enumerate([source, mask, target_in]):
            np.testing.assert_array_equal(np.concatenate([p[0][k] for p in parts]), whole)
        for k, whole in enumerate([target_out, weights]):
            np.testing.assert_array_equal(np.concatenate([p[1][k] for p in parts]), whole)
        assert source.shape[1] % PAD_MULTIPLE == 0 and target_in.shape[1] % PAD_MULTIPLE == 0
        rows = one.index[i]
        assert source.shape[1] >= source_lengths[rows].max() and target_in.shape[1] >= target_lengths[rows].max() + 1
        # Inputs start with bos, outputs end with eos; every real position weighs batch / tokens.
        tokens = int(np.sum(target_lengths[rows] + 1))
        np.testing.assert_array_equal(target_in[:, 0], 2)
        for b, j in enumerate(rows):
            n = target_lengths[j]
            np.testing.assert_array_equal(target_in[b, 1:n + 1], pairs.target[j])
            np.testing.assert_array_equal(target_out[b, :n + 1], np.append(pairs.target[j], 1))
            assert mask[b].sum() == source_lengths[j] and np.all(source[b, ~mask[b]] == 3)
        np.testing.assert_allclose(weights[weights > 0], 8 / tokens, rtol=1e-6)
        # The mean over rows of the weighted sums is the mean over the batch's tokens.
        losses = np.random.default_rng(i).random(weights.shape)
        expected = np.sum(losses * (weights > 0)) / tokens
        np.testing.assert_allclose(np.mean(np.sum(losses * weights, axis=1)), expected, rtol=1e-6)
        np.testing.assert_allclose(np.mean([np.mean(np.sum(losses[r * 2:(r + 1) * 2] * weights[r * 2:(r + 1) * 2],
                                                           axis=1)) for r in range(4)]), expected, rtol=1e-6)
    assert one.tokens_per_step == pytest.approx(np.mean([np.sum(target_lengths[r] + 1) for r in one.index]))


def test_eval_pair_batches_read_every_pair_once_and_mask_the_filling():
    from lmkit.data.paired import eval_pair_batches
    pairs = _pairs([3, 1, 7, 2, 5])
    batches = list(eval_pair_batches(pairs, 2, _special()))
    assert len(batches) == 3 and all(b[0][0].shape[0] == 2 for b in batches)
    seen = []
    for (source, mask, target_in), (target_out, weights) in batches:
        for b in range(2):
            if weights[b].sum():
                seen.append(int(mask[b].sum()))
                assert weights[b].sum() == (target_out[b] != 3).sum()
    assert sorted(seen) == [1, 2, 3, 5, 7]  # each pair once (by its source length)
    assert batches[-1][1][1][1].sum() == 0  # the filling row weighs nothing
    assert sum(float(b[1][1].sum()) for b in batches) == sum(len(t) + 1 for t in pairs.target)


def test_special_ids_come_from_the_tokenizer_or_are_named_missing():
    from lmkit.data.paired import SpecialIds

    class NoStart:
        name, bos_id, eos_id, pad_id = "custom", None, 1, 0

    with pytest.raises(DataError, match="the custom tokenizer has no bos_id; an encoder-decoder's targets need"):
        SpecialIds.of(NoStart())
    NoStart.bos_id = 5
    assert SpecialIds.of(NoStart()) == SpecialIds(bos=5, eos=1, pad=0)


def test_padded_lengths_come_in_few_buckets_with_about_a_third_padding_at_most():
    from lmkit.data.paired import padded_length
    buckets = sorted({padded_length(n) for n in range(1, 1025)})
    assert buckets[:6] == [8, 16, 24, 32, 48, 72] and len(buckets) <= 14
    for n in range(1, 1025):
        b = padded_length(n)
        assert b >= n and b % 8 == 0 and (n <= 32 or (b - n) / b < 0.35)  # about a third, at most
