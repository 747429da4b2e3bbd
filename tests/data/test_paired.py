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
