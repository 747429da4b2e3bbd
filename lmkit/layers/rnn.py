"""Unrolling recurrent cells, a multi-layer stack and a teacher-forced RNN decoder.

The cells (:class:`LSTMCell`, :class:`GRUCell`) live in
:mod:`lmkit.layers.cells` and are re-exported here. :func:`unroll` runs one cell over a sequence;
:class:`StackedRNN` runs its layers one after the other over the whole
window (layer-wise), so every layer's input projection is a single large
matmul.

A static Python loop over the time axis is faster on CPU than
``tf.while_loop``, a per-step ``concat([x, h])`` or the fused ``BlockLSTM``
(``docs/performance.md`` has the measurements), so :func:`unroll` uses it
whenever the time axis is static and at most ``MAX_STATIC_UNROLL`` long, and
falls back to ``tf.while_loop`` otherwise. On that static path
:class:`LSTMCell` brings its own backward pass.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.layers.base import (
    Module,
    Training,
    check_float,
    check_positive_float,
    check_positive_int,
    check_rate,
    dropout,
)
from lmkit.layers.cells import CellState, GRUCell, LSTMCell, LSTMState, RecurrentCell
from lmkit.layers.precision import state_in_dtype_of

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
      ``(outputs [batch, time, hidden_size], final_state)``: the outputs in
      the inputs' dtype; the state in the dtypes it came in (a float32 state
      runs in a mixed-precision compute dtype inside and leaves as float32).
    """
    projected = cell.project_inputs(inputs)  # [batch, time, gates]
    num_steps = projected.shape[1]
    if num_steps is not None and 0 < num_steps <= MAX_STATIC_UNROLL:
        return state_in_dtype_of(projected, state, lambda s: cell.unroll_projected(projected, s))

    time_major = tf.transpose(projected, [1, 0, 2])  # [time, batch, gates]
    length = tf.shape(time_major)[0]

    def loop(state):
        outputs_ta = tf.TensorArray(projected.dtype, size=length,
                                    element_shape=tf.TensorShape([None, cell.hidden_size]))

        def body(t, state, outputs_ta):
            output, state = cell.step_projected(time_major[t], state)
            return t + 1, state, outputs_ta.write(t, output)

        _, state, outputs_ta = tf.while_loop(lambda t, *_: t < length, body,
                                             (tf.constant(0), state, outputs_ta))
        return tf.transpose(outputs_ta.stack(), [1, 0, 2]), state  # [batch, time, hidden]

    return state_in_dtype_of(projected, state, loop)


class StackedRNN(Module):
    """Layers of recurrent cells with dropout on every layer's output.

    With a :class:`lmkit.layers.WordEmbedder` that drops its output at the
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
            raise UsageError("cells [] is empty; pass at least one cell")
        for i, cell in enumerate(cells):
            if not isinstance(cell, RecurrentCell):
                raise UsageError(f"cells[{i}] {cell!r} must be a RecurrentCell (LSTMCell, GRUCell)")
            if i and cell.input_size != cells[i - 1].hidden_size:
                raise UsageError(f"cells[{i}].input_size {cell.input_size} must equal "
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
        return self._through_layers(inputs, state, training, lambda cell, x, s: cell(x, s))

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
        return self._through_layers(inputs, state, training, unroll)  # [batch, time, hidden]

    def _through_layers(self, x: tf.Tensor, state: Sequence[CellState], training: Training,
                        run_layer) -> Tuple[tf.Tensor, Tuple[CellState, ...]]:
        """``run_layer(cell, x, layer_state)`` for each layer in turn, dropout after each."""
        if len(state) != len(self.cells):
            raise UsageError(f"state has {len(state)} layers but the stack has {len(self.cells)}; "
                             f"use initial_state(batch_size) or the state this stack returned")
        new_state = []
        for cell, layer_state in zip(self.cells, state):
            x, layer_state = run_layer(cell, x, layer_state)
            x = dropout(x, self.dropout, training)
            new_state.append(layer_state)
        return x, tuple(new_state)

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
            raise UsageError(f"cell {cell!r} is not one of {', '.join(_CELLS)}")
        if cell == "gru" and forget_bias:
            raise UsageError(f"forget_bias {forget_bias!r} applies to LSTM cells only; "
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
