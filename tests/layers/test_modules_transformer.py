"""Attention, layer norm, the transformer block and cached decoding."""

import math

import numpy as np
import pytest
import tensorflow as tf

from lmkit.layers import LayerNorm, MultiHeadAttention, TransformerDecoder, TransformerLayer
from lmkit.layers import transformer as transformer_module


def _random(*shape, seed=0):
    return np.random.RandomState(seed).normal(size=shape).astype(np.float32)


def np_layer_norm(norm, x):
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + norm.epsilon) * norm.scale.numpy() + norm.offset.numpy()


def np_linear(linear, x):
    return x @ linear.kernel.numpy() + linear.bias.numpy()


def np_attention(attention, x):
    """Causal multi-head self-attention, written out per head."""
    batch, length, dim = x.shape
    heads, head_dim = attention.num_heads, attention.head_dim
    q, k, v = np.split(np_linear(attention.qkv, x), 3, axis=-1)
    out = np.zeros_like(q)
    for b in range(batch):
        for h in range(heads):
            cols = slice(h * head_dim, (h + 1) * head_dim)
            scores = q[b, :, cols] @ k[b, :, cols].T / math.sqrt(head_dim)  # [time, time]
            scores = np.where(np.tril(np.ones((length, length))) > 0, scores, -np.inf)
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            out[b, :, cols] = probs @ v[b, :, cols]
    return np_linear(attention.output, out)


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def np_transformer_layer(layer, x):
    act = _gelu if layer.activation == "gelu" else (lambda a: np.maximum(a, 0))

    def ffn(a):
        return np_linear(layer.ffn_outer, act(np_linear(layer.ffn_inner, a)))

    if layer.pre_layer_norm:
        x = x + np_attention(layer.attention, np_layer_norm(layer.attention_norm, x))
        return x + ffn(np_layer_norm(layer.ffn_norm, x))
    x = np_layer_norm(layer.attention_norm, x + np_attention(layer.attention, x))
    return np_layer_norm(layer.ffn_norm, x + ffn(x))


def test_layer_norm_matches_numpy(run):
    norm = LayerNorm(dim=5)
    norm.scale.assign(_random(5, seed=1))
    norm.offset.assign(_random(5, seed=2))
    x = _random(2, 3, 5)
    np.testing.assert_allclose(run(norm, tf.constant(x)), np_layer_norm(norm, x), rtol=1e-4, atol=1e-5)


def test_attention_matches_numpy(run):
    attention = MultiHeadAttention(dim=6, num_heads=3, init_scale=0.5)
    x = _random(2, 4, 6)
    got, cache = run(attention, tf.constant(x))
    assert cache is None
    np.testing.assert_allclose(got, np_attention(attention, x), rtol=1e-4, atol=1e-5)


def test_attention_is_causal():
    attention = MultiHeadAttention(dim=4, num_heads=2)
    x = _random(1, 5, 4)
    changed = x.copy()
    changed[:, 3:] += 1.0
    a, _ = attention(tf.constant(x))
    b, _ = attention(tf.constant(changed))
    np.testing.assert_allclose(a[:, :3], b[:, :3], rtol=1e-6)
    assert not np.allclose(a[:, 3:], b[:, 3:])


@pytest.mark.parametrize("pre_layer_norm,activation", [(True, "gelu"), (False, "relu")])
def test_transformer_layer_matches_numpy(run, pre_layer_norm, activation):
    layer = TransformerLayer(dim=6, num_heads=2, ffn_dim=10, pre_layer_norm=pre_layer_norm,
                             activation=activation, init_scale=0.3)
    x = _random(2, 4, 6)
    got, _ = run(layer, tf.constant(x))
    np.testing.assert_allclose(got, np_transformer_layer(layer, x), rtol=1e-4, atol=1e-4)


def _decoder(pre_layer_norm=True):
    return TransformerDecoder(num_layers=2, dim=8, num_heads=2, ffn_dim=12, pre_layer_norm=pre_layer_norm,
                              max_positions=16, init_scale=0.3)


@pytest.mark.parametrize("pre_layer_norm", [True, False])
def test_cached_steps_equal_full_pass(run, pre_layer_norm):
    decoder = _decoder(pre_layer_norm)
    inputs = tf.constant(_random(3, 6, 8))
    want, none_state = decoder(inputs)
    assert none_state is None

    def stepwise(x):
        state = decoder.initial_state(3, max_length=10)
        outputs = []
        for t in range(6):
            out, state = decoder.step(x[:, t], state)
            outputs.append(out)
        return tf.stack(outputs, axis=1), state

    got, state = run(stepwise, inputs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(state.positions, [6, 6, 6])
    assert state.caches[0].keys.shape == (3, 2, 10, 4)


def test_prefill_then_steps_equal_full_pass(run):
    decoder = _decoder()
    inputs = tf.constant(_random(2, 7, 8))
    want, _ = decoder(inputs)

    def prefill_and_step(x):
        state = decoder.initial_state(2, max_length=7)
        prompt, state = decoder(x[:, :4], state)
        chunk, state = decoder(x[:, 4:6], state)
        last, state = decoder.step(x[:, 6], state)
        return tf.concat([prompt, chunk, last[:, tf.newaxis]], axis=1), state.positions

    got, positions = run(prefill_and_step, inputs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(positions, [7, 7])


def test_rows_at_different_positions():
    decoder = _decoder()
    a = _random(1, 5, 8, seed=1)
    b = _random(1, 3, 8, seed=2)
    want_a, _ = decoder(tf.constant(a))
    want_b, _ = decoder(tf.constant(b))
    # Row 0 has 4 cached tokens, row 1 has 2; both then take one step.
    state_a = decoder(tf.constant(a[:, :4]), decoder.initial_state(1, 8))[1]
    state_b = decoder(tf.constant(b[:, :2]), decoder.initial_state(1, 8))[1]
    state = tf.nest.map_structure(lambda x, y: tf.concat([x, y], axis=0), state_a, state_b)
    out, state = decoder.step(tf.constant(np.concatenate([a[:, 4], b[:, 2]])), state)
    np.testing.assert_allclose(out[0], want_a[0, 4], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out[1], want_b[0, 2], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(state.positions, [5, 3])


def test_cached_step_traces_once():
    decoder = _decoder()
    step = tf.function(decoder.step)
    state = decoder.initial_state(2, 5)
    for t in range(4):
        _, state = step(tf.constant(_random(2, 8, seed=t)), state)
    assert step.experimental_get_tracing_count() == 1


def test_every_state_tensor_is_batch_first():
    state = _decoder().initial_state(3, 5)
    assert all(t.shape[0] == 3 for t in tf.nest.flatten(state))
    assert state.positions.dtype == tf.int32 and state.positions.shape == (3,)


def test_dropout_only_while_training():
    decoder = TransformerDecoder(num_layers=1, dim=8, num_heads=2, dropout=0.5)
    x = tf.constant(_random(2, 4, 8))
    np.testing.assert_array_equal(decoder(x)[0], decoder(x, training=False)[0])
    assert not np.allclose(decoder(x, training=True)[0], decoder(x)[0])


def test_bad_arguments():
    with pytest.raises(ValueError, match="dim 10 is not divisible by num_heads 3; use a multiple of 3"):
        MultiHeadAttention(dim=10, num_heads=3)
    with pytest.raises(ValueError, match="dim 10 is not divisible by num_heads 4"):
        TransformerDecoder(num_layers=1, dim=10, num_heads=4)
    with pytest.raises(ValueError, match="num_heads 0 must be a positive integer"):
        TransformerLayer(dim=8, num_heads=0, ffn_dim=4)
    with pytest.raises(ValueError, match="activation 'swish' is not one of gelu, gelu_exact, relu"):
        TransformerLayer(dim=8, num_heads=2, ffn_dim=4, activation="swish")
    with pytest.raises(ValueError, match="ffn_dim -1 must be an integer >= 0"):
        TransformerDecoder(num_layers=1, dim=8, num_heads=2, ffn_dim=-1)
    decoder = TransformerDecoder(num_layers=1, dim=8, num_heads=2, max_positions=6)
    assert decoder.ffn_dim == 32
    with pytest.raises(ValueError, match="max_length 7 exceeds max_positions 6"):
        decoder.initial_state(1, max_length=7)
    with pytest.raises(ValueError, match="positions is None but a cache was given"):
        decoder.layers[0].attention(tf.zeros([1, 1, 8]), cache=decoder.initial_state(1).caches[0])


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
        probs = transformer_module.masked_softmax(scores, mask)
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
    assert _float32_square_arrays_kept_for_backward(transformer_module.attend, dtype) == set()


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
    got = transformer_module.causal_attend(tf.constant(q), tf.constant(k), tf.constant(v), blocks, 0.0, False)
    np.testing.assert_allclose(got, _causal_reference(q.astype(np.float64), k.astype(np.float64),
                                                      v.astype(np.float64)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kv_heads, window", [(2, None), (1, None), (6, 3), (2, 5), (3, 1)])
@pytest.mark.parametrize("length, blocks", [(8, 1), (8, 4), (7, 3), (3, 8)])
def test_causal_attend_with_grouped_heads_and_a_sliding_window(kv_heads, window, length, blocks):
    # Llama's grouped-query attention (6 query heads over 2, 1 or 3 key/value heads) and Mistral's
    # sliding window, in any number of blocks: the attention of the float64 reference.
    q = _random(2, 6, length, 4, seed=1)
    k, v = (_random(2, kv_heads, length, 4, seed=s) for s in (2, 3))
    got = transformer_module.causal_attend(tf.constant(q), tf.constant(k), tf.constant(v), blocks, 0.0, False,
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
    got = transformer_module.grouped_attend(tf.constant(q), tf.constant(k), tf.constant(v), tf.constant(mask), 0.0,
                                            False)
    k, v = (np.repeat(x.astype(np.float64), 2, axis=1) for x in (k, v))
    scores = np.where(mask, np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k), -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    want = np.einsum("bhqk,bhkd->bhqd", probs / probs.sum(-1, keepdims=True), v)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_attention_blocks_give_the_values_and_gradients_of_one_block(dtype):
    x = tf.constant(_random(2, 12, 8))

    def values_and_gradients(blocks):
        tf.random.set_seed(3)
        attention = MultiHeadAttention(dim=8, num_heads=2, init_scale=0.5, attention_blocks=blocks)
        with tf.GradientTape() as tape:
            tape.watch(x)
            out, _ = attention(tf.cast(x, dtype))
            loss = tf.reduce_sum(tf.cast(out, tf.float32) * tf.cos(tf.range(8, dtype=tf.float32)))
        grads = tape.gradient(loss, [x, *attention.trainable_variables])
        return [out.numpy().astype(np.float32)] + [g.numpy() for g in grads]

    one = values_and_gradients(1)
    # The same products (the skipped keys add exact zeros), summed in another order. float32: a sum of
    # up to 12 terms (the window) reordered, within 12 eps of its largest value. bfloat16: the key and
    # value gradients are sums of one bfloat16 part per query block, each rounded once: within
    # `blocks` eps. Measured on an AVX-512 CPU: 1.4e-7 (float32, 1.2 eps) and 6.5e-3 (bfloat16, 1.7 eps).
    for blocks in (3, 4):
        eps, terms = (2.0 ** -23, 12) if dtype == tf.float32 else (2.0 ** -8, blocks)
        for got, want in zip(values_and_gradients(blocks), one):
            assert np.max(np.abs(got - want)) <= terms * eps * np.max(np.abs(want))


def _score_elements(fn, *args):
    """The elements of every [.., time, keys] matmul output of fn's graph whose inputs are 4-d."""
    graph = tf.function(fn).get_concrete_function(*args).graph
    return sum(int(np.prod(op.outputs[0].shape)) for op in graph.get_operations()
               if op.type == "BatchMatMulV2" and op.inputs[1].shape.rank == 4
               and op.get_attr("adj_y"))


def test_attention_blocks_skip_the_masked_keys():
    # The point of the blocks: fewer scores computed, 5/8 of the window's with 4 blocks.
    spec = tf.TensorSpec([2, 16, 8], tf.float32)
    counts = {}
    for blocks in (1, 4):
        attention = MultiHeadAttention(dim=8, num_heads=2, attention_blocks=blocks)
        counts[blocks] = _score_elements(lambda x: attention(x)[0], spec)
    assert counts[1] == 2 * 2 * 16 * 16
    assert counts[4] == counts[1] * 5 // 8


def test_auto_attention_blocks_split_windows_from_1024_positions():
    # The default "auto": 4 blocks from windows of 1024 positions (measured faster there on an H100 and a
    # CPU), one below (the CPU configs' windows of 64-128 keep their program), one for unknown lengths.
    assert MultiHeadAttention(dim=8, num_heads=2).attention_blocks == "auto"
    for_ = transformer_module.attention_blocks_for
    assert [for_("auto", n) for n in (None, 1, 64, 1023, 1024, 4096)] == [1, 1, 1, 1, 4, 4]
    assert [for_(3, n) for n in (None, 2, 3, 1024)] == [1, 2, 3, 3]
    spec = [tf.TensorSpec([1, 1, length, 4], tf.float32) for length in (1023, 1024)]
    counts = [_score_elements(lambda q, k, v: transformer_module.causal_attend(q, k, v, "auto", 0.0, False),
                              *[s] * 3) for s in spec]
    assert counts == [1023 * 1023, 1024 * 1024 * 5 // 8]
    assert MultiHeadAttention(dim=8, num_heads=2, attention_blocks=np.int64(2)).attention_blocks == 2  # as before
    for bad in (0, -1, 2.0, "4", True, None):
        with pytest.raises(ValueError, match="attention_blocks .* must be a positive integer or \"auto\""):
            MultiHeadAttention(dim=8, num_heads=2, attention_blocks=bad)


def test_attention_blocks_skip_the_keys_before_a_sliding_window():
    # Blocks of 4 queries of 16 with a window of 5 read 4, 8, 8, 8 keys: 7/16 of the window's scores.
    spec = [tf.TensorSpec([2, 2, 16, 4], tf.float32)] * 3
    counts = {blocks: _score_elements(lambda q, k, v: transformer_module.causal_attend(q, k, v, blocks, 0.0, False,
                                                                                        5), *spec)
              for blocks in (1, 4)}
    assert counts[1] == 2 * 2 * 16 * 16
    assert counts[4] == 2 * 2 * 4 * (4 + 8 + 8 + 8) == counts[1] * 7 // 16


def test_attention_blocks_with_a_dynamic_window_and_a_cache():
    # A window of unknown length (one trace for every length) falls back to one block; a cached
    # call (generation) attends as before.
    tf.random.set_seed(4)
    blocked = MultiHeadAttention(dim=8, num_heads=2, attention_blocks=4)
    tf.random.set_seed(4)
    plain = MultiHeadAttention(dim=8, num_heads=2)
    dynamic = tf.function(lambda x: blocked(x)[0], input_signature=[tf.TensorSpec([None, None, 8], tf.float32)])
    # the same products summed in another order (graph vs eager, cache slots of exact zeros): a few eps
    for length in (3, 9):
        x = tf.constant(_random(1, length, 8, seed=length))
        np.testing.assert_allclose(dynamic(x), plain(x)[0], rtol=1e-5, atol=1e-6)
    x = tf.constant(_random(1, 6, 8, seed=5))
    cache = blocked.initial_cache(1, 8)
    got, _ = blocked(x, cache=cache, positions=tf.zeros([1], tf.int32))
    np.testing.assert_allclose(got, plain(x)[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="attention_blocks"):
        MultiHeadAttention(dim=8, num_heads=2, attention_blocks=0)
