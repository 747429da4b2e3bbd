"""The functions attention computes with, against NumPy: the masked softmax (its low-precision gradient too),
causal attention in query blocks (grouped heads, a sliding window), grouped heads reading a cache."""

import numpy as np
import pytest
import tensorflow as tf

from lmkit.layers import attend


def _random(*shape, seed=0):
    return np.random.RandomState(seed).normal(size=shape).astype(np.float32)



def _softmax_inputs(dtype, shape=(2, 3, 6, 6)):
    rng = np.random.RandomState(0)
    scores = tf.cast(rng.randn(*shape) * 3, dtype)
    mask = np.tril(np.ones(shape[-2:], bool))[None, None]
    mask = np.broadcast_to(mask, shape).copy()
    mask[0, 0, 2] = False  # a row that attends to nothing
    return scores, tf.constant(mask), tf.constant(rng.randn(*shape), tf.float32)


def _reference_softmax_and_gradient(scores, mask, d_probs):
    """float64 NumPy: softmax(where(mask, s, -1e9)) and the gradient of sum(probs * d_probs)."""
    x = np.where(mask, scores.astype(np.float64), -1e9)
    e = np.exp(x - x.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    g = p * (d_probs - (d_probs * p).sum(-1, keepdims=True))
    return p, np.where(mask, g, 0.0)


def _probs_and_gradient(scores, mask, d_probs):
    with tf.GradientTape() as tape:
        tape.watch(scores)
        probs = attend.masked_softmax(scores, mask)
        loss = tf.reduce_sum(tf.cast(probs, tf.float32) * d_probs)
    return probs, tape.gradient(loss, scores)


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16])
def test_masked_softmax_low_precision_matches_float64(dtype):
    scores, mask, d_probs = _softmax_inputs(dtype)
    probs, grad = _probs_and_gradient(scores, mask, d_probs)
    assert probs.dtype == dtype and grad.dtype == dtype
    # The forward pass is the float32 softmax rounded once to the low precision.
    x = tf.where(mask, tf.cast(scores, tf.float32), -1e9)
    np.testing.assert_array_equal(probs.numpy(), tf.cast(tf.nn.softmax(x), dtype).numpy())
    want_p, want_g = _reference_softmax_and_gradient(scores.numpy().astype(np.float64), mask.numpy(),
                                                     d_probs.numpy())
    eps = float(np.finfo(dtype.as_numpy_dtype).eps) if dtype == tf.float16 else 2.0 ** -8
    # Bounds, in eps (bfloat16: 2^-8, float16: 2^-10): each probability (<= 1) is the float32 softmax
    # rounded once, off by at most eps / 2. The gradient reads rounded probabilities and a rounded
    # d_probs and is rounded once more: a few eps of its largest term. (On the machine that wrote this
    # the errors were 0.5 and 0.66 eps, a margin of 4x and 12x.)
    np.testing.assert_allclose(probs.numpy().astype(np.float64), want_p, rtol=0, atol=2 * eps)
    scale = np.abs(want_g).max()
    np.testing.assert_allclose(grad.numpy().astype(np.float64), want_g, rtol=0, atol=8 * eps * scale)
    # Masked positions, including the row with no position to attend to, get no gradient.
    assert not np.any(grad.numpy()[~mask.numpy()])


def test_masked_softmax_float32_is_tensorflows():
    scores, mask, d_probs = _softmax_inputs(tf.float32)
    probs, grad = _probs_and_gradient(scores, mask, d_probs)
    with tf.GradientTape() as tape:
        tape.watch(scores)
        want = tf.nn.softmax(tf.where(mask, scores, -1e9))
        loss = tf.reduce_sum(want * d_probs)
    np.testing.assert_array_equal(probs.numpy(), want.numpy())
    np.testing.assert_array_equal(grad.numpy(), tape.gradient(loss, scores).numpy())


def _float32_square_arrays_kept_for_backward(attend_fn, dtype, length=16):
    """Names of float32 [.., length, length] tensors of the forward pass that the backward pass reads."""
    @tf.function
    def grads(q, k, v, w):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            mask = tf.cast(tf.linalg.band_part(tf.ones([length, length]), -1, 0), tf.bool)[None, None]
            loss = tf.reduce_sum(tf.cast(attend_fn(q, k, v, mask, 0.0, False), tf.float32) * w)
        return tape.gradient(loss, [q, k, v])

    spec = tf.TensorSpec([2, 3, length, 4], dtype)
    graph = grads.get_concrete_function(spec, spec, spec, tf.TensorSpec([2, 3, length, 4])).graph
    kept = set()
    for op in graph.get_operations():
        if not op.name.startswith("gradient_tape"):
            continue
        for t in op.inputs:
            if (not t.op.name.startswith("gradient_tape") and t.dtype == tf.float32 and t.shape.rank == 4
                    and t.shape[-2:] == [length, length]):
                kept.add(t.name)
    return kept


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16])
def test_mixed_precision_attention_keeps_no_float32_probabilities(dtype):
    # A GPU decision (the arrays the backward pass reads cost memory traffic there), checked on the graph.
    def float32_probs_attend(q, k, v, mask, rate, training):  # lmkit's attention before masked_softmax
        scores = tf.where(mask, tf.cast(tf.matmul(q, k, transpose_b=True), tf.float32), -1e9)
        return tf.matmul(tf.cast(tf.nn.softmax(scores), v.dtype), v)

    assert _float32_square_arrays_kept_for_backward(float32_probs_attend, dtype)  # the check can fail
    assert _float32_square_arrays_kept_for_backward(attend.attend, dtype) == set()


def _causal_reference(q, k, v, window=None):
    """float64 NumPy: softmax(q k^T, causal) v per batch row and head; query head h reads key/value head
    h // (heads / kv_heads); with a window the query at i sees keys i - window < j <= i."""
    length = q.shape[2]
    k, v = (np.repeat(x, q.shape[1] // x.shape[1], axis=1) for x in (k, v))
    scores = np.einsum("bhqd,bhkd->bhqk", q, k)
    offsets = np.arange(length)[:, None] - np.arange(length)[None, :]
    visible = (offsets >= 0) & (offsets < (window or length))
    scores = np.where(visible, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", probs / probs.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("length, blocks", [(8, 1), (8, 2), (8, 4), (7, 3), (5, 5), (3, 8)])
def test_causal_attend_in_blocks_is_causal_attention(length, blocks):
    # Any number of blocks, also one that does not divide the window or exceeds it: the same attention.
    q, k, v = (_random(2, 3, length, 4, seed=s) for s in (1, 2, 3))
    # float32 against float64: a softmax and sums of at most 8 terms of O(1) values, each within a few
    # eps (1.2e-7) of exact: 1e-5 relative and 1e-6 absolute leave an order of magnitude to spare.
    got = attend.causal_attend(tf.constant(q), tf.constant(k), tf.constant(v), blocks, 0.0, False)
    np.testing.assert_allclose(got, _causal_reference(q.astype(np.float64), k.astype(np.float64),
                                                      v.astype(np.float64)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kv_heads, window", [(2, None), (1, None), (6, 3), (2, 5), (3, 1)])
@pytest.mark.parametrize("length, blocks", [(8, 1), (8, 4), (7, 3), (3, 8)])
def test_causal_attend_with_grouped_heads_and_a_sliding_window(kv_heads, window, length, blocks):
    # Llama's grouped-query attention (6 query heads over 2, 1 or 3 key/value heads) and Mistral's
    # sliding window, in any number of blocks: the attention of the float64 reference.
    q = _random(2, 6, length, 4, seed=1)
    k, v = (_random(2, kv_heads, length, 4, seed=s) for s in (2, 3))
    got = attend.causal_attend(tf.constant(q), tf.constant(k), tf.constant(v), blocks, 0.0, False,
                                           window)
    # float32 against float64, as above: sums of at most 8 terms, a few eps each.
    np.testing.assert_allclose(got, _causal_reference(*(x.astype(np.float64) for x in (q, k, v)), window),
                               rtol=1e-5, atol=1e-6)


def test_grouped_attend_reads_the_shared_heads_of_a_cache():
    # The cached path (generation): the same grouping, with a [batch, 1, time, keys] mask per row.
    q = _random(2, 4, 3, 4, seed=1)
    k, v = (_random(2, 2, 5, 4, seed=s) for s in (2, 3))
    query_positions = np.array([0, 2])[:, None] + np.arange(3)  # rows whose windows start at 0 and 2
    mask = (np.arange(5)[None, None, :] <= query_positions[:, :, None])[:, None]  # [batch, 1, time, keys]
    got = attend.grouped_attend(tf.constant(q), tf.constant(k), tf.constant(v), tf.constant(mask), 0.0,
                                            False)
    k, v = (np.repeat(x.astype(np.float64), 2, axis=1) for x in (k, v))
    scores = np.where(mask, np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k), -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    want = np.einsum("bhqk,bhkd->bhqd", probs / probs.sum(-1, keepdims=True), v)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _score_elements(fn, *args):
    """The elements of every [.., time, keys] matmul output of fn's graph whose inputs are 4-d."""
    graph = tf.function(fn).get_concrete_function(*args).graph
    return sum(int(np.prod(op.outputs[0].shape)) for op in graph.get_operations()
               if op.type == "BatchMatMulV2" and op.inputs[1].shape.rank == 4
               and op.get_attr("adj_y"))


def test_attention_blocks_skip_the_keys_before_a_sliding_window():
    # Blocks of 4 queries of 16 with a window of 5 read 4, 8, 8, 8 keys: 7/16 of the window's scores.
    spec = [tf.TensorSpec([2, 2, 16, 4], tf.float32)] * 3
    counts = {blocks: _score_elements(lambda q, k, v: attend.causal_attend(q, k, v, blocks, 0.0, False,
                                                                                        5), *spec)
              for blocks in (1, 4)}
    assert counts[1] == 2 * 2 * 16 * 16
    assert counts[4] == 2 * 2 * 4 * (4 + 8 + 8 + 8) == counts[1] * 7 // 16
