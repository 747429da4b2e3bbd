"""lmkit.data.packing: cutting examples to the context, packed rows with segments and restarting positions, padded
rows with length buckets, and sharding as a pure function of (rank, size)."""
import numpy as np
import pytest

from lmkit.data.chat import Example
from lmkit.data.errors import DataError
from lmkit.data.packing import FitReport, PackedBatches, PackLayout, PaddedBatches, fit_examples, pack_groups, rows_of


def example(ids, weights):
    return Example(np.asarray(ids, np.int32), np.asarray(weights, np.uint8))


def random_examples(count, seed=0, longest=12):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        length = int(rng.integers(2, longest + 1))
        weights = (rng.random(length) < 0.5).astype(np.uint8)
        weights[-1] = 1  # at least one target
        out.append(example(rng.integers(1, 50, length), weights))
    return out


def test_a_long_example_keeps_its_start_and_one_without_a_target_left_is_dropped():
    kept, report = fit_examples([example([1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 1, 1]),  # cut to 4: keeps targets
                                 example([1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 1, 1]),  # cut to 4: none left
                                 example([7, 8], [0, 1]), example([9], [1]),  # fits; nothing to predict
                                 example([1, 2, 3], [1, 0, 0])], max_length=4)  # the first id is never a target
    assert [list(e.ids) for e in kept] == [[1, 2, 3, 4], [7, 8]]
    assert list(kept[0].weights) == [0, 0, 1, 1] and isinstance(kept[0], Example)
    assert report == FitReport(kept=2, cut=1, dropped=3)
    assert report.lines("train_file", 4) == ["train_file: 4 examples are longer than 4 tokens: 1 cut at the end, "
                                             "3 dropped (no assistant token left)"]
    assert fit_examples([example([1, 2], [0, 1])], 4)[1].lines("x", 4) == []
    with pytest.raises(DataError, match=r"max_length = 1 must be an integer >= 2"):
        fit_examples([], 1)


def test_rows_restart_positions_per_example_and_no_target_crosses_a_boundary():
    examples = [example([1, 2, 3], [0, 1, 1]), example([4, 5], [0, 1]), example([6, 7, 8, 9], [1, 0, 1, 1])]
    rows = rows_of(examples, [[0, 1], [2]], num_steps=6, pad_id=-1)
    np.testing.assert_array_equal(rows.inputs, [[1, 2, 3, 4, 5, -1], [6, 7, 8, 9, -1, -1]])
    np.testing.assert_array_equal(rows.targets, [[2, 3, 4, 5, -1, -1], [7, 8, 9, -1, -1, -1]])
    np.testing.assert_array_equal(rows.segment_ids, [[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 0, 0]])
    np.testing.assert_array_equal(rows.positions, [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 0]])
    # 3 -> 4 is example 1's last input predicting example 2's first id: weight 0; padding weighs 0
    np.testing.assert_array_equal(rows.weights, [[1, 1, 0, 1, 0, 0], [0, 1, 1, 0, 0, 0]])
    assert rows.weights.dtype == np.float32 and rows.inputs.dtype == np.int32


def test_packing_fills_the_first_open_row_with_room():
    assert pack_groups([5, 4, 3, 2, 1], length=6, order=[0, 1, 2, 3, 4]) == [[0, 4], [1, 3], [2]]
    assert pack_groups([5, 4, 3, 2, 1], length=6, order=[0, 1, 2, 3, 4], open_rows=1) == [[0], [1], [2, 3, 4]]
    assert pack_groups([3, 3, 3], length=6, order=[2, 0, 1]) == [[2, 0], [1]]


def test_every_example_lands_once_with_its_targets_and_the_shards_stack_to_the_global_batch():
    examples = random_examples(60)
    batches = PackedBatches(examples, batch_size=4, num_steps=16, epoch=1, seed=3)
    groups = [index for batch in batches.groups for row in batch for index in row]
    assert len(groups) == len(set(groups)) and len(batches) == len(batches.groups)
    total = sum(float(e.weights[1:].sum()) for i, e in enumerate(examples) if i in set(groups))
    assert sum(float(batches[i].weights.sum()) for i in range(len(batches))) == total
    assert [float(batches[i].weights.sum()) for i in range(len(batches))] == list(batches.weighted_tokens)
    assert batches[0].inputs.shape == (4, 16) and 0.5 < batches.fill <= 1.0
    for size in (2, 4):
        shards = [PackedBatches(examples, 4, 16, epoch=1, seed=3, rank=r, size=size) for r in range(size)]
        for i in range(len(batches)):
            for field, whole in zip(batches[i]._fields, batches[i]):
                np.testing.assert_array_equal(np.concatenate([getattr(s[i], field) for s in shards]), whole)
            assert all(s.weighted_tokens[i] == batches.weighted_tokens[i] for s in shards)
    again = PackedBatches(examples, 4, 16, epoch=1, seed=3)
    other = PackedBatches(examples, 4, 16, epoch=2, seed=3)
    assert again.groups == batches.groups and other.groups != batches.groups


def test_the_packed_rows_hold_each_example_as_it_is():
    examples = random_examples(20, seed=1)
    batches = PackedBatches(examples, batch_size=2, num_steps=16, epoch=0, seed=0, shuffle=False, pad_id=0)
    for i in range(len(batches)):
        rows = batches[i]
        for r, group in enumerate(batches.groups[i]):
            at = 0
            for segment, index in enumerate(group, 1):
                ids, weights = examples[index]
                n = len(ids)
                assert at + n <= 17  # a row holds num_steps + 1 ids
                np.testing.assert_array_equal(rows.inputs[r, at:at + n - 1], ids[:-1])
                np.testing.assert_array_equal(rows.targets[r, at:at + n - 1], ids[1:])
                np.testing.assert_array_equal(rows.weights[r, at:at + n - 1], weights[1:])
                np.testing.assert_array_equal(rows.positions[r, at:at + n - 1], np.arange(n - 1))
                assert (rows.segment_ids[r, at:at + n - 1] == segment).all()
                at += n


def test_padded_batches_bucket_lengths_and_pads_weigh_nothing():
    examples = random_examples(40, seed=2, longest=30)
    batches = PaddedBatches(examples, batch_size=4, num_steps=32, epoch=0, seed=5)
    lengths = set()
    for i in range(len(batches)):
        rows = batches[i]
        longest = max(len(examples[row[0]].ids) for row in batches.groups[i])
        assert rows.inputs.shape[1] >= longest - 1 and rows.inputs.shape[1] in (8, 16, 24, 32)
        lengths.add(rows.inputs.shape[1])
        assert (rows.weights[rows.segment_ids == 0] == 0).all()
        assert set(np.unique(rows.segment_ids)) <= {0, 1}
        assert float(rows.weights.sum()) == batches.weighted_tokens[i]
    assert len(lengths) > 1
    halves = [PaddedBatches(examples, 4, 32, epoch=0, seed=5, rank=r, size=2) for r in range(2)]
    np.testing.assert_array_equal(np.concatenate([h[3].inputs for h in halves]), batches[3].inputs)


def test_examples_that_do_not_fit_or_make_no_batch_are_refused():
    with pytest.raises(DataError, match=r"an example of 9 ids does not fit a row of 5 \(num_steps \+ 1\); cut the "
                                        r"examples first"):
        PackedBatches([example(range(9), [1] * 9)], 1, 4, epoch=0, seed=0)
    with pytest.raises(DataError, match=r"the examples make 1 packed rows, too few for one batch of batch_size 2"):
        PackedBatches([example([1, 2], [0, 1])], 2, 4, epoch=0, seed=0)
    with pytest.raises(DataError, match=r"1 examples make no batch of batch_size 2"):
        PaddedBatches([example([1, 2], [0, 1])], 2, 4, epoch=0, seed=0)
    with pytest.raises(DataError, match=r"batch_size 3 is not divisible by 2 workers"):
        PackedBatches(random_examples(10), 3, 16, epoch=0, seed=0, size=2, rank=0)


def test_an_evaluation_reads_every_example_once_in_length_buckets():
    from lmkit.data.packing import eval_rows
    examples = random_examples(11, seed=3, longest=30)
    batches = list(eval_rows(examples, batch_size=4, num_steps=32))
    assert len(batches) == 3 and all(rows.inputs.shape[0] == 4 for rows in batches)
    assert sum(float(rows.weights.sum()) for rows in batches) == sum(float(e.weights[1:].sum()) for e in examples)
    # a row's ids are its first input, then its targets, then padding (0: no example holds it)
    rows = [tuple(int(i) for i in np.concatenate([b.inputs[r, :1], b.targets[r]]) if i) for b in batches
            for r in range(4) if b.segment_ids[r].any()]
    assert sorted(rows) == sorted(tuple(int(i) for i in e.ids) for e in examples)
    assert {rows.inputs.shape[1] for rows in batches} <= {8, 16, 24, 32}
    assert not batches[-1].segment_ids[-1].any()  # the last batch filled up with empty rows


def test_fitting_a_memory_mapped_set_keeps_it_mapped(tmp_path):
    from lmkit.data.examples import ExampleSet
    flat = ExampleSet.of(random_examples(20, seed=4))
    flat.ids.tofile(tmp_path / "ids")
    mapped = ExampleSet(np.memmap(tmp_path / "ids", np.int32, "r"), flat.weights, flat.starts, flat.lengths)
    kept, report = fit_examples(mapped, 6)
    assert kept.ids is mapped.ids and report.kept == len(kept) and report.kept + report.dropped == 20
    lists, _ = fit_examples(list(flat), 6)
    assert [list(e.ids) for e in kept] == [list(e.ids) for e in lists]


def test_packed_rows_come_in_the_context_its_half_and_its_quarter():
    from lmkit.data.packing import window_lengths
    assert window_lengths(256) == (64, 128, 256)
    assert window_lengths(256, 1) == (256,) and window_lengths(256, 5) == (16, 32, 64, 128, 256)
    assert window_lengths(100) == (25, 50, 100) and window_lengths(48) == (24, 48) and window_lengths(16) == (16,)
    with pytest.raises(DataError, match=r"pack_windows = 0 must be a positive integer"):
        window_lengths(64, 0)


@pytest.mark.parametrize("share", [1.0, 2.0])
def test_each_example_goes_to_a_window_it_shares_or_a_longer_one_and_every_batch_holds_as_many_positions(share):
    examples = random_examples(400, seed=4, longest=48)
    batches = PackedBatches(examples, batch_size=4, num_steps=64, epoch=0, seed=1, layout=PackLayout(share=share))
    # at share 2 the shortest examples fill the longer rows' room, and the few left make no batch of their own
    assert set(batches.windows) == ({16, 32, 64} if share == 1 else {32, 64})
    seen = []
    for i in range(len(batches)):
        rows, window = batches[i], batches.windows[i]
        assert rows.inputs.shape == (4 * 64 // window, window)  # the same positions in every batch
        assert float(rows.weights.sum()) == batches.weighted_tokens[i]
        for group in batches.groups[i]:
            assert sum(len(examples[j].ids) for j in group) <= window + 1
            seen.extend(group)
    assert len(seen) == len(set(seen))
    lengths = {j: len(examples[j].ids) for j in seen}
    # an example sits in the shortest window whose row it fills at most 1/share of, or in a longer one: it
    # filled a longer row's room, or came from a window's last, partial batch
    in_window = {j: w for i, w in enumerate(batches.windows) for group in batches.groups[i] for j in group}
    wanted = {j: min([w for w in (16, 32) if lengths[j] * share <= w + 1] or [64]) for j in seen}
    assert all(in_window[j] >= wanted[j] for j in seen) and any(in_window[j] > wanted[j] for j in seen)
    left_out = set(range(len(examples))) - set(seen)
    assert sum(len(examples[j].ids) for j in left_out) <= 4 * 65  # less than one batch of the longest window
    assert 0.8 < batches.fill <= 1.0
    assert batches.windows != sorted(batches.windows)  # the windows' batches are shuffled together
    for size in (2, 4):  # each rank takes its rows of every global batch, whatever its window
        shards = [PackedBatches(examples, 4, 64, epoch=0, seed=1, rank=r, size=size, layout=PackLayout(share=share))
                  for r in range(size)]
        for i in range(len(batches)):
            for field, whole in zip(batches[i]._fields, batches[i]):
                np.testing.assert_array_equal(np.concatenate([getattr(s[i], field) for s in shards]), whole)


def test_the_room_left_in_a_row_takes_the_longest_example_that_fits():
    from lmkit.data.packing import top_up
    lengths = [6, 2, 3, 3, 1, 5]
    groups = [[0], [5]]  # rooms of 4 and 5 in rows of 10
    left = top_up(groups, lengths, 10, [1, 2, 3, 4])
    assert groups == [[0, 2, 4], [5, 3, 1]] and left == set()
    groups = [[0]]
    assert top_up(groups, lengths, 7, [2, 4]) == {2} and groups == [[0, 4]]


def test_one_window_packs_every_row_to_the_context_in_the_shuffled_order():
    examples = random_examples(300, seed=4, longest=64)
    batches = PackedBatches(examples, batch_size=4, num_steps=64, epoch=2, seed=1, layout=PackLayout(windows=1))
    order = np.random.default_rng([1, 2]).permutation(300)
    groups = pack_groups([len(e.ids) for e in examples], 65, order)
    assert batches.groups == [groups[s:s + 4] for s in range(0, len(groups) // 4 * 4, 4)]
    assert set(batches.windows) == {64} and batches[0].inputs.shape == (4, 64)


def test_the_cheapest_packing_weighs_shorter_windows_against_emptier_rows():
    from lmkit.data.packing import cheapest_packing
    examples = random_examples(300, seed=4, longest=64)

    def flat(window):  # attention costs nothing: the fullest rows win
        return 1.0

    def steep(window):  # a position of a long window costs far more: short windows win
        return float(window) ** 2

    layouts = [PackLayout(windows=1)] + [PackLayout(3, s) for s in (1.0, 1.25, 1.5, 2.0)]
    positions = {layout: PackedBatches(examples, 4, 64, epoch=0, seed=1, layout=layout).cost(flat)
                 for layout in layouts}  # positions per id: 1 / fill, about
    assert cheapest_packing(examples, 4, 64, windows=3, seed=1, position_cost=flat) == min(layouts, key=positions.get)
    assert len(set(positions.values())) > 1
    chosen = cheapest_packing(examples, 4, 64, windows=3, seed=1, position_cost=steep)
    assert chosen.windows == 3
    costs = {s: PackedBatches(examples, 4, 64, epoch=0, seed=1, layout=PackLayout(share=s)).cost(steep)
             for s in (1.0, 1.25, 1.5, 2.0)}
    one = PackedBatches(examples, 4, 64, epoch=0, seed=1, layout=PackLayout(windows=1)).cost(steep)
    assert costs[chosen.share] == min(costs.values()) < one
    assert cheapest_packing(examples, 4, 64, windows=1, seed=1, position_cost=steep) == PackLayout(windows=1)
    assert cheapest_packing(examples, 4, 16, windows=3, seed=1, position_cost=steep) == PackLayout(windows=1)
