"""The RNN encoder (one or both directions, padded) and the attention RNN decoder (Luong, Bahdanau) against
NumPy, the teacher-forced pass against steps, tf.while_loop, XLA and bfloat16."""

import numpy as np
import pytest
import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.layers import AttentionRNNDecoder, LSTMCell, RNNEncoder, precision

from .test_cells import np_gru_step, np_lstm_step
from .test_rnn import np_decoder

LENGTHS = [5, 3]


def _random(*shape, seed=0):
    return np.random.RandomState(seed).normal(size=shape).astype(np.float32)


def _mask(lengths, time):
    return np.arange(time)[None, :] < np.array(lengths)[:, None]


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_bidirectional_encoder_equals_numpy_per_row(cell):
    encoder = RNNEncoder(input_size=3, hidden_size=4, num_layers=2, cell=cell, bidirectional=True, init_scale=0.5)
    x, mask = _random(2, 5, 3), _mask(LENGTHS, 5)
    got = encoder(tf.constant(x), tf.constant(mask)).numpy()
    assert got.shape == (2, 5, 8) and encoder.output_size == 8
    for row, length in enumerate(LENGTHS):  # each row alone, without its padding
        tokens = x[row:row + 1, :length]
        forward, _ = np_decoder(encoder.forward, tokens, encoder.forward.initial_state(1))
        backward, _ = np_decoder(encoder.backward, tokens[:, ::-1], encoder.backward.initial_state(1))
        expected = np.concatenate([forward, backward[:, ::-1]], axis=-1)[0]
        np.testing.assert_allclose(got[row, :length], expected, rtol=1e-5, atol=1e-5)
        assert not np.any(got[row, length:])  # padding: zeros


def np_attention_decoder(decoder, inputs, values, mask):
    """Step-by-step NumPy reference of both mechanisms (zero initial state, no dropout)."""
    batch, hidden = inputs.shape[0], decoder.hidden_size
    keys = values @ decoder.memory_key.kernel.numpy()
    cells = decoder.rnn.cells
    states = [(np.zeros((batch, hidden)), np.zeros((batch, hidden))) if isinstance(c, LSTMCell)
              else np.zeros((batch, hidden)) for c in cells]
    attentional = np.zeros((batch, hidden))

    def attend(query):
        if decoder.attention == "luong":
            scores = np.einsum("bh,bsh->bs", query, keys)
        else:
            scores = np.tanh(keys + (query @ decoder.query.kernel.numpy())[:, None]) @ decoder.score.numpy()
        scores = np.where(mask, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        return np.einsum("bs,bsm->bm", probs, values)

    outputs = []
    for t in range(inputs.shape[1]):
        top = states[-1][1] if isinstance(cells[-1], LSTMCell) else states[-1]
        fed = attentional if decoder.attention == "luong" else attend(top)
        x = np.concatenate([inputs[:, t], fed], axis=-1)
        for i, cell in enumerate(cells):
            if isinstance(cell, LSTMCell):
                states[i] = np_lstm_step(cell, x, *states[i])
                x = states[i][1]
            else:
                x = states[i] = np_gru_step(cell, x, states[i])
        context = fed if decoder.attention == "bahdanau" else attend(x)
        attentional = np.tanh(np.concatenate([context, x], -1) @ decoder.attentional.kernel.numpy())
        outputs.append(attentional)
    return np.stack(outputs, axis=1)


@pytest.mark.parametrize("attention,cell", [("luong", "lstm"), ("bahdanau", "gru"), ("bahdanau", "lstm")])
def test_attention_decoder_equals_numpy(attention, cell):
    decoder = AttentionRNNDecoder(input_size=3, hidden_size=4, memory_size=6, num_layers=2, cell=cell,
                                  attention=attention, attention_size=5, init_scale=0.5)
    inputs, values, mask = _random(2, 4, 3, seed=1), _random(2, 5, 6, seed=2), _mask(LENGTHS, 5)
    memory = decoder.memory(tf.constant(values), tf.constant(mask))
    got, state = decoder(tf.constant(inputs), memory)
    np.testing.assert_allclose(got.numpy(), np_attention_decoder(decoder, inputs, values, mask),
                               rtol=1e-5, atol=1e-5)
    # The last output is the state's attentional vector; a step continues from the state.
    np.testing.assert_allclose(state.attentional.numpy(), got.numpy()[:, -1], rtol=1e-6)


def test_padding_is_never_attended_and_probabilities_sum_to_one():
    decoder = AttentionRNNDecoder(input_size=3, hidden_size=4, memory_size=6, attention="luong")
    values, mask = _random(2, 5, 6, seed=2), _mask(LENGTHS, 5)
    query = tf.constant(_random(2, 4, seed=3))
    _, probs = decoder.attend(query, decoder.memory(tf.constant(values), tf.constant(mask)))
    np.testing.assert_allclose(probs.numpy().sum(-1), [1.0, 1.0], rtol=1e-6)
    assert not np.any(probs.numpy()[~mask])
    noisy = values.copy()
    noisy[~mask] = 50.0
    _, again = decoder.attend(query, decoder.memory(tf.constant(noisy), tf.constant(mask)))
    np.testing.assert_allclose(again.numpy(), probs.numpy(), rtol=1e-6)


def test_while_loop_xla_and_bfloat16_agree_with_the_static_loop():
    decoder = AttentionRNNDecoder(input_size=3, hidden_size=4, memory_size=6, attention="bahdanau")
    inputs, values, mask = _random(2, 4, 3, seed=1), _random(2, 5, 6, seed=2), _mask(LENGTHS, 5)
    memory = decoder.memory(tf.constant(values), tf.constant(mask))
    static, _ = decoder(tf.constant(inputs), memory)

    @tf.function(input_signature=[tf.TensorSpec([2, None, 3], tf.float32)])
    def dynamic(x):  # an unknown time axis: the tf.while_loop path
        return decoder(x, memory)[0]

    np.testing.assert_allclose(dynamic(tf.constant(inputs)).numpy(), static.numpy(), rtol=1e-5, atol=1e-6)
    compiled = tf.function(lambda x: decoder(x, memory)[0], jit_compile=True)(tf.constant(inputs))
    np.testing.assert_allclose(compiled.numpy(), static.numpy(), rtol=1e-4, atol=1e-5)
    with precision.scope("mixed_bfloat16"):
        half, _ = decoder(tf.cast(inputs, tf.bfloat16), memory)
    np.testing.assert_allclose(tf.cast(half, tf.float32).numpy(), static.numpy(), atol=0.05)


def test_gradients_reach_every_variable():
    encoder = RNNEncoder(input_size=3, hidden_size=3, bidirectional=True)
    decoder = AttentionRNNDecoder(input_size=3, hidden_size=4, memory_size=6, attention="bahdanau", dropout=0.1)
    source, mask = tf.constant(_random(2, 5, 3)), tf.constant(_mask(LENGTHS, 5))
    with tf.GradientTape() as tape:
        outputs, _ = decoder(tf.constant(_random(2, 4, 3, seed=1)), decoder.memory(encoder(source, mask), mask),
                             training=True)
        loss = tf.reduce_sum(tf.square(outputs))
    variables = encoder.trainable_variables + decoder.trainable_variables
    grads = tape.gradient(loss, variables)
    assert all(g is not None and np.any(tf.convert_to_tensor(g).numpy()) for g in grads), \
        [v.name for v, g in zip(variables, grads) if g is None]


def test_bad_settings_are_named():
    with pytest.raises(UsageError, match="attention 'dot' is not one of luong, bahdanau"):
        AttentionRNNDecoder(input_size=3, hidden_size=4, memory_size=6, attention="dot")
    with pytest.raises(UsageError, match="cell 'rnn' is not one of lstm, gru"):
        RNNEncoder(input_size=3, hidden_size=4, cell="rnn")
