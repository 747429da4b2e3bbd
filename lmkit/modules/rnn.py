"""Recurrent cells, a multi-layer stack and a teacher-forced RNN decoder.

A cell does one step, ``cell(inputs, state) -> (output, new_state)``, plus
``initial_state(batch_size)``. Its kernel is split in two so that unrolling
can hoist the input half out of the time loop:

* ``input_kernel`` [input_size, gates * hidden] (and ``bias``) is applied to
  all time steps at once by :meth:`RecurrentCell.project_inputs`: one
  [batch * time, input] x [input, gates * hidden] matmul;
* ``recurrent_kernel`` [hidden, gates * hidden] is the only matmul left in
  the loop (:meth:`RecurrentCell.step_projected`), all gates in one multiply,
  with no per-step ``concat([x, h])``.

:func:`unroll` runs one cell over a sequence; :class:`StackedRNN` runs its
layers one after the other over the whole window (layer-wise), so every
layer's input projection is a single large matmul.

Loop choice, measured on this 2-core CPU (2 layers, batch 20, forward and
backward of one step under ``tf.function``):

=====================================  ===============  ===============
loop                                   T=20, hidden 200  T=35, hidden 650
=====================================  ===============  ===============
Python loop over a static time axis    61-65 ms          690-910 ms
``tf.while_loop`` + ``TensorArray``    80-100 ms         800 ms
per-step ``concat([x, h]) @ W``        77-134 ms         -
fused ``tf.raw_ops.BlockLSTM``         67-75 ms          1280 ms
=====================================  ===============  ===============

(a busy shared machine, hence the ranges). The static Python loop wins, so
:func:`unroll` uses it whenever the time axis is static and at most
``MAX_STATIC_UNROLL`` long, and falls back to ``tf.while_loop`` otherwise.

On that static path :class:`LSTMCell` brings its own backward pass
(:meth:`LSTMCell.unroll_projected`): one recurrent matmul per step instead
of two, the recurrent kernel's gradient as one matmul over all steps, and
the fused ``SigmoidGrad``/``TanhGrad`` kernels. Forward and backward of the
2-layer, T=20, hidden 200 stack above then take 32 ms of CPU time instead of
37 ms (one thread; 50 instead of 58 ms with two), with gradients equal to
automatic differentiation's to float32 rounding (tested in
``tests/modules/test_modules_rnn.py``; ``docs/performance.md`` has where a
whole training step's time goes).
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import tensorflow as tf

from lmkit.modules.base import (Module, Training, check_float, check_positive_float,
                                check_positive_int, check_rate, dropout, leading_shape, uniform_initializer)

__all__ = [
    "GRUCell",
    "LSTMCell",
    "LSTMState",
    "MAX_STATIC_UNROLL",
    "RNNDecoder",
    "RecurrentCell",
    "StackedRNN",
    "unroll",
]

# Longer static windows use tf.while_loop so graphs stay small.
MAX_STATIC_UNROLL = 128

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
        inputs = tf.convert_to_tensor(inputs)
        gates = self.num_gates * self.hidden_size
        if inputs.shape.rank == 2:
            return tf.nn.bias_add(tf.matmul(inputs, self.input_kernel), self.bias)
        flat = tf.reshape(inputs, [-1, self.input_size])  # [batch * time, input]
        projected = tf.nn.bias_add(tf.matmul(flat, self.input_kernel), self.bias)  # [batch * time, gates]
        return tf.reshape(projected, leading_shape(inputs) + [gates])

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
          ``(output [batch, hidden_size], new_state)``.
        """
        return self.step_projected(self.project_inputs(inputs), state)

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
        z = projected + tf.matmul(hidden, self.recurrent_kernel)  # [batch, 4 * hidden]
        i, j, f, o = tf.split(z, 4, axis=1)
        if self.forget_bias:
            f = f + self.forget_bias
        new_cell = cell * tf.sigmoid(f) + tf.sigmoid(i) * tf.tanh(j)  # [batch, hidden]
        new_hidden = tf.tanh(new_cell) * tf.sigmoid(o)  # [batch, hidden]
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
        kernel = tf.convert_to_tensor(self.recurrent_kernel)  # [hidden, 4 * hidden]
        outputs, cell, hidden = _lstm_unroll(projected, state.cell, state.hidden, kernel, self.forget_bias)
        return outputs, LSTMState(cell, hidden)

    def initial_state(self, batch_size: Union[int, tf.Tensor]) -> LSTMState:
        zeros = tf.zeros([batch_size, self.hidden_size], tf.float32)
        return LSTMState(zeros, zeros)

    def get_config(self) -> Dict[str, Any]:
        return {"input_size": self.input_size, "hidden_size": self.hidden_size,
                "forget_bias": self.forget_bias, "init_scale": self.init_scale, "name": self.name}


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
            i, j, f, o = tf.split(z, 4, axis=1)
            if forget_bias:
                f = f + forget_bias
            gate_i, gate_j, gate_f, gate_o = tf.sigmoid(i), tf.tanh(j), tf.sigmoid(f), tf.sigmoid(o)
            new_cell = cell * gate_f + gate_i * gate_j  # [batch, hidden]
            squashed = tf.tanh(new_cell)
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
        h_r, h_u, h_n = tf.split(tf.matmul(state, self.recurrent_kernel), 3, axis=1)
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


def unroll(cell: RecurrentCell, inputs: tf.Tensor, state: CellState) -> Tuple[tf.Tensor, CellState]:
    """Runs ``cell`` over every time step of ``inputs``.

    The input projection of all steps is one matmul; only the recurrent
    matmul and the gate arithmetic run per step, in a Python loop when the
    time axis is static (fastest on CPU, see the module docstring) and in a
    ``tf.while_loop`` otherwise.

    Args:
      cell: the cell.
      inputs: [batch, time, input_size] float32.
      state: the state before the first step.

    Returns:
      ``(outputs [batch, time, hidden_size], final_state)``.
    """
    projected = cell.project_inputs(inputs)  # [batch, time, gates]
    num_steps = projected.shape[1]
    if num_steps is not None and 0 < num_steps <= MAX_STATIC_UNROLL:
        return cell.unroll_projected(projected, state)

    time_major = tf.transpose(projected, [1, 0, 2])  # [time, batch, gates]
    length = tf.shape(time_major)[0]
    outputs_ta = tf.TensorArray(tf.float32, size=length, element_shape=tf.TensorShape([None, cell.hidden_size]))

    def body(t, state, outputs_ta):
        output, state = cell.step_projected(time_major[t], state)
        return t + 1, state, outputs_ta.write(t, output)

    _, state, outputs_ta = tf.while_loop(lambda t, *_: t < length, body, (tf.constant(0), state, outputs_ta))
    outputs = tf.transpose(outputs_ta.stack(), [1, 0, 2])  # [batch, time, hidden]
    return outputs, state


class StackedRNN(Module):
    """Layers of recurrent cells with dropout on every layer's output.

    With a :class:`lmkit.modules.WordEmbedder` that drops its output at the
    same rate, this is the dropout of Zaremba et al. (2014): on the embedding
    output, between layers and on the top output, only while training, and
    never on the recurrent connections.

    State: a tuple with one cell state per layer.
    ``get_config`` lists the cells' configs under ``cells`` (the cells
    themselves are modules: pass them again to rebuild).
    """

    def __init__(self,
                 *,
                 cells: Sequence[RecurrentCell],
                 dropout: float = 0.0,
                 name: Optional[str] = None) -> None:
        """Stacks the cells.

        Args:
          cells: the layers, bottom first; each one's ``input_size`` must be
            the previous one's ``hidden_size``.
          dropout: rate of dropout on every layer's output while training.
          name: module name.

        Raises:
          ValueError: no cells, a cell of the wrong type, or mismatched sizes.
        """
        super().__init__(name=name)
        cells = list(cells)
        if not cells:
            raise ValueError("cells [] is empty; pass at least one cell")
        for i, cell in enumerate(cells):
            if not isinstance(cell, RecurrentCell):
                raise ValueError(f"cells[{i}] {cell!r} must be a RecurrentCell (LSTMCell, GRUCell)")
            if i and cell.input_size != cells[i - 1].hidden_size:
                raise ValueError(f"cells[{i}].input_size {cell.input_size} must equal "
                                 f"cells[{i - 1}].hidden_size {cells[i - 1].hidden_size}")
        self.cells = cells
        self.dropout = check_rate("dropout", dropout)

    @property
    def input_size(self) -> int:
        return self.cells[0].input_size

    @property
    def hidden_size(self) -> int:
        return self.cells[-1].hidden_size

    def initial_state(self, batch_size: Union[int, tf.Tensor]) -> Tuple[CellState, ...]:
        """Zero state: a tuple with one state per layer, batch first."""
        return tuple(cell.initial_state(batch_size) for cell in self.cells)

    def __call__(self,
                 inputs: tf.Tensor,
                 state: Sequence[CellState],
                 training: Training = False) -> Tuple[tf.Tensor, Tuple[CellState, ...]]:
        """One step through every layer.

        Args:
          inputs: [batch, input_size] float32.
          state: one state per layer.
          training: apply dropout.

        Returns:
          ``(output [batch, hidden_size], new_state)``.
        """
        self._check_state(state)
        new_state = []
        x = inputs
        for cell, layer_state in zip(self.cells, state):
            x, layer_state = cell(x, layer_state)
            x = dropout(x, self.dropout, training)
            new_state.append(layer_state)
        return x, tuple(new_state)

    def unroll(self,
               inputs: tf.Tensor,
               state: Optional[Sequence[CellState]] = None,
               training: Training = False) -> Tuple[tf.Tensor, Tuple[CellState, ...]]:
        """Runs the stack over a window, one whole layer at a time.

        Args:
          inputs: [batch, time, input_size] float32.
          state: one state per layer; zeros when None.
          training: apply dropout (independent masks per step, as in a
            step-by-step run).

        Returns:
          ``(outputs [batch, time, hidden_size], final_state)``.
        """
        if state is None:
            state = self.initial_state(tf.shape(inputs)[0])
        self._check_state(state)
        new_state = []
        x = inputs
        for cell, layer_state in zip(self.cells, state):
            x, layer_state = unroll(cell, x, layer_state)  # [batch, time, hidden]
            x = dropout(x, self.dropout, training)
            new_state.append(layer_state)
        return x, tuple(new_state)

    def _check_state(self, state: Sequence[CellState]) -> None:
        if len(state) != len(self.cells):
            raise ValueError(f"state has {len(state)} layers but the stack has {len(self.cells)}; "
                             f"use initial_state(batch_size) or the state this stack returned")

    def get_config(self) -> Dict[str, Any]:
        return {"cells": [cell.get_config() for cell in self.cells], "dropout": self.dropout,
                "name": self.name}


_CELLS = ("lstm", "gru")


class RNNDecoder(Module):
    """A multi-layer LSTM or GRU run teacher-forced over [batch, time] windows.

    ``__call__`` unrolls a whole window (layer-wise, see :class:`StackedRNN`)
    and returns the final state, which the next BPTT window takes as its
    initial state; :meth:`step` advances one time step for decoding.

    Variables: ``layer_<i>/input_kernel``, ``layer_<i>/recurrent_kernel`` and
    ``layer_<i>/bias`` for each layer ``i``.
    """

    def __init__(self,
                 *,
                 input_size: int,
                 hidden_size: int,
                 num_layers: int = 1,
                 cell: str = "lstm",
                 dropout: float = 0.0,
                 forget_bias: float = 0.0,
                 init_scale: float = 0.1,
                 name: Optional[str] = None) -> None:
        """Creates the layers.

        Args:
          input_size: size of the inputs (the embedding size).
          hidden_size: size of every layer.
          num_layers: number of layers.
          cell: ``"lstm"`` or ``"gru"``.
          dropout: rate of dropout on every layer's output while training.
          forget_bias: LSTM forget-gate bias (must be 0 for a GRU).
          init_scale: every variable from uniform(-init_scale, init_scale).
          name: module name.

        Raises:
          ValueError: an unknown cell, a bad size or rate, or a forget bias
            for a GRU.
        """
        super().__init__(name=name)
        if cell not in _CELLS:
            raise ValueError(f"cell {cell!r} is not one of {', '.join(_CELLS)}")
        if cell == "gru" and forget_bias:
            raise ValueError(f"forget_bias {forget_bias!r} applies to LSTM cells only; "
                             f"use forget_bias=0.0 with cell='gru'")
        self.cell_type = cell
        self.num_layers = check_positive_int("num_layers", num_layers)
        self.input_size = check_positive_int("input_size", input_size)
        self.hidden_size = check_positive_int("hidden_size", hidden_size)
        self.forget_bias = check_float("forget_bias", forget_bias)
        self.init_scale = check_positive_float("init_scale", init_scale)
        with self.name_scope:
            cells: List[RecurrentCell] = []
            for i in range(num_layers):
                size = input_size if i == 0 else hidden_size
                if cell == "lstm":
                    cells.append(LSTMCell(input_size=size, hidden_size=hidden_size, forget_bias=forget_bias,
                                          init_scale=init_scale, name=f"layer_{i}"))
                else:
                    cells.append(GRUCell(input_size=size, hidden_size=hidden_size, init_scale=init_scale,
                                         name=f"layer_{i}"))
            self.core = StackedRNN(cells=cells, dropout=dropout, name="stack")

    @property
    def cells(self) -> List[RecurrentCell]:
        return self.core.cells

    @property
    def dropout(self) -> float:
        return self.core.dropout

    def initial_state(self, batch_size: Union[int, tf.Tensor]) -> Tuple[CellState, ...]:
        """Zero state: one state per layer, every tensor [batch, hidden_size]."""
        return self.core.initial_state(batch_size)

    def __call__(self,
                 inputs: tf.Tensor,
                 state: Optional[Sequence[CellState]] = None,
                 training: Training = False) -> Tuple[tf.Tensor, Tuple[CellState, ...]]:
        """Teacher-forced pass over a window.

        Args:
          inputs: [batch, time, input_size] float32.
          state: the state after the previous window; zeros when None.
          training: apply dropout.

        Returns:
          ``(outputs [batch, time, hidden_size], final_state)``.
        """
        return self.core.unroll(inputs, state, training)

    def step(self,
             inputs: tf.Tensor,
             state: Sequence[CellState],
             training: Training = False) -> Tuple[tf.Tensor, Tuple[CellState, ...]]:
        """One decoding step.

        Args:
          inputs: [batch, input_size] float32.
          state: the previous state.
          training: apply dropout.

        Returns:
          ``(outputs [batch, hidden_size], new_state)``.
        """
        return self.core(inputs, state, training)

    def get_config(self) -> Dict[str, Any]:
        return {"input_size": self.input_size, "hidden_size": self.hidden_size,
                "num_layers": self.num_layers, "cell": self.cell_type, "dropout": self.dropout,
                "forget_bias": self.forget_bias, "init_scale": self.init_scale, "name": self.name}
