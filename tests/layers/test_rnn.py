"""The RNN decoder and stacked cells against NumPy, eagerly and under tf.function: unrolling, steps, state."""

import numpy as np
import pytest
import tensorflow as tf

from lmkit.layers import GRUCell, LSTMCell, RNNDecoder, StackedRNN, rnn

from .test_cells import np_gru_step, np_lstm_step


def np_decoder(decoder, inputs, state):
    """Step-by-step, layer-by-layer NumPy reference of an RNNDecoder (no dropout)."""
    state = [tf.nest.map_structure(np.asarray, s) for s in state]
    outputs = []
    for t in range(inputs.shape[1]):
        x = inputs[:, t]
        for layer, cell in enumerate(decoder.cells):
            if isinstance(cell, LSTMCell):
                c, h = np_lstm_step(cell, x, *state[layer])
                state[layer] = (c, h)
                x = h
            else:
                x = state[layer] = np_gru_step(cell, x, state[layer])
        outputs.append(x)
    return np.stack(outputs, axis=1), state


def _random(*shape, seed=0):
    return np.random.RandomState(seed).normal(size=shape).astype(np.float32)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_decoder_unroll_matches_numpy(run, cell):
    decoder = RNNDecoder(input_size=3, hidden_size=4, num_layers=2, cell=cell, init_scale=0.5,
                         forget_bias=1.0 if cell == "lstm" else 0.0)
    inputs = _random(2, 6, 3)
    state = tf.nest.map_structure(lambda z: z + _random(2, 4, seed=3), decoder.initial_state(2))
    outputs, final = run(decoder, tf.constant(inputs), state)
    want_outputs, want_state = np_decoder(decoder, inputs, state)
    np.testing.assert_allclose(outputs, want_outputs, rtol=1e-5, atol=1e-5)
    for got, want in zip(tf.nest.flatten(final), tf.nest.flatten(want_state)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_step_by_step_equals_unrolled(run, cell):
    decoder = RNNDecoder(input_size=3, hidden_size=4, num_layers=2, cell=cell)
    inputs = tf.constant(_random(2, 5, 3))

    def stepwise(x):
        state = decoder.initial_state(2)
        outputs = []
        for t in range(5):
            out, state = decoder.step(x[:, t], state)
            outputs.append(out)
        return tf.stack(outputs, axis=1), state

    want, want_state = decoder(inputs)
    got, got_state = run(stepwise, inputs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(tf.nest.flatten(got_state), tf.nest.flatten(want_state)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_state_carries_across_windows(run, cell):
    decoder = RNNDecoder(input_size=3, hidden_size=4, num_layers=2, cell=cell)
    inputs = tf.constant(_random(2, 7, 3))

    def two_windows(x):
        first, state = decoder(x[:, :3])
        second, state = decoder(x[:, 3:], state)
        return tf.concat([first, second], axis=1), state

    want, want_state = decoder(inputs)
    got, got_state = run(two_windows, inputs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(tf.nest.flatten(got_state), tf.nest.flatten(want_state)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_while_loop_path_equals_static_path(cell, monkeypatch):
    decoder = RNNDecoder(input_size=3, hidden_size=4, num_layers=2, cell=cell)
    inputs = tf.constant(_random(2, 6, 3))
    want, want_state = decoder(inputs)
    # A dynamic time axis takes the tf.while_loop branch.
    dynamic = tf.function(lambda x: decoder(x),
                          input_signature=[tf.TensorSpec([None, None, 3], tf.float32)])
    got, got_state = dynamic(inputs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # So does a static window longer than MAX_STATIC_UNROLL.
    monkeypatch.setattr(rnn, "MAX_STATIC_UNROLL", 2)
    got_long, _ = tf.function(lambda x: decoder(x))(inputs)
    np.testing.assert_allclose(got_long, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(tf.nest.flatten(got_state), tf.nest.flatten(want_state)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_unrolled_graph_projects_inputs_once_per_layer():
    decoder = RNNDecoder(input_size=3, hidden_size=4, num_layers=2)
    graph = tf.function(lambda x: decoder(x)).get_concrete_function(tf.TensorSpec([2, 6, 3])).graph
    matmuls = [op for op in graph.get_operations() if op.type == "MatMul"]
    # One input projection per layer plus one recurrent matmul per step and layer.
    assert len(matmuls) == 2 * (1 + 6)
    assert not [op for op in graph.get_operations() if op.type == "ConcatV2"]


def test_dropout_only_while_training():
    decoder = RNNDecoder(input_size=3, hidden_size=8, num_layers=2, dropout=0.5)
    inputs = tf.constant(_random(2, 4, 3))
    a, _ = decoder(inputs, training=False)
    b, _ = decoder(inputs, training=False)
    np.testing.assert_array_equal(a, b)
    c, _ = decoder(inputs, training=True)
    # Dropout on the top output zeroes about half of the units.
    assert 0.2 < np.mean(c.numpy() == 0.0) < 0.8
    assert not np.any(a.numpy() == 0.0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="hidden_size 0 must be a positive integer"):
        LSTMCell(input_size=3, hidden_size=0)
    with pytest.raises(ValueError, match="init_scale -0.1 must be a number > 0"):
        GRUCell(input_size=3, hidden_size=2, init_scale=-0.1)
    with pytest.raises(ValueError, match="cell 'rnn' is not one of lstm, gru"):
        RNNDecoder(input_size=3, hidden_size=4, cell="rnn")
    with pytest.raises(ValueError, match="forget_bias 1.0 applies to LSTM cells only"):
        RNNDecoder(input_size=3, hidden_size=4, cell="gru", forget_bias=1.0)
    with pytest.raises(ValueError, match=r"dropout 1.0 must be in \[0, 1\)"):
        RNNDecoder(input_size=3, hidden_size=4, dropout=1.0)
    with pytest.raises(ValueError, match="cells\\[1\\].input_size 5 must equal cells\\[0\\].hidden_size 4"):
        StackedRNN(cells=[LSTMCell(input_size=3, hidden_size=4), LSTMCell(input_size=5, hidden_size=4)])
    with pytest.raises(ValueError, match="cells \\[\\] is empty"):
        StackedRNN(cells=[])
    decoder = RNNDecoder(input_size=3, hidden_size=4, num_layers=2)
    with pytest.raises(ValueError, match="state has 1 layers but the stack has 2"):
        decoder(tf.zeros([1, 2, 3]), decoder.initial_state(1)[:1])
