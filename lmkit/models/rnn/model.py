"""Embedding -> multi-layer LSTM/GRU -> softmax: the recurrent language model."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Union

import tensorflow as tf

from lmkit.core.checks import check_positive_float, check_positive_int, check_rate
from lmkit.core.errors import UsageError
from lmkit.layers.base import Training, uniform_initializer
from lmkit.layers.embeddings import WordEmbedder
from lmkit.layers.projection import OutputProjection
from lmkit.layers.rnn import RNNDecoder
from lmkit.models.protocols import LanguageModel, State, embedding_dim_of

__all__ = ["RNNLanguageModel"]


class RNNLanguageModel(LanguageModel):
    """Embedding -> multi-layer LSTM/GRU -> softmax (Zaremba et al., 2014).

    Dropout (rate ``dropout``) acts on the embedding output,
    between layers and on the top output, only while training. Every
    variable, biases included, starts from uniform(-init_scale, init_scale).

    ``stateful`` is True: pass the returned state to the next BPTT window.
    State: a tuple with one state per layer (``LSTMState(cell, hidden)`` or a
    GRU's hidden tensor), every tensor [batch, hidden_size].
    """

    stateful = True

    def __init__(self,
                 *,
                 vocab_size: int,
                 hidden_size: int,
                 num_layers: int = 2,
                 cell: str = "lstm",
                 embedding_dim: int = 0,
                 dropout: float = 0.0,
                 forget_bias: float = 0.0,
                 init_scale: float = 0.1,
                 tie_weights: bool = False,
                 name: Optional[str] = None) -> None:
        """Creates the embedder, the recurrent decoder and the softmax layer.

        Args:
          vocab_size: number of token ids.
          hidden_size: size of every recurrent layer.
          num_layers: number of recurrent layers.
          cell: ``"lstm"`` or ``"gru"``.
          embedding_dim: embedding size; 0 means ``hidden_size``.
          dropout: dropout rate while training.
          forget_bias: LSTM forget-gate bias.
          init_scale: every variable from uniform(-init_scale, init_scale).
          tie_weights: share the embedding table with the softmax kernel.
          name: module name.

        Raises:
          ValueError: bad sizes or rates, an unknown cell, or ``tie_weights``
            with ``embedding_dim`` != ``hidden_size``.
        """
        super().__init__(name=name)
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.hidden_size = check_positive_int("hidden_size", hidden_size)
        self.embedding_dim = embedding_dim_of(embedding_dim, hidden_size)
        self.init_scale = check_positive_float("init_scale", init_scale)
        self.dropout = check_rate("dropout", dropout)
        self.tie_weights = bool(tie_weights)
        if self.tie_weights and self.embedding_dim != hidden_size:
            raise UsageError(f"embedding_dim {embedding_dim} must equal hidden_size {hidden_size} "
                             f"when tie_weights=True; use embedding_dim=0 or tie_weights=False")
        initializer = uniform_initializer(init_scale)
        with self.name_scope:
            self.embedder = WordEmbedder(vocab_size=vocab_size, dim=self.embedding_dim, initializer=initializer,
                                         dropout=dropout, name="embedder")
            self.decoder = RNNDecoder(input_size=self.embedding_dim, hidden_size=hidden_size,
                                      num_layers=num_layers, cell=cell, dropout=dropout,
                                      forget_bias=forget_bias, init_scale=init_scale, name="decoder")
            self.projection = OutputProjection(dim=hidden_size, vocab_size=vocab_size,
                                               tied_embedder=self.embedder if self.tie_weights else None,
                                               initializer=initializer, bias_initializer=initializer,
                                               name="projection")

    def initial_state(self, batch_size: Union[int, tf.Tensor], max_length: Optional[int] = None) -> State:
        """Zero state; ``max_length`` is ignored (an RNN state has no length)."""
        return self.decoder.initial_state(batch_size)

    def __call__(self, ids: tf.Tensor, state: Optional[State] = None,
                 training: Training = False) -> Tuple[tf.Tensor, State]:
        """Teacher-forced pass over a window.

        Args:
          ids: [batch, time] int32.
          state: the state after the previous window; zeros when None.
          training: apply dropout.

        Returns:
          ``(logits [batch, time, vocab] float32, final_state)``.
        """
        inputs = self.embedder(ids, training)  # [batch, time, embedding_dim]
        outputs, state = self.decoder(inputs, state, training)  # [batch, time, hidden]
        return self.projection(outputs), state

    def step(self, ids: tf.Tensor, state: State) -> Tuple[tf.Tensor, State]:
        """One decoding step: ids [batch] int32 -> (logits [batch, vocab], state)."""
        inputs = self.embedder(ids)  # [batch, embedding_dim]
        outputs, state = self.decoder.step(inputs, state)  # [batch, hidden]
        return self.projection(outputs), state

    def get_config(self) -> Dict[str, Any]:
        return {"model": self.decoder.cell_type, "vocab_size": self.vocab_size,
                "hidden_size": self.hidden_size, "num_layers": self.decoder.num_layers,
                "init_scale": self.init_scale, "dropout": self.dropout,
                "forget_bias": self.decoder.forget_bias, "tie_weights": self.tie_weights,
                "embedding_dim": self.embedding_dim}
