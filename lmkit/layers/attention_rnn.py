"""Recurrent encoder-decoder blocks: an RNN encoder (one or both directions) and an RNN decoder with attention.

* :class:`RNNEncoder`: LSTM or GRU layers over a padded source; with
  ``bidirectional`` a second stack reads each row backwards from its last
  token (``tf.reverse_sequence``), and the outputs are concatenated.
* :class:`AttentionRNNDecoder`: an :class:`~lmkit.layers.RNNDecoder` that
  attends to the encoder's outputs at every step, Luong et al. (2015)
  (``"luong"``: multiplicative scores from the new hidden state, input
  feeding of the last attentional vector) or Bahdanau et al. (2015)
  (``"bahdanau"``: additive scores from the previous hidden state, the
  context fed into the cell). Both return the attentional vector
  ``tanh(W_c [context; h])`` [batch, hidden_size] per step.

The memory's projection (its keys) is computed once per source
(:meth:`AttentionRNNDecoder.memory`); the state is a nest of batch-first
tensors, so beam search reorders it with a gather.
"""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional, Tuple, Union

import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.layers.base import Linear, Module, Training, check_positive_int, dropout, uniform_initializer
from lmkit.layers.cells import CellState, LSTMState
from lmkit.layers.precision import cast_like
from lmkit.layers.rnn import RNNDecoder

__all__ = ["ATTENTIONS", "AttentionRNNDecoder", "AttentionRNNState", "RNNEncoder", "RNNMemory"]

#: The attention mechanisms of :class:`AttentionRNNDecoder`.
ATTENTIONS = ("luong", "bahdanau")

_MASK_VALUE = -1.0e9


class RNNEncoder(Module):
    """LSTM or GRU layers over a padded source, one or both directions.

    Variables: ``forward/...`` (an :class:`~lmkit.layers.RNNDecoder`'s) and,
    with ``bidirectional``, ``backward/...``.
    """

    def __init__(self, *, input_size: int, hidden_size: int, num_layers: int = 1, cell: str = "lstm",
                 bidirectional: bool = False, dropout: float = 0.0, forget_bias: float = 0.0,
                 init_scale: float = 0.1, name: Optional[str] = None) -> None:
        """Creates the layers (arguments as :class:`~lmkit.layers.RNNDecoder`; ``bidirectional`` adds a
        backward stack of the same shape)."""
        super().__init__(name=name)
        self.bidirectional = bool(bidirectional)
        options = dict(input_size=input_size, hidden_size=hidden_size, num_layers=num_layers, cell=cell,
                       dropout=dropout, forget_bias=forget_bias, init_scale=init_scale)
        with self.name_scope:
            self.forward = RNNDecoder(name="forward", **options)
            self.backward = RNNDecoder(name="backward", **options) if self.bidirectional else None

    @property
    def output_size(self) -> int:
        return self.forward.hidden_size * (2 if self.bidirectional else 1)

    def __call__(self, inputs: tf.Tensor, mask: Optional[tf.Tensor] = None,
                 training: Training = False) -> tf.Tensor:
        """Encodes ``inputs`` [batch, source_time, input_size] with ``mask`` [batch, source_time] (True = token).

        Returns:
          [batch, source_time, output_size]: the forward outputs (and the
          backward ones after them); zeros at padded positions.
        """
        outputs, _ = self.forward(inputs, None, training)
        if mask is None:
            mask = tf.ones(tf.shape(inputs)[:2], tf.bool)
        mask = tf.cast(mask, tf.bool)
        if self.backward is not None:
            lengths = tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)
            reversed_inputs = tf.reverse_sequence(inputs, lengths, seq_axis=1, batch_axis=0)
            backward, _ = self.backward(reversed_inputs, None, training)
            outputs = tf.concat([outputs, tf.reverse_sequence(backward, lengths, seq_axis=1, batch_axis=0)], -1)
        return outputs * cast_like(tf.cast(mask, tf.float32)[:, :, tf.newaxis], outputs)

    def get_config(self) -> Dict[str, Any]:
        config = self.forward.get_config()
        config.update(bidirectional=self.bidirectional, name=self.name)
        return config


class RNNMemory(NamedTuple):
    """What an :class:`AttentionRNNDecoder` attends to: the encoder outputs [batch, source_time, memory_size],
    their keys [batch, source_time, hidden_size or attention_size] (projected once) and the mask
    [batch, source_time]."""

    values: tf.Tensor
    keys: tf.Tensor
    mask: tf.Tensor


class AttentionRNNState(NamedTuple):
    """The decoder's state: the cells' states and the last attentional vector [batch, hidden_size]."""

    cells: Tuple[CellState, ...]
    attentional: tf.Tensor


class AttentionRNNDecoder(Module):
    """An RNN decoder that attends to an encoder's outputs at every step (Luong or Bahdanau).

    Variables: ``rnn/...`` (an :class:`~lmkit.layers.RNNDecoder` whose input
    is the embedding and the fed vector: the last attentional vector for
    Luong, the context for Bahdanau), ``memory_key`` (Linear, no bias:
    memory -> keys), for Bahdanau ``query`` (Linear, no bias) and
    ``score`` [attention_size], and ``attentional`` (Linear [context; h] ->
    hidden_size, no bias).
    """

    def __init__(self, *, input_size: int, hidden_size: int, memory_size: int, num_layers: int = 1,
                 cell: str = "lstm", attention: str = "luong", attention_size: int = 0, dropout: float = 0.0,
                 forget_bias: float = 0.0, init_scale: float = 0.1, name: Optional[str] = None) -> None:
        """Creates the layers.

        Args:
          input_size: the embedded target tokens' size.
          hidden_size: every layer's size, and the attentional vector's.
          memory_size: the encoder outputs' size.
          num_layers, cell, dropout, forget_bias, init_scale: as :class:`~lmkit.layers.RNNDecoder`.
          attention: ``"luong"`` or ``"bahdanau"``.
          attention_size: Bahdanau's scoring size (0 = ``hidden_size``).
          name: module name.
        """
        super().__init__(name=name)
        if attention not in ATTENTIONS:
            raise UsageError(f"attention {attention!r} is not one of {', '.join(ATTENTIONS)}")
        self.attention = attention
        self.input_size = check_positive_int("input_size", input_size)
        self.hidden_size = check_positive_int("hidden_size", hidden_size)
        self.memory_size = check_positive_int("memory_size", memory_size)
        self.attention_size = (check_positive_int("attention_size", attention_size) if attention_size
                               else hidden_size)
        fed = hidden_size if attention == "luong" else memory_size
        with self.name_scope:
            self.rnn = RNNDecoder(input_size=input_size + fed, hidden_size=hidden_size, num_layers=num_layers,
                                  cell=cell, dropout=dropout, forget_bias=forget_bias, init_scale=init_scale,
                                  name="rnn")
            key_size = hidden_size if attention == "luong" else self.attention_size
            self.memory_key = Linear(input_size=memory_size, output_size=key_size, use_bias=False,
                                     init_scale=init_scale, name="memory_key")
            if attention == "bahdanau":
                self.query = Linear(input_size=hidden_size, output_size=self.attention_size, use_bias=False,
                                    init_scale=init_scale, name="query")
                self.score = tf.Variable(uniform_initializer(init_scale)([self.attention_size], tf.float32),
                                         name="score")
            self.attentional = Linear(input_size=memory_size + hidden_size, output_size=hidden_size,
                                      use_bias=False, init_scale=init_scale, name="attentional")

    def memory(self, encoder_outputs: tf.Tensor, mask: Optional[tf.Tensor] = None) -> RNNMemory:
        """The encoder outputs [batch, source_time, memory_size] with their keys, computed once per source."""
        if mask is None:
            mask = tf.ones(tf.shape(encoder_outputs)[:2], tf.bool)
        return RNNMemory(encoder_outputs, self.memory_key(encoder_outputs), tf.cast(mask, tf.bool))

    def initial_state(self, batch_size: Union[int, tf.Tensor]) -> AttentionRNNState:
        """Zero cell states and a zero attentional vector."""
        return AttentionRNNState(self.rnn.initial_state(batch_size), tf.zeros([batch_size, self.hidden_size]))

    def attend(self, query: tf.Tensor, memory: RNNMemory) -> Tuple[tf.Tensor, tf.Tensor]:
        """``(context [batch, memory_size], probabilities [batch, source_time])`` for ``query`` [batch, hidden]."""
        keys = cast_like(memory.keys, query)
        if self.attention == "luong":  # h^T W_a m
            scores = tf.einsum("bh,bsh->bs", query, keys)
        else:  # v^T tanh(W_m m + W_q h)
            features = tf.tanh(keys + self.query(query)[:, tf.newaxis, :])
            scores = tf.einsum("bsa,a->bs", features, cast_like(self.score, features))
        scores = tf.where(memory.mask, tf.cast(scores, tf.float32), _MASK_VALUE)
        probs = tf.nn.softmax(scores, axis=-1)
        values = cast_like(memory.values, query)
        return tf.einsum("bs,bsm->bm", cast_like(probs, values), values), probs

    def step(self, inputs: tf.Tensor, memory: RNNMemory, state: AttentionRNNState,
             training: Training = False) -> Tuple[tf.Tensor, AttentionRNNState]:
        """One step: ``inputs`` [batch, input_size] (the embedded previous token) -> (attentional vector
        [batch, hidden_size], new state)."""
        if self.attention == "luong":
            fed = cast_like(state.attentional, inputs)
        else:
            top = state.cells[-1]
            fed, _ = self.attend(cast_like(top.hidden if isinstance(top, LSTMState) else top, inputs), memory)
        hidden, cells = self.rnn.step(tf.concat([inputs, fed], axis=-1), state.cells, training)
        context = fed if self.attention == "bahdanau" else self.attend(hidden, memory)[0]
        attentional = tf.tanh(self.attentional(tf.concat([context, hidden], axis=-1), training))
        attentional = dropout(attentional, self.rnn.dropout, training)
        return attentional, AttentionRNNState(cells, cast_like(attentional, state.attentional))

    def __call__(self, inputs: tf.Tensor, memory: RNNMemory, state: Optional[AttentionRNNState] = None,
                 training: Training = False) -> Tuple[tf.Tensor, AttentionRNNState]:
        """Teacher-forced pass: ``inputs`` [batch, time, input_size] -> ([batch, time, hidden_size], state).

        One :meth:`step` per position (each needs the last one's attention): a
        Python loop over a static time axis, a ``tf.while_loop`` otherwise.
        """
        if state is None:
            state = self.initial_state(tf.shape(inputs)[0])
        length = inputs.shape[1]
        if length is not None:
            outputs = []
            for t in range(length):
                output, state = self.step(inputs[:, t], memory, state, training)
                outputs.append(output)
            return tf.stack(outputs, axis=1), state
        time_major = tf.transpose(inputs, [1, 0, 2])
        steps = tf.shape(time_major)[0]
        outputs_ta = tf.TensorArray(inputs.dtype, size=steps, element_shape=tf.TensorShape([None, self.hidden_size]))

        def body(t, state, outputs_ta):
            output, state = self.step(time_major[t], memory, state, training)
            return t + 1, state, outputs_ta.write(t, output)

        _, state, outputs_ta = tf.while_loop(lambda t, *_: t < steps, body, (tf.constant(0), state, outputs_ta))
        return tf.transpose(outputs_ta.stack(), [1, 0, 2]), state

    def get_config(self) -> Dict[str, Any]:
        config = self.rnn.get_config()
        config.update(input_size=self.input_size, memory_size=self.memory_size, attention=self.attention,
                      attention_size=self.attention_size if self.attention == "bahdanau" else 0, name=self.name)
        return config
