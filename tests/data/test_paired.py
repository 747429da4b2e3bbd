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


def _pair_files(tmp_path):
    """Pairs with an empty side, a whitespace-only side, CRLF ends, a long pair and no final line end."""
    source = ["a b c", "", "d e\r", "  ", "a a a a a a a a a", "e", "b c d", "c"]
    target = ["c b a", "x", "e d", "y y", "a", "\t", "d c b\r", "c c"]
    (tmp_path / "s.txt").write_bytes("\n".join(source).encode())  # no line end after the last line
    (tmp_path / "t.txt").write_bytes(("\n".join(target) + "\n").encode())
    return str(tmp_path / "s.txt"), str(tmp_path / "t.txt")


@pytest.mark.parametrize("kind", ["word", "char", "byte"])
@pytest.mark.parametrize("workers", [1, 2])
def test_pairs_from_the_line_cache_equal_the_pairs_encoded_in_memory(tmp_path, monkeypatch, kind, workers):
    from lmkit.data import encoding_pool, token_cache
    from lmkit.data.paired import LineRows, pairs_from_lines
    from lmkit.data.tokenizers import train_tokenizer
    source_path, target_path = _pair_files(tmp_path)
    tokenizer = train_tokenizer(kind, [source_path, target_path], tmp_path / "tok")
    monkeypatch.setattr(encoding_pool, "BLOCK_BYTES", 8)  # a block or two per line: the lines cross blocks
    want = encode_pairs(*read_pairs(source_path, target_path), tokenizer.encode, tokenizer.encode,
                        max_source_length=6, max_target_length=6)
    log = []
    sides = [token_cache.cached_lines(str(tmp_path / "cache"), tokenizer, path, what="source_file",
                                      workers=workers, log=log.append) for path in (source_path, target_path)]
    assert any(line.startswith("encoding source_file") for line in log) and not sides[0].reused
    assert sides[0].lines == sides[1].lines == 8
    got = pairs_from_lines(*sides, source_path=source_path, target_path=target_path,
                           max_source_length=6, max_target_length=6)
    assert isinstance(got.source, LineRows) and got.report == want.report
    assert got.report.empty == 3 and got.report.too_long == 1  # lines 2, 4 and 6; line 5
    assert [s.tolist() for s in got.source] == [s.tolist() for s in want.source]
    assert [t.tolist() for t in got.target] == [t.tolist() for t in want.target]
    for mine, theirs in zip(got.lengths(), want.lengths()):
        np.testing.assert_array_equal(mine, theirs)
    assert got.source[0].dtype == np.int32
    # A second look maps the same files; another limit needs no new encoding.
    again = token_cache.cached_lines(str(tmp_path / "cache"), tokenizer, source_path, what="source_file",
                                     log=log.append)
    assert again.reused and again.folder == sides[0].folder
    wider = encode_pairs(*read_pairs(source_path, target_path), tokenizer.encode, tokenizer.encode,
                         max_source_length=20, max_target_length=20)
    assert len(wider) == 5 and pairs_from_lines(again, sides[1], source_path=source_path, target_path=target_path,
                                                max_source_length=20, max_target_length=20).report == wider.report
    # The line caches and the streams of the same text are different folders.
    stream = token_cache.cached_stream(str(tmp_path / "cache"), tokenizer, [source_path], False, what="x")
    assert stream.folder != sides[0].folder


def test_pairs_from_lines_check_counts_as_read_pairs(tmp_path):
    from lmkit.data import token_cache
    from lmkit.data.paired import check_pair_files, count_lines, pairs_from_lines
    from lmkit.data.tokenizers import train_tokenizer
    source_path, target_path = _pair_files(tmp_path)
    assert count_lines(source_path, "source") == count_lines(target_path, "target") == 8
    short = tmp_path / "short.txt"
    short.write_text("a\nb\n")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    for path in (short, empty):
        with pytest.raises(DataError) as read_error:
            read_pairs(source_path, str(path))
        with pytest.raises(DataError) as count_error:
            check_pair_files(source_path, str(path))
        assert str(read_error.value) == str(count_error.value)
    tokenizer = train_tokenizer("word", [source_path], tmp_path / "tok")
    root = str(tmp_path / "cache")
    lines = [token_cache.cached_lines(root, tokenizer, p, what="source_file") for p in (source_path, short)]
    with pytest.raises(DataError, match="has 8 lines but target_file .* has 2; the files must be line-aligned"):
        pairs_from_lines(*lines, source_path=source_path, target_path=str(short), max_source_length=9,
                         max_target_length=9)
    blank = tmp_path / "blank.txt"
    blank.write_text(" \n" * 8)
    blanks = token_cache.encode_lines_to_cache(root, tokenizer, str(blank))  # cached_lines refuses it sooner
    with pytest.raises(DataError, match=r"no pair is left \(kept 0 pairs; skipped 8 with an empty side"):
        pairs_from_lines(lines[0], blanks, source_path=source_path, target_path=str(blank), max_source_length=9,
                         max_target_length=9)
