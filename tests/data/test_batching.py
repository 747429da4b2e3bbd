"""BPTT batching and sharding: property tests against a NumPy index reference."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from lmkit.data import DataError, bptt_arrays, bptt_dataset, num_bptt_batches


def _reference_positions(num_ids, batch_size, num_steps):
    """Stream position of every input: row b, batch i, step t -> b*row_len + i*T + t."""
    row_len = num_ids // batch_size
    n = (row_len - 1) // num_steps
    i, b, t = np.indices((n, batch_size, num_steps))
    return b * row_len + i * num_steps + t  # [n, B, T]


@st.composite
def shapes(draw):
    size = draw(st.integers(1, 4))
    batch_size = size * draw(st.integers(1, 4))
    num_steps = draw(st.integers(1, 6))
    length = batch_size * (num_steps + 1) + draw(st.integers(0, 120))
    return batch_size, size, length, num_steps


@settings(max_examples=60, deadline=None, database=None)
@given(shapes(), st.integers(0, 2**31 - 1))
def test_shards_stack_to_single_worker_batches(shape, seed):
    batch_size, size, length, num_steps = shape
    # Distinct ids, so that each value names one stream position.
    ids = np.random.default_rng(seed).permutation(length).astype(np.int64)
    single_x, single_y = bptt_arrays(ids, batch_size, num_steps)
    positions = _reference_positions(length, batch_size, num_steps)
    np.testing.assert_array_equal(single_x, ids[positions])
    np.testing.assert_array_equal(single_y, ids[positions + 1])  # targets: next id in the stream
    assert single_x.dtype == single_y.dtype == np.int32
    assert single_x.shape[0] == num_bptt_batches(length, batch_size, num_steps) >= 1

    shards = [bptt_arrays(ids, batch_size, num_steps, rank=r, size=size) for r in range(size)]
    for x, y in shards:
        assert x.shape == y.shape == (single_x.shape[0], batch_size // size, num_steps)
    np.testing.assert_array_equal(np.concatenate([x for x, _ in shards], axis=1), single_x)
    np.testing.assert_array_equal(np.concatenate([y for _, y in shards], axis=1), single_y)
    # No input position is used twice, within or across ranks.
    all_inputs = np.concatenate([x.ravel() for x, _ in shards])
    assert np.unique(all_inputs).size == all_inputs.size


@settings(max_examples=30, deadline=None, database=None)
@given(shapes())
def test_windows_continue_each_row(shape):
    """Batch i+1 of a row starts where batch i stopped (the RNN state carries)."""
    batch_size, size, length, num_steps = shape
    ids = np.arange(length)
    for rank in range(size):
        x, y = bptt_arrays(ids, batch_size, num_steps, rank=rank, size=size)
        np.testing.assert_array_equal(y, x + 1)
        np.testing.assert_array_equal(x[1:, :, 0], x[:-1, :, -1] + 1)


def test_small_known_example():
    x, y = bptt_arrays(np.arange(20), batch_size=2, num_steps=3)
    # rows: 0..9 and 10..19; (10 - 1) // 3 = 3 windows.
    np.testing.assert_array_equal(x[:, 0], [[0, 1, 2], [3, 4, 5], [6, 7, 8]])
    np.testing.assert_array_equal(x[:, 1], [[10, 11, 12], [13, 14, 15], [16, 17, 18]])
    np.testing.assert_array_equal(y[2], [[7, 8, 9], [17, 18, 19]])
    x1, _ = bptt_arrays(np.arange(20), batch_size=2, num_steps=3, rank=1, size=2)
    np.testing.assert_array_equal(x1[:, 0], x[:, 1])


def test_errors():
    ids = np.arange(100)
    with pytest.raises(DataError, match=r"^batch_size 20 is not divisible by 3 workers; use a multiple of 3$"):
        bptt_arrays(ids, 20, 5, rank=0, size=3)
    with pytest.raises(DataError, match=r"11 ids are too few for one batch of batch_size 2 x num_steps 5: "
                                        r"that needs batch_size \* \(num_steps \+ 1\) = 12 ids"):
        bptt_arrays(np.arange(11), 2, 5)
    bptt_arrays(np.arange(12), 2, 5)  # exactly enough
    with pytest.raises(DataError, match=r"rank = 2 is not in \[0, 2\)"):
        bptt_arrays(ids, 4, 5, rank=2, size=2)
    with pytest.raises(DataError, match=r"num_steps = 0 must be a positive integer"):
        bptt_arrays(ids, 4, 0)
    with pytest.raises(DataError, match=r"1-D integer array"):
        bptt_arrays(np.zeros((10, 10), np.int32), 2, 2)
    assert num_bptt_batches(11, 2, 5) == 0 and num_bptt_batches(12, 2, 5) == 1


def test_bptt_dataset_in_order_eager_and_in_tf_function():
    x, y = bptt_arrays(np.arange(200), batch_size=4, num_steps=5, rank=1, size=2)
    dataset = bptt_dataset(x, y)
    got = [(a.numpy(), b.numpy()) for a, b in dataset]
    assert len(got) == x.shape[0]
    for i, (a, b) in enumerate(got):
        np.testing.assert_array_equal(a, x[i])
        np.testing.assert_array_equal(b, y[i])
        assert a.dtype == np.int32

    @tf.function
    def weighted_sum(ds):
        # Weights by batch index: a wrong order changes the result.
        total = tf.constant(0, tf.int64)
        step = tf.constant(0, tf.int64)
        for a, b in ds:
            step += 1
            total += step * tf.reduce_sum(tf.cast(a * 3 + b, tf.int64))
        return total

    expected = sum((i + 1) * int((x[i].astype(np.int64) * 3 + y[i]).sum()) for i in range(x.shape[0]))
    assert int(weighted_sum(dataset)) == expected
    with pytest.raises(DataError, match=r"must both be \[num_batches, batch, num_steps\]"):
        bptt_dataset(x, y[:-1])
