"""A transformer encoder-decoder: source embeddings -> encoder; target embeddings -> cross-attending decoder -> softmax.

The conditional-model protocol extends the language-model one by a
``condition``: :meth:`TransformerSeq2Seq.encode` turns a padded source batch
into a :class:`~lmkit.layers.Memory` (every decoder layer's keys and values
of the encoder outputs, and the source mask), and ``__call__``,
``initial_state`` take it as ``condition=``. The decoding state holds it, so
:func:`lmkit.decoding.decode` (``condition=model.encode(...)``), every sampler
and beam search (which gathers the state's rows) work unchanged.
"""

from __future__ import annotations

import math
from typing import Any, Dict, NamedTuple, Optional, Tuple, Union

import tensorflow as tf

from lmkit.core.checks import check_heads, check_positive_float, check_positive_int, check_rate
from lmkit.core.errors import UsageError
from lmkit.layers.base import Training, dropout, uniform_initializer
from lmkit.layers.embeddings import PositionEmbedder, WordEmbedder
from lmkit.layers.encoder_decoder import Memory, TransformerCrossDecoder, TransformerEncoder
from lmkit.layers.norms import LayerNorm
from lmkit.layers.projection import OutputProjection
from lmkit.layers.transformer import TransformerState
from lmkit.models.protocols import LanguageModel

__all__ = ["Seq2SeqState", "TransformerSeq2Seq"]


class Seq2SeqState(NamedTuple):
    """Decoding state of an encoder-decoder: the decoder's cache and what it attends to (batch first)."""

    decoder: TransformerState
    memory: Memory


class TransformerSeq2Seq(LanguageModel):
    """A transformer encoder-decoder (Vaswani et al., 2017), pre- or post-layer-norm.

    Variables: ``source_embedder`` (absent with ``share_embeddings``: the
    target's serves both), ``target_embedder``, ``source_positions``,
    ``target_positions``, ``encoder/...``, ``decoder/...``, ``projection``
    (its kernel the target embedding table with ``tie_weights``) and, with
    ``embedding_norm``, ``source_embedding_norm`` and ``target_embedding_norm``.

    Args:
      source_vocab_size, vocab_size: the source's and the target's ids.
      hidden_size: model size; a multiple of ``num_heads``.
      num_layers: encoder layers (and decoder layers when ``decoder_layers`` is 0).
      decoder_layers: decoder layers; 0 = ``num_layers``.
      num_heads: attention heads.
      ffn_dim: feed-forward inner size; 0 = ``4 * hidden_size``.
      max_source_positions, max_positions: longest source and target.
      dropout: on embeddings, attention probabilities and residual branches while training.
      pre_layer_norm: normalize before each block (True) or after (Vaswani et al.).
      share_embeddings: one table for source and target (the vocabularies must be one).
      tie_weights: the softmax kernel is the target embedding table.
      init_scale: kernels and embeddings from uniform(-init_scale, init_scale).
      attention_blocks: the decoder's causal self-attention over a training
        target in this many query blocks that skip the masked keys; 1 = the
        whole target at once; ``"auto"`` (default): 4 blocks for targets of at
        least 1024 positions, else 1. The results are the same (``attention_blocks=4``
        in a config's model section). The encoder, which attends
        to every source position, has no masked blocks to skip.
      activation: the feed-forward blocks' ``"gelu"`` (tanh approximation),
        ``"gelu_exact"`` (erf, BART's) or ``"relu"``.
      embedding_norm: a layer norm on each side's embedded tokens and
        positions, before the first layer (BART's ``layernorm_embedding``).
      scale_embedding: token embeddings times ``sqrt(hidden_size)`` (Vaswani et al.;
        BART's ``scale_embedding``); the softmax's tied kernel is not scaled.
      name: module name.
    """

    stateful = False
    conditional = True
    # Every attention's input projections: the encoder's and the cross-attention's query and fused key/value,
    # the decoder's fused qkv (PEFT adapts BART's q_proj and v_proj; fused layers adapt k too, as GPT-2's qkv).
    lora_targets = ("query", "key_value", "qkv")

    def __init__(self, *, source_vocab_size: int, vocab_size: int, hidden_size: int, num_layers: int = 2,
                 decoder_layers: int = 0, num_heads: int = 4, ffn_dim: int = 0, max_source_positions: int = 256,
                 max_positions: int = 256, dropout: float = 0.0, pre_layer_norm: bool = True,
                 share_embeddings: bool = False, tie_weights: bool = True, init_scale: float = 0.1,
                 attention_blocks: Union[int, str] = "auto", activation: str = "gelu", embedding_norm: bool = False,
                 scale_embedding: bool = False, name: Optional[str] = None) -> None:
        """Creates the embedders, the encoder, the decoder and the softmax layer."""
        super().__init__(name=name)
        self.source_vocab_size = check_positive_int("source_vocab_size", source_vocab_size)
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.hidden_size = check_positive_int("hidden_size", hidden_size)
        check_heads("hidden_size", hidden_size, num_heads)
        self.share_embeddings = bool(share_embeddings)
        if self.share_embeddings and source_vocab_size != vocab_size:
            raise UsageError(f"share_embeddings needs one vocabulary: source_vocab_size {source_vocab_size} != "
                             f"vocab_size {vocab_size}; share the tokenizer or set share_embeddings = False")
        self.dropout = check_rate("dropout", dropout)
        self.tie_weights = bool(tie_weights)
        self.init_scale = check_positive_float("init_scale", init_scale)
        decoder_layers = check_positive_int("decoder_layers", decoder_layers) if decoder_layers else num_layers
        initializer = uniform_initializer(init_scale)
        self.embedding_norm, self.scale_embedding = bool(embedding_norm), bool(scale_embedding)
        self._embedding_scale = math.sqrt(hidden_size) if self.scale_embedding else 1.0
        options = dict(dim=hidden_size, num_heads=num_heads, ffn_dim=ffn_dim, dropout=dropout,
                       pre_layer_norm=pre_layer_norm, init_scale=init_scale, activation=activation)
        with self.name_scope:
            self.target_embedder = WordEmbedder(vocab_size=vocab_size, dim=hidden_size, initializer=initializer,
                                                name="target_embedder")
            self.source_embedder = None if self.share_embeddings else WordEmbedder(
                vocab_size=source_vocab_size, dim=hidden_size, initializer=initializer, name="source_embedder")
            self.source_positions = PositionEmbedder(max_positions=max_source_positions, dim=hidden_size,
                                                     init_scale=init_scale, name="source_positions")
            self.target_positions = PositionEmbedder(max_positions=max_positions, dim=hidden_size,
                                                     init_scale=init_scale, name="target_positions")
            self.encoder = TransformerEncoder(num_layers=num_layers, name="encoder", **options)
            self.decoder = TransformerCrossDecoder(num_layers=decoder_layers, max_positions=max_positions,
                                                   attention_blocks=attention_blocks, name="decoder", **options)
            self.projection = OutputProjection(dim=hidden_size, vocab_size=vocab_size,
                                               tied_embedder=self.target_embedder if self.tie_weights else None,
                                               initializer=initializer, name="projection")
            norms = [LayerNorm(dim=hidden_size, name=f"{side}_embedding_norm") if self.embedding_norm else None
                     for side in ("source", "target")]
            self.source_embedding_norm, self.target_embedding_norm = norms

    @property
    def max_positions(self) -> int:
        return self.decoder.max_positions

    def encode(self, source_ids: tf.Tensor, source_mask: Optional[tf.Tensor] = None,
               training: Training = False) -> Memory:
        """source_ids [batch, source_time] int32 (padded), source_mask [batch, source_time] bool -> the condition."""
        source_ids = tf.convert_to_tensor(source_ids, tf.int32)
        if source_mask is None:
            source_mask = tf.ones(tf.shape(source_ids), tf.bool)
        length = source_ids.shape[1]
        if length is not None and length > self.source_positions.max_positions:
            raise UsageError(f"a source of {length} tokens is longer than max_source_positions "
                             f"{self.source_positions.max_positions}; shorten it or build a larger model")
        embedder = self.target_embedder if self.source_embedder is None else self.source_embedder
        x = self._embed(embedder, self.source_positions, self.source_embedding_norm, source_ids,
                        tf.range(tf.shape(source_ids)[1])[tf.newaxis])
        outputs = self.encoder(dropout(x, self.dropout, training), source_mask, training)
        return self.decoder.memory(outputs, source_mask)

    def _embed(self, embedder: WordEmbedder, table: PositionEmbedder, norm: Optional[LayerNorm], ids: tf.Tensor,
               positions: tf.Tensor) -> tf.Tensor:
        tokens = embedder(ids)
        x = (tokens if self._embedding_scale == 1.0 else tokens * self._embedding_scale) + table(positions)
        return x if norm is None else norm(x)

    def _embed_target(self, ids: tf.Tensor, positions: tf.Tensor) -> tf.Tensor:
        return self._embed(self.target_embedder, self.target_positions, self.target_embedding_norm, ids, positions)

    def initial_state(self, batch_size: Union[int, tf.Tensor], max_length: Optional[int] = None,
                      condition: Optional[Memory] = None) -> Seq2SeqState:
        """An empty decoder cache with the ``condition`` (from :meth:`encode`) of every row.

        ``batch_size`` may be a multiple ``k`` of the condition's rows (beam
        search's ``batch * width``): each row's condition is then repeated
        ``k`` times in a row.
        """
        if condition is None:
            raise UsageError("an encoder-decoder generates from a source: pass condition=model.encode(source_ids, "
                             "source_mask)")
        rows = tf.shape(condition.mask)[0]
        repeats = batch_size // rows
        memory = tf.nest.map_structure(lambda t: tf.repeat(t, repeats, axis=0), condition)
        return Seq2SeqState(self.decoder.initial_state(batch_size, max_length), memory)

    def __call__(self, ids: tf.Tensor, state: Optional[Seq2SeqState] = None, training: Training = False,
                 condition: Optional[Memory] = None) -> Tuple[tf.Tensor, Optional[Seq2SeqState]]:
        """Teacher-forced pass over target ids [batch, time] against ``condition`` (or the state's) ->
        (logits [batch, time, vocab] float32, state or None)."""
        memory = state.memory if state is not None else condition
        if memory is None:
            raise UsageError("an encoder-decoder needs condition=model.encode(source_ids, source_mask)")
        ids = tf.convert_to_tensor(ids, tf.int32)
        start = 0 if state is None else state.decoder.positions[:, tf.newaxis]
        positions = start + tf.range(tf.shape(ids)[1])[tf.newaxis, :]
        x = dropout(self._embed_target(ids, positions), self.dropout, training)
        outputs, decoder_state = self.decoder(x, memory, None if state is None else state.decoder, training)
        logits = self.projection(outputs)
        return logits, (None if state is None else Seq2SeqState(decoder_state, memory))

    def step(self, ids: tf.Tensor, state: Seq2SeqState) -> Tuple[tf.Tensor, Seq2SeqState]:
        """One cached step: ids [batch] -> (logits [batch, vocab], state)."""
        x = self._embed_target(ids, state.decoder.positions)[:, tf.newaxis, :]
        outputs, decoder_state = self.decoder(x, state.memory, state.decoder, False)
        return self.projection(outputs[:, 0, :]), Seq2SeqState(decoder_state, state.memory)

    def get_config(self) -> Dict[str, Any]:
        layer = self.encoder.layers[0]
        config = {"model": "transformer_seq2seq", "source_vocab_size": self.source_vocab_size,
                  "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
                  "num_layers": self.encoder.num_layers, "decoder_layers": self.decoder.num_layers,
                  "num_heads": layer.num_heads, "ffn_dim": layer.ffn_dim,
                  "max_source_positions": self.source_positions.max_positions, "max_positions": self.max_positions,
                  "dropout": self.dropout, "pre_layer_norm": layer.pre_layer_norm,
                  "share_embeddings": self.share_embeddings, "tie_weights": self.tie_weights,
                  "init_scale": self.init_scale}
        # Absent when the defaults, as in the transformer's config.
        optional = {"attention_blocks": (self.decoder.layers[0].attention_blocks, "auto"),
                    "activation": (layer.activation, "gelu"), "embedding_norm": (self.embedding_norm, False),
                    "scale_embedding": (self.scale_embedding, False)}
        config.update({key: value for key, (value, default) in optional.items() if value != default})
        return config
