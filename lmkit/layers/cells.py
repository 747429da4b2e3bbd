"""Recurrent cells whose input projection is hoisted out of the time loop.

A cell does one step, ``cell(inputs, state) -> (output, new_state)``, plus
``initial_state(batch_size)``. Its kernel is split in two so that unrolling
can hoist the input half out of the time loop:

* ``input_kernel`` [input_size, gates * hidden] (and ``bias``) is applied to
  all time steps at once by :meth:`RecurrentCell.project_inputs`: one
  [batch * time, input] x [input, gates * hidden] matmul;
* ``recurrent_kernel`` [hidden, gates * hidden] is the only matmul left in
  the loop (:meth:`RecurrentCell.step_projected`), all gates in one multiply,
  with no per-step ``concat([x, h])``.

:class:`LSTMCell` also brings its own backward pass for a static window
(:meth:`LSTMCell.unroll_projected`): one recurrent matmul per step instead
of two, the recurrent kernel's gradient as one matmul over all steps, and
the fused ``SigmoidGrad``/``TanhGrad`` kernels, with gradients equal to
automatic differentiation's to float32 rounding (tested in
``tests/layers/test_cells.py``; measured in ``docs/performance.md``).
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Union

import tensorflow as tf

from lmkit.layers.base import (
    Module,
    check_float,
    check_positive_float,
    check_positive_int,
    matmul_last_axis,
    uniform_initializer,
)
from lmkit.layers.precision import cast_like, state_in_dtype_of

__all__ = ["CellState", "GRUCell", "LSTMCell", "LSTMState", "RecurrentCell"]

CellState = Union[tf.Tensor, "LSTMState"]


class LSTMState(NamedTuple):
    """State of an :class:`LSTMCell`; both tensors are [batch, hidden]."""

    cell: tf.Tensor
    hidden: tf.Tensor


class RecurrentCell(Module):
    """A one-step recurrent core whose input projection can be precomputed.

    Subclasses set ``input_size``, ``hidden_size``, ``num_gates``, create
    ``input_kernel``, ``recurrent_kernel`` and ``bias`` and implement
    :meth:`step_projected` and :meth:`initial_state`.
    """

    input_size: int
    hidden_size: int
    num_gates: int

    def _create_variables(self, init_scale: float) -> None:
        initializer = uniform_initializer(init_scale)
        gates = self.num_gates * self.hidden_size
        with self.name_scope:
            self.input_kernel = tf.Variable(initializer([self.input_size, gates], tf.float32),
                                            name="input_kernel")
            self.recurrent_kernel = tf.Variable(initializer([self.hidden_size, gates], tf.float32),
                                                name="recurrent_kernel")
            # Zaremba et al. initialise every parameter, biases included, uniformly.
            self.bias = tf.Variable(initializer([gates], tf.float32), name="bias")

    def project_inputs(self, inputs: tf.Tensor) -> tf.Tensor:
        """The input half of every gate, for any number of steps at once.

        Args:
          inputs: [..., input_size] float32 (e.g. [batch, time, input_size]).

        Returns:
          [..., num_gates * hidden_size]: ``inputs @ input_kernel + bias``.
        """
        return matmul_last_axis(inputs, self.input_kernel, self.bias)  # [..., gates * hidden]

    def step_projected(self, projected: tf.Tensor, state: CellState) -> Tuple[tf.Tensor, CellState]:
        """One step from precomputed input projections.

        Args:
          projected: [batch, num_gates * hidden_size] from :meth:`project_inputs`.
          state: the previous state.

        Returns:
          ``(output [batch, hidden_size], new_state)``.
        """
        raise NotImplementedError

    def initial_state(self, batch_size: Union[int, tf.Tensor]) -> CellState:
        """Zero state for ``batch_size`` rows."""
        raise NotImplementedError

    def __call__(self, inputs: tf.Tensor, state: CellState) -> Tuple[tf.Tensor, CellState]:
        """One step.

        Args:
          inputs: [batch, input_size] float32.
          state: the previous state.

        Returns:
          ``(output [batch, hidden_size], new_state)``; the state keeps its
          dtypes (float32 when the inputs are in a mixed-precision dtype).
        """
        projected = self.project_inputs(inputs)
        return state_in_dtype_of(projected, state, lambda s: self.step_projected(projected, s))

    def unroll_projected(self, projected: tf.Tensor, state: CellState) -> Tuple[tf.Tensor, CellState]:
        """Runs the cell over a window of precomputed input projections.

        Args:
          projected: [batch, time, num_gates * hidden_size] from
            :meth:`project_inputs`, with a static ``time``.
          state: the state before the first step.

        Returns:
          ``(outputs [batch, time, hidden_size], final_state)``.
        """
        outputs: List[tf.Tensor] = []
        for step_inputs in tf.unstack(projected, axis=1):  # each [batch, gates]
            output, state = self.step_projected(step_inputs, state)
            outputs.append(output)
        return tf.stack(outputs, axis=1), state  # [batch, time, hidden]


class LSTMCell(RecurrentCell):
    """The LSTM of Zaremba et al. (2014), without peepholes.

    Gates i (input), j (new input), f (forget), o (output), in this order
    along the last axis of the kernels::

        c' = c * sigmoid(f + forget_bias) + sigmoid(i) * tanh(j)
        h' = tanh(c') * sigmoid(o)

    Variables: ``input_kernel`` [input_size, 4 * hidden_size],
    ``recurrent_kernel`` [hidden_size, 4 * hidden_size], ``bias``
    [4 * hidden_size], all from uniform(-init_scale, init_scale).
    State: :class:`LSTMState` ``(cell, hidden)``; the output is ``hidden``.
    """

    num_gates = 4

    def __init__(self,
                 *,
                 input_size: int,
                 hidden_size: int,
                 forget_bias: float = 0.0,
                 init_scale: float = 0.1,
                 name: Optional[str] = None) -> None:
        """Creates the variables.

        Args:
          input_size: size of the inputs.
          hidden_size: size of the state and output.
          forget_bias: added to the forget gate's pre-activation (0 in Zaremba
            et al.; 1 helps early training of larger models).
          init_scale: every variable from uniform(-init_scale, init_scale).
          name: module name.

        Raises:
          ValueError: a size is not a positive integer, ``forget_bias`` is not
            a number or ``init_scale`` <= 0.
        """
        super().__init__(name=name)
        self.input_size = check_positive_int("input_size", input_size)
        self.hidden_size = check_positive_int("hidden_size", hidden_size)
        self.forget_bias = check_float("forget_bias", forget_bias)
        self.init_scale = check_positive_float("init_scale", init_scale)
        self._create_variables(init_scale)

    def step_projected(self, projected: tf.Tensor, state: LSTMState) -> Tuple[tf.Tensor, LSTMState]:
        cell, hidden = state
        z = projected + tf.matmul(hidden, cast_like(self.recurrent_kernel, projected))  # [batch, 4 * hidden]
        _, _, _, gate_o, new_cell, squashed = _lstm_gates(z, cell, self.forget_bias)
        new_hidden = squashed * gate_o  # [batch, hidden]
        return new_hidden, LSTMState(new_cell, new_hidden)

    def unroll_projected(self, projected: tf.Tensor, state: LSTMState) -> Tuple[tf.Tensor, LSTMState]:
        """Runs the cell over a window, with a hand-written backward pass.

        The forward pass is :meth:`step_projected` once per step. Automatic
        differentiation of that loop would compute the recurrent kernel's
        gradient as one small [hidden, batch] x [batch, 4 * hidden] matmul per
        step, summed by an ``AddN``; the backward pass here keeps only the
        serial part in the loop (``dz_t @ recurrent_kernel^T``), uses the fused
        ``SigmoidGrad`` / ``TanhGrad`` kernels, and computes the kernel's
        gradient for all steps in one [hidden, batch * time] x
        [batch * time, 4 * hidden] matmul.

        Args:
          projected: [batch, time, 4 * hidden_size] from :meth:`project_inputs`.
          state: the state before the first step.

        Returns:
          ``(outputs [batch, time, hidden_size], final_state)``.
        """
        # Read once, outside the custom gradient: its gradient then flows to the variable.
        # Mixed precision: cast to the projections' dtype (the cast returns a float32 gradient).
        kernel = cast_like(tf.convert_to_tensor(self.recurrent_kernel), projected)  # [hidden, 4 * hidden]
        outputs, cell, hidden = _lstm_unroll(projected, state.cell, state.hidden, kernel, self.forget_bias)
        return outputs, LSTMState(cell, hidden)

    def initial_state(self, batch_size: Union[int, tf.Tensor]) -> LSTMState:
        zeros = tf.zeros([batch_size, self.hidden_size], tf.float32)
        return LSTMState(zeros, zeros)

    def get_config(self) -> Dict[str, Any]:
        return {"input_size": self.input_size, "hidden_size": self.hidden_size,
                "forget_bias": self.forget_bias, "init_scale": self.init_scale, "name": self.name}


def _lstm_gates(z: tf.Tensor, cell: tf.Tensor, forget_bias: float) -> Tuple[tf.Tensor, ...]:
    """The LSTM gates of pre-activations ``z`` [batch, 4 * hidden] (order i, j, f, o).

    Returns:
      ``(sigmoid(i), tanh(j), sigmoid(f + forget_bias), sigmoid(o), new_cell,
      tanh(new_cell))``, each [batch, hidden], where
      ``new_cell = cell * sigmoid(f) + sigmoid(i) * tanh(j)``.
    """
    i, j, f, o = tf.split(z, 4, axis=1)
    if forget_bias:
        f = f + forget_bias
    gate_i, gate_j, gate_f, gate_o = tf.sigmoid(i), tf.tanh(j), tf.sigmoid(f), tf.sigmoid(o)
    new_cell = cell * gate_f + gate_i * gate_j  # [batch, hidden]
    return gate_i, gate_j, gate_f, gate_o, new_cell, tf.tanh(new_cell)


def _lstm_unroll(projected: tf.Tensor, cell: tf.Tensor, hidden: tf.Tensor, kernel: tf.Tensor,
                 forget_bias: float) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """:meth:`LSTMCell.unroll_projected` as a function of tensors, with its gradient.

    Args:
      projected: [batch, time, 4 * hidden] input projections (static time).
      cell: [batch, hidden] initial cell state.
      hidden: [batch, hidden] initial hidden state.
      kernel: [hidden, 4 * hidden] recurrent kernel.
      forget_bias: added to the forget gate.

    Returns:
      ``(outputs [batch, time, hidden], final cell, final hidden)``.
    """

    @tf.custom_gradient
    def forward(projected, cell, hidden, kernel):
        saved = []  # per step: sigmoid(i), tanh(j), sigmoid(f), sigmoid(o), tanh(c'), c
        hiddens_in = []  # the hidden state each step starts from
        outputs = []
        for step_inputs in tf.unstack(projected, axis=1):  # each [batch, 4 * hidden]
            hiddens_in.append(hidden)
            z = step_inputs + tf.matmul(hidden, kernel)  # [batch, 4 * hidden]
            gate_i, gate_j, gate_f, gate_o, new_cell, squashed = _lstm_gates(z, cell, forget_bias)
            saved.append((gate_i, gate_j, gate_f, gate_o, squashed, cell))
            cell = new_cell
            hidden = squashed * gate_o  # [batch, hidden]
            outputs.append(hidden)

        def backward(d_outputs, d_cell, d_hidden):
            # Unconnected outputs (e.g. the final state) may come as None.
            d_cell = tf.zeros_like(cell) if d_cell is None else d_cell
            d_hidden = tf.zeros_like(hidden) if d_hidden is None else d_hidden
            d_steps = tf.unstack(d_outputs, axis=1) if d_outputs is not None else [None] * len(saved)
            d_gates = [None] * len(saved)
            for t in reversed(range(len(saved))):
                gate_i, gate_j, gate_f, gate_o, squashed, cell_in = saved[t]
                if d_steps[t] is not None:
                    d_hidden = d_hidden + d_steps[t]
                d_o = tf.raw_ops.SigmoidGrad(y=gate_o, dy=d_hidden * squashed)
                d_cell = d_cell + tf.raw_ops.TanhGrad(y=squashed, dy=d_hidden * gate_o)
                d_i = tf.raw_ops.SigmoidGrad(y=gate_i, dy=d_cell * gate_j)
                d_j = tf.raw_ops.TanhGrad(y=gate_j, dy=d_cell * gate_i)
                d_f = tf.raw_ops.SigmoidGrad(y=gate_f, dy=d_cell * cell_in)
                d_gates[t] = tf.concat([d_i, d_j, d_f, d_o], axis=1)  # [batch, 4 * hidden]
                d_cell = d_cell * gate_f
                d_hidden = tf.matmul(d_gates[t], kernel, transpose_b=True)  # [batch, hidden]
            d_projected = tf.stack(d_gates, axis=1)  # [batch, time, 4 * hidden]
            hidden_size = kernel.shape[0]
            flat_hiddens = tf.reshape(tf.stack(hiddens_in, axis=1), [-1, hidden_size])  # [batch * time, hidden]
            flat_gates = tf.reshape(d_projected, [-1, 4 * hidden_size])  # [batch * time, 4 * hidden]
            d_kernel = tf.matmul(flat_hiddens, flat_gates, transpose_a=True)  # [hidden, 4 * hidden]
            return d_projected, d_cell, d_hidden, d_kernel

        return (tf.stack(outputs, axis=1), cell, hidden), backward

    return forward(projected, cell, hidden, kernel)


class GRUCell(RecurrentCell):
    """A GRU with the reset gate applied after the recurrent matmul (cuDNN's form).

    Gates r (reset), u (update), n (candidate), in this order::

        x_r, x_u, x_n = split(x @ input_kernel + bias)
        h_r, h_u, h_n = split(h @ recurrent_kernel)
        r = sigmoid(x_r + h_r);  u = sigmoid(x_u + h_u)
        n = tanh(x_n + r * h_n)
        h' = u * h + (1 - u) * n

    Applying r after the matmul keeps one recurrent matmul per step (the
    original form needs a second one on ``r * h``).

    Variables: ``input_kernel`` [input_size, 3 * hidden_size],
    ``recurrent_kernel`` [hidden_size, 3 * hidden_size], ``bias``
    [3 * hidden_size]. State: a [batch, hidden_size] tensor, also the output.
    """

    num_gates = 3

    def __init__(self,
                 *,
                 input_size: int,
                 hidden_size: int,
                 init_scale: float = 0.1,
                 name: Optional[str] = None) -> None:
        """Creates the variables.

        Args:
          input_size: size of the inputs.
          hidden_size: size of the state and output.
          init_scale: every variable from uniform(-init_scale, init_scale).
          name: module name.

        Raises:
          ValueError: a size is not a positive integer or ``init_scale`` <= 0.
        """
        super().__init__(name=name)
        self.input_size = check_positive_int("input_size", input_size)
        self.hidden_size = check_positive_int("hidden_size", hidden_size)
        self.init_scale = check_positive_float("init_scale", init_scale)
        self._create_variables(init_scale)

    def step_projected(self, projected: tf.Tensor, state: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        x_r, x_u, x_n = tf.split(projected, 3, axis=1)
        h_r, h_u, h_n = tf.split(tf.matmul(state, cast_like(self.recurrent_kernel, projected)), 3, axis=1)
        reset = tf.sigmoid(x_r + h_r)  # [batch, hidden]
        update = tf.sigmoid(x_u + h_u)
        candidate = tf.tanh(x_n + reset * h_n)
        new_state = update * state + (1.0 - update) * candidate  # [batch, hidden]
        return new_state, new_state

    def initial_state(self, batch_size: Union[int, tf.Tensor]) -> tf.Tensor:
        return tf.zeros([batch_size, self.hidden_size], tf.float32)

    def get_config(self) -> Dict[str, Any]:
        return {"input_size": self.input_size, "hidden_size": self.hidden_size,
                "init_scale": self.init_scale, "name": self.name}
