"""An RNN encoder-decoder with attention (Luong et al., 2015; Bahdanau et al., 2015).

Source embeddings -> :class:`~lmkit.layers.RNNEncoder` (one or both
directions); target embeddings -> :class:`~lmkit.layers.AttentionRNNDecoder`
-> softmax. The conditional-model protocol of
:mod:`lmkit.models.bart.model`: ``encode`` gives the condition (the
encoder outputs, their keys, the mask), ``__call__`` and ``initial_state``
take it as ``condition=``, and the state carries it.
"""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional, Tuple, Union

import tensorflow as tf

from lmkit.core.checks import check_positive_float, check_positive_int, check_rate
from lmkit.core.errors import UsageError
from lmkit.layers.attention_rnn import AttentionRNNDecoder, AttentionRNNState, RNNEncoder, RNNMemory
from lmkit.layers.base import Training, dropout, uniform_initializer
from lmkit.layers.embeddings import WordEmbedder
from lmkit.layers.projection import OutputProjection
from lmkit.models.protocols import LanguageModel

__all__ = ["RNNSeq2Seq", "RNNSeq2SeqState"]


class RNNSeq2SeqState(NamedTuple):
    """The attention decoder's state and what it attends to (batch first)."""

    decoder: AttentionRNNState
    memory: RNNMemory


class RNNSeq2Seq(LanguageModel):
    """An LSTM/GRU encoder-decoder with Luong or Bahdanau attention.

    Variables: ``source_embedder`` (absent with ``share_embeddings``),
    ``target_embedder``, ``encoder/...``, ``decoder/...``, ``projection``
    (its kernel the target table with ``tie_weights``).
    """

    stateful = False
    conditional = True

    def __init__(self, *, source_vocab_size: int, vocab_size: int, hidden_size: int, num_layers: int = 1,
                 cell: str = "lstm", bidirectional: bool = True, attention: str = "luong",
                 embedding_dim: int = 0, max_positions: int = 256, max_source_positions: int = 256,
                 dropout: float = 0.0,
                 share_embeddings: bool = False, tie_weights: bool = False, init_scale: float = 0.1,
                 name: Optional[str] = None) -> None:
        """Creates the embedders, the encoder, the decoder and the softmax layer.

        Args:
          source_vocab_size, vocab_size: the source's and the target's ids.
          hidden_size: every recurrent layer's size (each direction's in the encoder).
          num_layers: layers of the encoder and of the decoder.
          cell: ``"lstm"`` or ``"gru"``.
          bidirectional: the encoder reads both ways.
          attention: ``"luong"`` or ``"bahdanau"``.
          embedding_dim: 0 = ``hidden_size``.
          max_positions: the longest target the decoder generates (a bound for decoding).
          max_source_positions: the longest source lmkit gives the encoder (a bound of the data: longer
            training pairs are skipped, longer prompts refused; the recurrent encoder itself has none).
          dropout: on embeddings and between layers while training.
          share_embeddings: one table for source and target (one vocabulary).
          tie_weights: the softmax kernel is the target table (``embedding_dim`` must be ``hidden_size``).
          init_scale: every variable from uniform(-init_scale, init_scale).
          name: module name.
        """
        super().__init__(name=name)
        self.source_vocab_size = check_positive_int("source_vocab_size", source_vocab_size)
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.hidden_size = check_positive_int("hidden_size", hidden_size)
        self.embedding_dim = check_positive_int("embedding_dim", embedding_dim) if embedding_dim else hidden_size
        self.share_embeddings, self.tie_weights = bool(share_embeddings), bool(tie_weights)
        if self.share_embeddings and source_vocab_size != vocab_size:
            raise UsageError(f"share_embeddings needs one vocabulary: source_vocab_size {source_vocab_size} != "
                             f"vocab_size {vocab_size}; share the tokenizer or set share_embeddings = False")
        if self.tie_weights and self.embedding_dim != hidden_size:
            raise UsageError(f"tie_weights needs embedding_dim = hidden_size = {hidden_size}, got {embedding_dim}")
        self._max_positions = check_positive_int("max_positions", max_positions)
        self.max_source_positions = check_positive_int("max_source_positions", max_source_positions)
        self.dropout = check_rate("dropout", dropout)
        self.init_scale = check_positive_float("init_scale", init_scale)
        initializer = uniform_initializer(init_scale)
        with self.name_scope:
            self.target_embedder = WordEmbedder(vocab_size=vocab_size, dim=self.embedding_dim,
                                                initializer=initializer, name="target_embedder")
            self.source_embedder = None if self.share_embeddings else WordEmbedder(
                vocab_size=source_vocab_size, dim=self.embedding_dim, initializer=initializer,
                name="source_embedder")
            self.encoder = RNNEncoder(input_size=self.embedding_dim, hidden_size=hidden_size, num_layers=num_layers,
                                      cell=cell, bidirectional=bidirectional, dropout=dropout, init_scale=init_scale,
                                      name="encoder")
            self.decoder = AttentionRNNDecoder(input_size=self.embedding_dim, hidden_size=hidden_size,
                                               memory_size=self.encoder.output_size, num_layers=num_layers,
                                               cell=cell, attention=attention, dropout=dropout,
                                               init_scale=init_scale, name="decoder")
            self.projection = OutputProjection(dim=hidden_size, vocab_size=vocab_size,
                                               tied_embedder=self.target_embedder if self.tie_weights else None,
                                               initializer=initializer, name="projection")

    @property
    def max_positions(self) -> int:
        return self._max_positions

    def encode(self, source_ids: tf.Tensor, source_mask: Optional[tf.Tensor] = None,
               training: Training = False) -> RNNMemory:
        """source_ids [batch, source_time] int32 (padded), source_mask [batch, source_time] bool -> the condition."""
        source_ids = tf.convert_to_tensor(source_ids, tf.int32)
        if source_mask is None:
            source_mask = tf.ones(tf.shape(source_ids), tf.bool)
        embedder = self.target_embedder if self.source_embedder is None else self.source_embedder
        x = dropout(embedder(source_ids), self.dropout, training)
        return self.decoder.memory(self.encoder(x, source_mask, training), source_mask)

    def initial_state(self, batch_size: Union[int, tf.Tensor], max_length: Optional[int] = None,
                      condition: Optional[RNNMemory] = None) -> RNNSeq2SeqState:
        """Zero decoder state with the ``condition`` of every row (repeated when ``batch_size`` is a multiple
        of its rows, as beam search asks)."""
        del max_length  # a recurrent state has no length
        if condition is None:
            raise UsageError("an encoder-decoder generates from a source: pass condition=model.encode(source_ids, "
                             "source_mask)")
        repeats = batch_size // tf.shape(condition.mask)[0]
        memory = tf.nest.map_structure(lambda t: tf.repeat(t, repeats, axis=0), condition)
        return RNNSeq2SeqState(self.decoder.initial_state(batch_size), memory)

    def __call__(self, ids: tf.Tensor, state: Optional[RNNSeq2SeqState] = None, training: Training = False,
                 condition: Optional[RNNMemory] = None) -> Tuple[tf.Tensor, RNNSeq2SeqState]:
        """Teacher-forced pass over target ids [batch, time] -> (logits [batch, time, vocab] float32, state)."""
        ids = tf.convert_to_tensor(ids, tf.int32)
        if state is None:
            state = self.initial_state(tf.shape(ids)[0], condition=condition)
        x = dropout(self.target_embedder(ids), self.dropout, training)
        outputs, decoder_state = self.decoder(x, state.memory, state.decoder, training)
        return self.projection(outputs), RNNSeq2SeqState(decoder_state, state.memory)

    def step(self, ids: tf.Tensor, state: RNNSeq2SeqState) -> Tuple[tf.Tensor, RNNSeq2SeqState]:
        """One step: ids [batch] -> (logits [batch, vocab], state)."""
        output, decoder_state = self.decoder.step(self.target_embedder(ids), state.memory, state.decoder)
        return self.projection(output), RNNSeq2SeqState(decoder_state, state.memory)

    def get_config(self) -> Dict[str, Any]:
        return {"model": "rnn_seq2seq", "source_vocab_size": self.source_vocab_size, "vocab_size": self.vocab_size,
                "hidden_size": self.hidden_size, "num_layers": self.decoder.rnn.num_layers,
                "cell": self.decoder.rnn.cell_type, "bidirectional": self.encoder.bidirectional,
                "attention": self.decoder.attention, "embedding_dim": self.embedding_dim,
                "max_positions": self.max_positions, "max_source_positions": self.max_source_positions,
                "dropout": self.dropout,
                "share_embeddings": self.share_embeddings, "tie_weights": self.tie_weights,
                "init_scale": self.init_scale}
