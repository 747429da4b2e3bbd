"""The LSTM and GRU cells against NumPy, eagerly and under tf.function, and the LSTM's own backward pass."""

import numpy as np
import pytest
import tensorflow as tf

from lmkit.layers import GRUCell, LSTMCell, LSTMState, rnn


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_lstm_step(cell, x, c, h):
    """Zaremba's LSTM: gates i, j, f, o; c' = c*s(f+b) + s(i)*tanh(j); h' = tanh(c')*s(o)."""
    z = x @ cell.input_kernel.numpy() + h @ cell.recurrent_kernel.numpy() + cell.bias.numpy()
    i, j, f, o = np.split(z, 4, axis=1)
    c = c * _sigmoid(f + cell.forget_bias) + _sigmoid(i) * np.tanh(j)
    h = np.tanh(c) * _sigmoid(o)
    return c, h


def np_gru_step(cell, x, h):
    xr, xu, xn = np.split(x @ cell.input_kernel.numpy() + cell.bias.numpy(), 3, axis=1)
    hr, hu, hn = np.split(h @ cell.recurrent_kernel.numpy(), 3, axis=1)
    r, u = _sigmoid(xr + hr), _sigmoid(xu + hu)
    n = np.tanh(xn + r * hn)
    return u * h + (1 - u) * n


def _random(*shape, seed=0):
    return np.random.RandomState(seed).normal(size=shape).astype(np.float32)


@pytest.mark.parametrize("forget_bias", [0.0, 1.0])
def test_lstm_cell_matches_numpy(run, forget_bias):
    cell = LSTMCell(input_size=3, hidden_size=5, forget_bias=forget_bias, init_scale=0.5)
    x, c, h = _random(4, 3), _random(4, 5, seed=1), _random(4, 5, seed=2)
    output, state = run(cell, tf.constant(x), LSTMState(tf.constant(c), tf.constant(h)))
    want_c, want_h = np_lstm_step(cell, x, c, h)
    np.testing.assert_allclose(state.cell, want_c, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state.hidden, want_h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(output, want_h, rtol=1e-5, atol=1e-6)


def test_lstm_forget_bias_changes_output():
    a = LSTMCell(input_size=2, hidden_size=3, forget_bias=0.0)
    b = LSTMCell(input_size=2, hidden_size=3, forget_bias=1.0)
    for va, vb in zip(a.variables, b.variables):
        vb.assign(va)
    x = tf.constant(_random(2, 2))
    state = LSTMState(tf.constant(_random(2, 3, seed=1)), tf.constant(_random(2, 3, seed=2)))
    assert not np.allclose(a(x, state)[0], b(x, state)[0])


def test_gru_cell_matches_numpy(run):
    cell = GRUCell(input_size=3, hidden_size=5, init_scale=0.5)
    x, h = _random(4, 3), _random(4, 5, seed=1)
    output, state = run(cell, tf.constant(x), tf.constant(h))
    np.testing.assert_allclose(state, np_gru_step(cell, x, h), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(output, state)


def test_cells_hold_all_gates_in_one_kernel():
    lstm = LSTMCell(input_size=3, hidden_size=5)
    gru = GRUCell(input_size=3, hidden_size=5)
    assert lstm.input_kernel.shape == (3, 20) and lstm.recurrent_kernel.shape == (5, 20)
    assert gru.input_kernel.shape == (3, 15) and gru.recurrent_kernel.shape == (5, 15)


@pytest.mark.parametrize("forget_bias", [0.0, 1.0])
@pytest.mark.parametrize("final_state_used", [False, True])
def test_lstm_hand_written_backward_equals_automatic_differentiation(run, forget_bias, final_state_used):
    """LSTMCell.unroll_projected's own backward pass against autodiff of the plain step loop."""
    cell = LSTMCell(input_size=3, hidden_size=5, forget_bias=forget_bias)
    projected = tf.constant(_random(2, 7, 20, seed=1))  # [batch, time, 4 * hidden]
    state = LSTMState(tf.constant(_random(2, 5, seed=2)), tf.constant(_random(2, 5, seed=3)))
    d_out = _random(2, 7, 5, seed=4)  # a different upstream gradient at every output
    d_cell, d_hidden = _random(2, 5, seed=5), _random(2, 5, seed=6)

    def gradients(unroll):
        def fn(projected, cell_state, hidden):
            with tf.GradientTape() as tape:
                tape.watch([projected, cell_state, hidden])
                outputs, final = unroll(projected, LSTMState(cell_state, hidden))
                loss = tf.reduce_sum(outputs * d_out)
                if final_state_used:  # the next window's gradient flows back through the state
                    loss += tf.reduce_sum(final.cell * d_cell) + tf.reduce_sum(final.hidden * d_hidden)
            return tape.gradient(loss, [projected, cell_state, hidden, cell.recurrent_kernel])
        return run(fn, projected, *state)

    want = gradients(lambda p, s: rnn.RecurrentCell.unroll_projected(cell, p, s))  # autodiff
    got = gradients(cell.unroll_projected)  # hand-written
    for name, a, b in zip(["inputs", "cell state", "hidden state", "recurrent kernel"], got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)
