"""Shuffled windows for stateless models: sharding by (rank, size), per-epoch permutations."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from lmkit.data import DataError, bptt_dataset, num_window_batches, window_arrays

NUM_STEPS = 4
# Distinct values: each id names its stream position, each window its first position.
IDS = np.arange(1000, 1000 + 4 * 61 + 3)  # 61 windows of 4 (+1) and 2 spare ids


def _window_starts(inputs):
    """Stream position of the first input of every row: [num_batches, rows]."""
    return inputs[..., 0] - IDS[0]


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("per_rank", [1, 2, 3])
@pytest.mark.parametrize("epoch", [0, 7])
def test_ranks_together_are_exactly_the_global_batch(size, per_rank, epoch):
    batch_size = size * per_rank
    kwargs = dict(epoch=epoch, seed=11)
    single_x, single_y = window_arrays(IDS, batch_size, NUM_STEPS, **kwargs)
    steps = num_window_batches(IDS.size, batch_size, NUM_STEPS)
    assert steps == 61 // batch_size and single_x.shape == (steps, batch_size, NUM_STEPS)
    shards = [window_arrays(IDS, batch_size, NUM_STEPS, rank=r, size=size, **kwargs)
              for r in range(size)]
    for x, y in shards:  # the same number of steps on every rank
        assert x.shape == y.shape == (steps, per_rank, NUM_STEPS)
        assert x.dtype == y.dtype == np.int32
    # Rows stacked in rank order are the single-process batch, step by step.
    np.testing.assert_array_equal(np.concatenate([x for x, _ in shards], axis=1), single_x)
    np.testing.assert_array_equal(np.concatenate([y for _, y in shards], axis=1), single_y)
    # Disjoint: no window on two ranks, nor twice on one rank, in an epoch.
    starts = np.concatenate([_window_starts(x).ravel() for x, _ in shards])
    assert np.unique(starts).size == starts.size == steps * batch_size
    assert set((starts % NUM_STEPS).tolist()) == {0}  # windows start at multiples of num_steps


def test_windows_are_consecutive_ids_and_targets_are_shifted():
    x, y = window_arrays(IDS, 6, NUM_STEPS, epoch=2, seed=3)
    for row_x, row_y in zip(x.reshape(-1, NUM_STEPS), y.reshape(-1, NUM_STEPS)):
        start = row_x[0] - IDS[0]
        np.testing.assert_array_equal(row_x, IDS[start:start + NUM_STEPS])
        np.testing.assert_array_equal(row_y, IDS[start + 1:start + NUM_STEPS + 1])


def test_permutation_per_epoch_and_seed():
    def order(**kwargs):
        x, _ = window_arrays(IDS, 5, NUM_STEPS, **kwargs)
        return _window_starts(x).ravel()

    a = order(epoch=0, seed=1)
    np.testing.assert_array_equal(a, order(epoch=0, seed=1))  # same (seed, epoch): same batches
    assert not np.array_equal(a, order(epoch=1, seed=1))  # another epoch: another order
    assert not np.array_equal(a, order(epoch=0, seed=2))
    assert not np.array_equal(np.sort(a), a)  # shuffled
    tf.random.set_seed(1234)  # TensorFlow's seed (which ranks may set differently) does not matter
    np.testing.assert_array_equal(a, order(epoch=0, seed=1))
    # The permutation is numpy's default_rng([seed, epoch]) over all 61 windows; 60 are used.
    expected = np.random.default_rng([1, 0]).permutation(61)[:60] * NUM_STEPS
    np.testing.assert_array_equal(a, expected)


def test_unshuffled_windows_are_in_stream_order():
    x, y = window_arrays(np.arange(13), 2, 3, epoch=0, seed=0, shuffle=False)
    # 4 windows: [0..3], [3..6], [6..9], [9..12]; 2 batches of 2.
    np.testing.assert_array_equal(x, [[[0, 1, 2], [3, 4, 5]], [[6, 7, 8], [9, 10, 11]]])
    np.testing.assert_array_equal(y, x + 1)


def test_exactly_enough_ids_and_too_few():
    x, _ = window_arrays(np.arange(2 * 5 + 1), 2, 5, epoch=0, seed=0)
    assert x.shape == (1, 2, 5)
    assert num_window_batches(11, 2, 5) == 1 and num_window_batches(10, 2, 5) == 0
    with pytest.raises(DataError, match=r"^10 ids give 1 windows of num_steps 5, too few for one "
                                        r"batch of batch_size 2: that needs batch_size \* "
                                        r"num_steps \+ 1 = 11 ids; use a smaller batch_size or "
                                        r"num_steps, or more text$"):
        window_arrays(np.arange(10), 2, 5, epoch=0, seed=0)


def test_errors():
    with pytest.raises(DataError, match=r"^batch_size 10 is not divisible by 3 workers; "
                                        r"use a multiple of 3$"):
        window_arrays(IDS, 10, 4, epoch=0, seed=0, rank=0, size=3)
    with pytest.raises(DataError, match=r"rank = 3 is not in \[0, 3\)"):
        window_arrays(IDS, 9, 4, epoch=0, seed=0, rank=3, size=3)
    with pytest.raises(DataError, match=r"epoch = -1 must be an integer >= 0"):
        window_arrays(IDS, 2, 4, epoch=-1, seed=0)
    with pytest.raises(DataError, match=r"seed = 1.5 must be an integer >= 0"):
        window_arrays(IDS, 2, 4, epoch=0, seed=1.5)
    with pytest.raises(DataError, match=r"num_steps = 0 must be a positive integer"):
        window_arrays(IDS, 2, 0, epoch=0, seed=0)
    with pytest.raises(DataError, match=r"1-D integer array"):
        window_arrays(np.zeros((4, 4)), 2, 2, epoch=0, seed=0)


def test_windows_feed_the_dataset_pipeline():
    x, y = window_arrays(IDS, 4, NUM_STEPS, epoch=1, seed=5, rank=1, size=2)
    got = [(a.numpy(), b.numpy()) for a, b in bptt_dataset(x, y)]
    assert len(got) == x.shape[0]
    np.testing.assert_array_equal(np.stack([a for a, _ in got]), x)
    np.testing.assert_array_equal(np.stack([b for _, b in got]), y)


@pytest.mark.parametrize("sampling", ["windows", "random"])
def test_window_batches_one_at_a_time_equal_window_arrays_and_stack_across_ranks(sampling):
    from lmkit.data.windows import WindowBatches

    ids = np.arange(1000, dtype=np.uint16) % 97  # a cache's dtype
    whole = window_arrays(ids, 8, 10, epoch=3, seed=5, sampling=sampling)
    per_rank = []
    for rank in range(2):
        lazy = WindowBatches(ids, 8, 10, epoch=3, seed=5, rank=rank, size=2, sampling=sampling)
        arrays = window_arrays(ids, 8, 10, epoch=3, seed=5, rank=rank, size=2, sampling=sampling)
        assert len(lazy) == arrays[0].shape[0] == num_window_batches(ids.size, 8, 10)
        for i in range(len(lazy)):
            x, y = lazy[i]
            assert x.dtype == np.int32 and x.shape == (4, 10)
            np.testing.assert_array_equal(x, arrays[0][i])
            np.testing.assert_array_equal(y, arrays[1][i])
        per_rank.append(arrays)
    np.testing.assert_array_equal(np.concatenate([a[0] for a in per_rank], axis=1), whole[0])
    np.testing.assert_array_equal(whole[1][..., :-1], whole[0][..., 1:])


def test_random_offsets_are_anywhere_in_the_stream_and_fixed_by_seed_and_epoch():
    from lmkit.data.windows import WindowBatches

    ids = np.arange(2000)
    batches = WindowBatches(ids, 16, 10, epoch=0, seed=1, sampling="random")
    starts = batches.starts.ravel()
    assert starts.min() >= 0 and starts.max() <= ids.size - 11
    assert np.any(starts % 10 != 0)  # not on the fixed windows' grid
    x, y = batches[0]
    np.testing.assert_array_equal(x[:, 0], batches.starts[0])  # ids are positions here
    again = WindowBatches(ids, 16, 10, epoch=0, seed=1, sampling="random").starts
    other = WindowBatches(ids, 16, 10, epoch=1, seed=1, sampling="random").starts
    np.testing.assert_array_equal(again, batches.starts)
    assert not np.array_equal(other, batches.starts)
    fixed = WindowBatches(ids, 16, 10, epoch=0, seed=1).starts
    assert np.all(fixed % 10 == 0) and len(np.unique(fixed)) == fixed.size
    with pytest.raises(DataError, match="sampling = 'randm' is not one of windows, random"):
        WindowBatches(ids, 16, 10, epoch=0, seed=1, sampling="randm")


def test_bptt_batches_one_at_a_time_equal_bptt_arrays():
    from lmkit.data.batching import BpttBatches, bptt_arrays

    ids = np.arange(997, dtype=np.uint32)
    for rank in range(2):
        lazy = BpttBatches(ids, 6, 7, rank=rank, size=2)
        inputs, targets = bptt_arrays(ids, 6, 7, rank=rank, size=2)
        assert len(lazy) == inputs.shape[0]
        for i, (x, y) in enumerate(lazy):
            np.testing.assert_array_equal(x, inputs[i])
            np.testing.assert_array_equal(y, targets[i])
