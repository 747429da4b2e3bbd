"""lmkit.layers.documents: packed windows attend within each example, with positions restarting per example; a
fused kernel leaves them to the matmuls and says so."""
import numpy as np
import pytest
import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.layers import kernels as attention_kernels
from lmkit.layers.attention import Attention, causal_attend, causal_mask
from lmkit.layers.documents import Documents, documents_of, positions_in_documents, within_documents

SEGMENTS = np.array([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 2]], np.int32)


def test_positions_restart_where_the_segment_changes(run):
    got = run(positions_in_documents, tf.constant(SEGMENTS))
    np.testing.assert_array_equal(got, [[0, 1, 2, 0, 1, 0, 0, 1], [0, 1, 2, 3, 4, 5, 6, 0]])


def test_the_mask_is_causal_and_block_diagonal():
    positions = tf.range(8)
    mask = within_documents(causal_mask(positions, positions), tf.constant(SEGMENTS)).numpy()[:, 0]
    for row in range(2):
        s = SEGMENTS[row]
        expected = np.tril(np.ones((8, 8), bool)) & (s[:, None] == s[None, :])
        np.testing.assert_array_equal(mask[row], expected)
    # a block of queries against its keys: the same rows and columns of the whole mask
    block = within_documents(causal_mask(tf.range(4, 8), tf.range(2, 8)), tf.constant(SEGMENTS), (4, 8), (2, 8))
    np.testing.assert_array_equal(block.numpy()[:, 0], mask[:, 4:8, 2:8])
    assert within_documents(causal_mask(positions, positions), None).shape == (1, 1, 8, 8)


def test_documents_of_fills_in_positions_and_refuses_a_state():
    assert documents_of(None, None, None) is None
    documents = documents_of(SEGMENTS, None, None)
    np.testing.assert_array_equal(documents.positions, positions_in_documents(SEGMENTS))
    only_positions = documents_of(None, np.ones([2, 8], np.int64), None)
    assert only_positions.segment_ids is None and only_positions.positions.dtype == tf.int32
    with pytest.raises(UsageError, match=r"positions and segment_ids describe a packed training window"):
        documents_of(SEGMENTS, None, object())


@pytest.mark.parametrize("blocks, window, kv_heads", [(1, None, 4), (3, None, 2), (2, 3, 1)])
def test_a_packed_window_attends_as_its_examples_alone(run, blocks, window, kv_heads):
    """Each example's outputs equal the example's own window, with rotary positions, query blocks, a sliding
    window and grouped heads."""
    attention = Attention(dim=16, num_heads=4, num_kv_heads=kv_heads, rotary={"theta": 10000.0},
                          sliding_window=window, attention_blocks=blocks)
    x = tf.random.normal([1, 8, 16])
    segments = tf.constant([[1, 1, 1, 2, 2, 2, 2, 3]])
    packed, _ = run(lambda x, s: attention(x, documents=documents_of(s, None, None)), x, segments)
    for start, end in [(0, 3), (3, 7), (7, 8)]:
        alone, _ = attention(x[:, start:end])
        np.testing.assert_allclose(packed[:, start:end], alone, atol=1e-6)


def test_documents_are_for_causal_attention_without_a_cache():
    documents = Documents(tf.ones([1, 4], tf.int32), tf.zeros([1, 4], tf.int32))
    causal = Attention(dim=8, num_heads=2)
    with pytest.raises(UsageError, match=r"documents describe a packed window, which is attended without a cache"):
        causal(tf.zeros([1, 4, 8]), cache=causal.initial_cache(1, 8), positions=tf.zeros([1], tf.int32),
               documents=documents)
    with pytest.raises(UsageError, match=r"a cache and documents serve causal self-attention"):
        Attention(dim=8, num_heads=2, causal=False)(tf.zeros([1, 4, 8]), documents=documents)


class _Taker:
    """A kernel that would take every call (the matmuls inside), as a fused kernel on a GPU."""

    name = "taker"

    def __init__(self):
        self.calls, self.declined = 0, {}

    def applies(self, queries, keys, values, rate, training, window):
        return True

    def __call__(self, queries, keys, values):
        self.calls += 1
        with attention_kernels.scope("matmul"):
            return causal_attend(queries, keys, values, 1, 0.0, False)

    def probe(self):
        return None


TAKER = _Taker()


def test_a_fused_kernel_leaves_packed_windows_to_the_matmuls_and_says_so(monkeypatch):
    monkeypatch.setitem(attention_kernels.KERNELS, "taker", f"{__name__}:TAKER")
    q, k, v = (tf.random.normal([1, 2, 6, 8]) for _ in range(3))
    segments = tf.constant([[1, 1, 1, 2, 2, 2]])
    with attention_kernels.scope("taker"):
        causal_attend(q, k, v, 1, 0.0, False)
        assert TAKER.calls == 1 and not TAKER.declined
        packed = causal_attend(q, k, v, 1, 0.0, False, segment_ids=segments)
        assert TAKER.calls == 1
    assert attention_kernels.declined("taker") == [
        "attention_kernel 'taker': the matmuls for packed windows (several examples a window) (the taker kernel "
        "masks causally only, and a packed window needs a block-diagonal mask; the matmuls compute them)"]
    second = causal_attend(q[:, :, 3:], k[:, :, 3:], v[:, :, 3:], 1, 0.0, False)
    np.testing.assert_allclose(packed[:, :, 3:], second, atol=1e-6)
