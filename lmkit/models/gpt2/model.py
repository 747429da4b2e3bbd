"""Token + position embeddings -> causal transformer -> softmax (GPT-2 style)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Union

import tensorflow as tf

from lmkit.core.checks import check_heads, check_positive_float, check_positive_int, check_rate
from lmkit.core.errors import UsageError
from lmkit.layers.base import Training, dropout, uniform_initializer
from lmkit.layers.documents import documents_of
from lmkit.layers.embeddings import PositionEmbedder, SinusoidsPositionEmbedder, WordEmbedder
from lmkit.layers.projection import OutputProjection
from lmkit.layers.transformer import TransformerDecoder, TransformerState, initialize_like_gpt2
from lmkit.models.protocols import LanguageModel, check_window, embedding_dim_of

__all__ = ["INITIALIZATIONS", "TransformerLanguageModel"]

_POSITION_EMBEDDINGS = ("learned", "sinusoid")
#: How the kernels and embedding tables start (``initialization``): see :class:`TransformerLanguageModel`.
INITIALIZATIONS = ("uniform", "gpt2")


def _check_choices(embedding_dim: int, hidden_size: int, num_heads: int, position_embedding: str,
                   initialization: str) -> None:
    """The arguments of :class:`TransformerLanguageModel` that must fit each other or name a choice."""
    if embedding_dim_of(embedding_dim, hidden_size) != hidden_size:
        raise UsageError(f"embedding_dim {embedding_dim} must be 0 or hidden_size {hidden_size} for the "
                         f"transformer; use embedding_dim=0")
    check_heads("hidden_size", hidden_size, num_heads)
    if position_embedding not in _POSITION_EMBEDDINGS:
        raise UsageError(f"position_embedding {position_embedding!r} is not one of "
                         f"{', '.join(_POSITION_EMBEDDINGS)}")
    if initialization not in INITIALIZATIONS:
        raise UsageError(f"initialization {initialization!r} is not one of {', '.join(INITIALIZATIONS)} "
                         "(uniform: uniform(-init_scale, init_scale); gpt2: GPT-2's normal(0, init_scale))")


class TransformerLanguageModel(LanguageModel):
    """Token + position embeddings -> causal transformer -> softmax (GPT-2 style).

    ``stateful`` is False: training windows are independent, and
    ``__call__(ids)`` with ``state=None`` (what the trainer passes) runs plain
    causal attention and returns ``None`` as the state. For generation, pass
    ``initial_state(batch, max_length)`` to ``__call__`` to prefill the
    key/value cache with a prompt, then continue with :meth:`step`; both
    return the advanced :class:`~lmkit.layers.TransformerState`.

    Dropout (rate ``dropout``) acts on the embedding sum, the attention
    probabilities and each residual branch, only while training.

    With ``tie_weights=True``, ``pre_layer_norm=True``, learned positions and
    ``output_bias=False`` this is GPT-2's architecture (the ``gpt2`` entry of
    :data:`lmkit.models.MODELS`), which :mod:`lmkit.models.gpt2.convert` loads from and
    exports to Hugging Face checkpoints.

    Args:
      vocab_size: number of token ids.
      hidden_size: model size; a multiple of ``num_heads``.
      num_layers: transformer layers.
      num_heads: attention heads.
      ffn_dim: feed-forward inner size; 0 means ``4 * hidden_size``.
      max_positions: longest sequence (and cache).
      dropout: dropout rate while training.
      pre_layer_norm: GPT-2 style (True) or post-layer-norm.
      tie_weights: share the embedding table with the softmax kernel.
      init_scale: the spread of the kernels and embeddings at the start (see ``initialization``).
      embedding_dim: must be 0 or ``hidden_size`` (kept for config parity).
      position_embedding: ``"learned"`` (GPT-2) or ``"sinusoid"``.
      layer_norm_epsilon: added to the variance in every layer norm.
      output_bias: give the softmax layer a bias (GPT-2 has none).
      attention_blocks: a training window's attention in this many query
        blocks that skip the masked keys after them (speed only; the results
        are the same; ``attention_blocks=4`` in a config's model section);
        ``"auto"`` (default): 4 blocks for windows of at least 1024 positions, else 1.
      attention_dropout: dropout on the attention probabilities while
        training; None (default): ``dropout``. 0 keeps the rest of the
        dropout and lets a fused attention kernel take training windows
        (``attention_dropout=0.0`` in a config's model section;
        :mod:`lmkit.layers.kernels`).
      initialization: ``"uniform"`` (default): every kernel and embedding
        table from uniform(-init_scale, init_scale); ``"gpt2"``: GPT-2's and
        nanoGPT's normal(0, init_scale), the residual projections smaller
        (:func:`~lmkit.layers.initialize_like_gpt2`).
      use_bias: biases in the attention and feed-forward projections and
        offsets in the layer norms; False: neither (nanoGPT's ``bias=False``).
      activation: the feed-forward's, ``"gelu"`` (GPT-2's tanh approximation),
        ``"gelu_exact"`` (nanoGPT's) or ``"relu"``.
      name: module name.

    Raises:
      ValueError: ``hidden_size`` not divisible by ``num_heads``, an
        ``embedding_dim`` other than 0 or ``hidden_size``, an unknown
        position embedding or initialization, or a bad size or rate.
    """

    stateful = False
    lora_targets = ("qkv",)  # GPT-2's c_attn, PEFT's default for GPT-2

    def __init__(self, *, vocab_size: int, hidden_size: int, num_layers: int = 2, num_heads: int = 4,
                 ffn_dim: int = 0, max_positions: int = 512, dropout: float = 0.0, pre_layer_norm: bool = True,
                 tie_weights: bool = False, init_scale: float = 0.1, embedding_dim: int = 0,
                 position_embedding: str = "learned", layer_norm_epsilon: float = 1e-5, output_bias: bool = True,
                 attention_blocks: Union[int, str] = "auto", attention_dropout: Optional[float] = None,
                 initialization: str = "uniform", use_bias: bool = True, activation: str = "gelu",
                 name: Optional[str] = None) -> None:
        """Creates the embedders, the decoder and the softmax layer."""
        super().__init__(name=name)
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.hidden_size = check_positive_int("hidden_size", hidden_size)
        _check_choices(embedding_dim, hidden_size, num_heads, position_embedding, initialization)
        self.position_embedding, self.initialization = position_embedding, initialization
        self.dropout = check_rate("dropout", dropout)
        self.attention_dropout = None if attention_dropout is None else check_rate("attention_dropout",
                                                                                    attention_dropout)
        self.init_scale = check_positive_float("init_scale", init_scale)
        self.tie_weights = bool(tie_weights)
        initializer = uniform_initializer(init_scale)
        with self.name_scope:
            self.embedder = WordEmbedder(vocab_size=vocab_size, dim=hidden_size, initializer=initializer,
                                         name="embedder")
            if position_embedding == "learned":
                self.position_embedder = PositionEmbedder(max_positions=max_positions, dim=hidden_size,
                                                          init_scale=init_scale, name="position_embedder")
            else:
                self.position_embedder = SinusoidsPositionEmbedder(dim=hidden_size, name="position_embedder")
            self.decoder = TransformerDecoder(num_layers=num_layers, dim=hidden_size, num_heads=num_heads,
                                              ffn_dim=ffn_dim, dropout=dropout, attention_dropout=attention_dropout,
                                              pre_layer_norm=pre_layer_norm,
                                              max_positions=max_positions, init_scale=init_scale,
                                              layer_norm_epsilon=layer_norm_epsilon,
                                              attention_blocks=attention_blocks, use_bias=use_bias,
                                              activation=activation, name="decoder")
            self.projection = OutputProjection(dim=hidden_size, vocab_size=vocab_size,
                                               tied_embedder=self.embedder if self.tie_weights else None,
                                               use_bias=output_bias, initializer=initializer, name="projection")
        if initialization == "gpt2":
            initialize_like_gpt2(self, self.decoder.layers, self.init_scale)

    @property
    def max_positions(self) -> int:
        return self.decoder.max_positions

    @property
    def is_gpt2(self) -> bool:
        """Whether this is GPT-2's architecture (what a Hugging Face GPT-2 checkpoint holds)."""
        return (self.tie_weights and self.decoder.pre_layer_norm and self.position_embedding == "learned"
                and self.projection.bias is None and self.decoder.layers[0].activation == "gelu"
                and self.decoder.layers[0].use_bias)

    def initial_state(self, batch_size: Union[int, tf.Tensor],
                      max_length: Optional[int] = None) -> TransformerState:
        """An empty key/value cache for ``max_length`` tokens (``max_positions`` when None).

        Raises:
          ValueError: ``max_length`` exceeds ``max_positions``.
        """
        return self.decoder.initial_state(batch_size, max_length)

    def _embed(self, ids: tf.Tensor, positions: tf.Tensor, training: Training) -> tf.Tensor:
        x = self.embedder(ids) + self.position_embedder(positions)  # [..., hidden]
        return dropout(x, self.dropout, training)

    def __call__(self, ids: tf.Tensor, state: Optional[TransformerState] = None, training: Training = False, *,
                 positions: Optional[tf.Tensor] = None,
                 segment_ids: Optional[tf.Tensor] = None) -> Tuple[tf.Tensor, Optional[TransformerState]]:
        """Teacher-forced pass over a window.

        Args:
          ids: [batch, time] int32.
          state: None (training: positions 0..time-1, no cache, returns None),
            or a state whose cache this window extends (positions continue
            from ``state.positions``).
          training: apply dropout.
          positions, segment_ids: without a state, a packed window's (:mod:`lmkit.layers.documents`):
            [batch, time] int32, each token's position in its example and the example it belongs to.

        Returns:
          ``(logits [batch, time, vocab] float32, state or None)``.
        """
        ids = check_window(ids, state, self.max_positions)
        length = tf.shape(ids)[1]
        documents = documents_of(segment_ids, positions, state)
        if state is None:
            positions = tf.range(length)[tf.newaxis, :] if documents is None else documents.positions
        else:
            positions = state.positions[:, tf.newaxis] + tf.range(length)[tf.newaxis, :]  # [batch, time]
        inputs = self._embed(ids, positions, training)  # [batch, time, hidden]
        outputs, state = self.decoder(inputs, state, training, documents)
        return self.projection(outputs), state

    def step(self, ids: tf.Tensor, state: TransformerState) -> Tuple[tf.Tensor, TransformerState]:
        """One cached step: ids [batch] int32 at ``state.positions`` -> (logits [batch, vocab], state)."""
        inputs = self._embed(ids, state.positions, False)  # [batch, hidden]
        outputs, state = self.decoder.step(inputs, state)  # [batch, hidden]
        return self.projection(outputs), state

    def get_config(self) -> Dict[str, Any]:
        """``TrainConfig.model_config()`` keys (model ``gpt2`` for GPT-2's architecture), plus
        ``position_embedding``, ``layer_norm_epsilon``, ``output_bias``, ``attention_blocks``,
        ``attention_dropout``, ``initialization``, ``use_bias`` and ``activation`` when not the defaults."""
        config = {"model": "gpt2" if self.is_gpt2 else "transformer", "vocab_size": self.vocab_size,
                  "hidden_size": self.hidden_size,
                  "num_layers": self.decoder.num_layers, "init_scale": self.init_scale,
                  "dropout": self.dropout, "tie_weights": self.tie_weights,
                  "embedding_dim": self.hidden_size, "num_heads": self.decoder.num_heads,
                  "ffn_dim": self.decoder.ffn_dim, "max_positions": self.decoder.max_positions,
                  "pre_layer_norm": self.decoder.pre_layer_norm}
        if self.position_embedding != "learned":
            config["position_embedding"] = self.position_embedding
        epsilon = self.decoder.layers[0].attention_norm.epsilon
        if epsilon != 1e-5:
            config["layer_norm_epsilon"] = epsilon
        if self.projection.bias is None and not self.is_gpt2:
            config["output_bias"] = False
        blocks = self.decoder.layers[0].attention_blocks
        if blocks != "auto":
            config["attention_blocks"] = blocks
        if self.attention_dropout is not None:
            config["attention_dropout"] = self.attention_dropout
        if self.initialization != "uniform":
            config["initialization"] = self.initialization
        if not self.decoder.layers[0].use_bias:
            config["use_bias"] = False
        if self.decoder.layers[0].activation != "gelu":
            config["activation"] = self.decoder.layers[0].activation
        return config
