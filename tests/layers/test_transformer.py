"""The transformer layer and the decoder-only stack against NumPy; cached decoding equals the full pass."""

import numpy as np
import pytest
import tensorflow as tf

from lmkit.layers import Attention, TransformerDecoder, TransformerLayer

from .reference import gelu, np_attention, np_layer_norm, np_linear


def _random(*shape, seed=0):
    return np.random.RandomState(seed).normal(size=shape).astype(np.float32)


def np_transformer_layer(layer, x):
    act = gelu if layer.activation == "gelu" else (lambda a: np.maximum(a, 0))

    def ffn(a):
        return np_linear(layer.ffn_outer, act(np_linear(layer.ffn_inner, a)))

    if layer.pre_layer_norm:
        x = x + np_attention(layer.attention, np_layer_norm(layer.attention_norm, x))
        return x + ffn(np_layer_norm(layer.ffn_norm, x))
    x = np_layer_norm(layer.attention_norm, x + np_attention(layer.attention, x))
    return np_layer_norm(layer.ffn_norm, x + ffn(x))


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
        Attention(dim=10, num_heads=3, fused="qkv")
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
