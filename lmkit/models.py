"""Built-in language models and ``build_model``.

Both models follow the language-model protocol of ``docs/design.md``:
``vocab_size``, ``stateful``, ``initial_state(batch_size, max_length=None)``,
``__call__(ids, state=None, training=False) -> (logits, state)``,
``step(ids, state) -> (logits, state)``, ``reorder_state(state, indices)`` and
``get_config()``, whose dict ``build_model`` turns back into the model.

Every state tensor has the batch as its first dimension, so
``reorder_state`` gathers rows of every tensor of the state.
"""

from __future__ import annotations

import difflib
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import tensorflow as tf

from lmkit.modules.base import (Module, Training, check_positive_float, check_positive_int, check_rate,
                                dropout, uniform_initializer)
from lmkit.modules.embedders import PositionEmbedder, SinusoidsPositionEmbedder, WordEmbedder
from lmkit.modules.projection import OutputProjection
from lmkit.modules.rnn import RNNDecoder
from lmkit.modules.transformer import TransformerDecoder, TransformerState

__all__ = ["LanguageModel", "RNNLanguageModel", "TransformerLanguageModel", "build_model"]

State = Any  # a nest of tensors, each [batch, ...]


def _keep_prob(rate: float) -> float:
    # Rounded so that keep_prob 0.65 -> dropout 0.35 -> keep_prob 0.65 exactly.
    return round(1.0 - rate, 12)


def _embedding_dim(embedding_dim: int, hidden_size: int) -> int:
    if isinstance(embedding_dim, bool) or not isinstance(embedding_dim, int) or embedding_dim < 0:
        raise ValueError(f"embedding_dim {embedding_dim!r} must be an integer >= 0 "
                         f"(0 means hidden_size = {hidden_size})")
    return embedding_dim or hidden_size


class LanguageModel(Module):
    """The language-model protocol; subclass it to plug a model into lmkit.

    Attributes:
      vocab_size: size of the output distribution.
      stateful: True when the state carries across BPTT windows.
    """

    vocab_size: int
    stateful: bool

    def initial_state(self, batch_size: Union[int, tf.Tensor], max_length: Optional[int] = None) -> State:
        """The state before the first token: a nest of [batch, ...] tensors."""
        raise NotImplementedError

    def __call__(self, ids: tf.Tensor, state: Optional[State] = None,
                 training: Training = False) -> Tuple[tf.Tensor, State]:
        """Teacher-forced pass: ids [batch, time] -> (logits [batch, time, vocab], state)."""
        raise NotImplementedError

    def step(self, ids: tf.Tensor, state: State) -> Tuple[tf.Tensor, State]:
        """One decoding step: ids [batch] -> (logits [batch, vocab], state)."""
        raise NotImplementedError

    def reorder_state(self, state: State, indices: tf.Tensor) -> State:
        """Gathers state rows (beam search).

        Args:
          state: a state of this model.
          indices: [batch'] int32 rows to keep, in order (repeats allowed).

        Returns:
          The state with every tensor's batch axis gathered by ``indices``.
        """
        return tf.nest.map_structure(lambda tensor: tf.gather(tensor, indices, axis=0), state)


class RNNLanguageModel(LanguageModel):
    """Embedding -> multi-layer LSTM/GRU -> softmax (Zaremba et al., 2014).

    Dropout (rate ``dropout`` = 1 - keep_prob) acts on the embedding output,
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
          dropout: dropout rate while training (1 - keep_prob).
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
        self.embedding_dim = _embedding_dim(embedding_dim, hidden_size)
        self.init_scale = check_positive_float("init_scale", init_scale)
        self.dropout = check_rate("dropout", dropout)
        self.tie_weights = bool(tie_weights)
        if self.tie_weights and self.embedding_dim != hidden_size:
            raise ValueError(f"embedding_dim {embedding_dim} must equal hidden_size {hidden_size} "
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
                "init_scale": self.init_scale, "keep_prob": _keep_prob(self.dropout),
                "forget_bias": self.decoder.forget_bias, "tie_weights": self.tie_weights,
                "embedding_dim": self.embedding_dim}


_POSITION_EMBEDDINGS = ("learned", "sinusoid")


class TransformerLanguageModel(LanguageModel):
    """Token + position embeddings -> causal transformer -> softmax (GPT-2 style).

    ``stateful`` is False: training windows are independent, and
    ``__call__(ids)`` with ``state=None`` (what the trainer passes) runs plain
    causal attention and returns ``None`` as the state. For generation, pass
    ``initial_state(batch, max_length)`` to ``__call__`` to prefill the
    key/value cache with a prompt, then continue with :meth:`step`; both
    return the advanced :class:`~lmkit.modules.TransformerState`.

    Dropout (rate ``dropout``) acts on the embedding sum, the attention
    probabilities and each residual branch, only while training.
    """

    stateful = False

    def __init__(self,
                 *,
                 vocab_size: int,
                 hidden_size: int,
                 num_layers: int = 2,
                 num_heads: int = 4,
                 ffn_dim: int = 0,
                 max_positions: int = 512,
                 dropout: float = 0.0,
                 pre_layer_norm: bool = True,
                 tie_weights: bool = False,
                 init_scale: float = 0.1,
                 embedding_dim: int = 0,
                 position_embedding: str = "learned",
                 name: Optional[str] = None) -> None:
        """Creates the embedders, the decoder and the softmax layer.

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
          init_scale: kernels and embeddings from uniform(-init_scale, init_scale).
          embedding_dim: must be 0 or ``hidden_size`` (kept for config parity).
          position_embedding: ``"learned"`` (GPT-2) or ``"sinusoid"``.
          name: module name.

        Raises:
          ValueError: ``hidden_size`` not divisible by ``num_heads``, an
            ``embedding_dim`` other than 0 or ``hidden_size``, an unknown
            position embedding, or a bad size or rate.
        """
        super().__init__(name=name)
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.hidden_size = check_positive_int("hidden_size", hidden_size)
        if _embedding_dim(embedding_dim, hidden_size) != hidden_size:
            raise ValueError(f"embedding_dim {embedding_dim} must be 0 or hidden_size {hidden_size} for the "
                             f"transformer; use embedding_dim=0")
        if isinstance(num_heads, int) and num_heads > 0 and hidden_size % num_heads:
            raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}; "
                             f"use a multiple of {num_heads}")
        if position_embedding not in _POSITION_EMBEDDINGS:
            raise ValueError(f"position_embedding {position_embedding!r} is not one of "
                             f"{', '.join(_POSITION_EMBEDDINGS)}")
        self.position_embedding = position_embedding
        self.dropout = check_rate("dropout", dropout)
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
                                              ffn_dim=ffn_dim, dropout=dropout, pre_layer_norm=pre_layer_norm,
                                              max_positions=max_positions, init_scale=init_scale,
                                              name="decoder")
            self.projection = OutputProjection(dim=hidden_size, vocab_size=vocab_size,
                                               tied_embedder=self.embedder if self.tie_weights else None,
                                               initializer=initializer, name="projection")

    @property
    def max_positions(self) -> int:
        return self.decoder.max_positions

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

    def __call__(self, ids: tf.Tensor, state: Optional[TransformerState] = None,
                 training: Training = False) -> Tuple[tf.Tensor, Optional[TransformerState]]:
        """Teacher-forced pass over a window.

        Args:
          ids: [batch, time] int32.
          state: None (training: positions 0..time-1, no cache, returns None),
            or a state whose cache this window extends (positions continue
            from ``state.positions``).
          training: apply dropout.

        Returns:
          ``(logits [batch, time, vocab] float32, state or None)``.
        """
        ids = tf.convert_to_tensor(ids)
        static_length = ids.shape[1] if ids.shape.rank == 2 else None
        if static_length is not None and state is None and static_length > self.max_positions:
            raise ValueError(f"ids have {static_length} time steps but max_positions is {self.max_positions}; "
                             f"use shorter windows or build with max_positions >= {static_length}")
        length = tf.shape(ids)[1]
        if state is None:
            positions = tf.range(length)[tf.newaxis, :]  # [1, time]
        else:
            positions = state.positions[:, tf.newaxis] + tf.range(length)[tf.newaxis, :]  # [batch, time]
        inputs = self._embed(ids, positions, training)  # [batch, time, hidden]
        outputs, state = self.decoder(inputs, state, training)
        return self.projection(outputs), state

    def step(self, ids: tf.Tensor, state: TransformerState) -> Tuple[tf.Tensor, TransformerState]:
        """One cached step: ids [batch] int32 at ``state.positions`` -> (logits [batch, vocab], state)."""
        inputs = self._embed(ids, state.positions, False)  # [batch, hidden]
        outputs, state = self.decoder.step(inputs, state)  # [batch, hidden]
        return self.projection(outputs), state

    def get_config(self) -> Dict[str, Any]:
        """``TrainConfig.model_config()`` keys, plus ``position_embedding`` when not "learned"."""
        config = {"model": "transformer", "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
                  "num_layers": self.decoder.num_layers, "init_scale": self.init_scale,
                  "keep_prob": _keep_prob(self.dropout), "tie_weights": self.tie_weights,
                  "embedding_dim": self.hidden_size, "num_heads": self.decoder.num_heads,
                  "ffn_dim": self.decoder.ffn_dim, "max_positions": self.decoder.max_positions,
                  "pre_layer_norm": self.decoder.pre_layer_norm}
        if self.position_embedding != "learned":
            config["position_embedding"] = self.position_embedding
        return config


# Keys of TrainConfig.model_config() and their defaults when missing (TrainConfig's).
_MODEL_KEYS: Dict[str, Any] = {
    "model": None, "vocab_size": None, "hidden_size": None, "num_layers": None,
    "init_scale": 0.1, "keep_prob": 1.0, "forget_bias": 0.0, "tie_weights": False,
    "embedding_dim": 0, "num_heads": 4, "ffn_dim": 0, "max_positions": 512, "pre_layer_norm": True,
    # Not a TrainConfig key: lets get_config() of a sinusoid transformer round-trip.
    "position_embedding": "learned",
}
_MODELS = ("lstm", "gru", "transformer")


def build_model(model_config: Mapping[str, Any]) -> LanguageModel:
    """Builds a language model from ``TrainConfig.model_config()`` keys.

    ``model`` picks the class (lstm, gru -> :class:`RNNLanguageModel`;
    transformer -> :class:`TransformerLanguageModel`); ``dropout`` is
    ``1 - keep_prob``; ``embedding_dim`` 0 means ``hidden_size`` and
    ``ffn_dim`` 0 means ``4 * hidden_size``; the optional extra key
    ``position_embedding`` ("learned" or "sinusoid") picks the transformer's
    position signal. Keys that do not apply to the
    chosen model are ignored; missing optional keys take TrainConfig's
    defaults. ``model.get_config()`` is a valid ``model_config``.

    Args:
      model_config: the mapping.

    Returns:
      The model, with its variables created.

    Raises:
      ValueError: an unknown model or key, a missing required key, or a bad
        value (the message names it).
    """
    unknown = sorted(set(model_config) - set(_MODEL_KEYS))
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(_MODEL_KEYS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(_MODEL_KEYS)}"
        raise ValueError(f"model_config has unknown key {unknown[0]!r}{hint}")
    missing = [k for k, default in _MODEL_KEYS.items() if default is None and k not in model_config]
    if missing:
        raise ValueError(f"model_config is missing required key {missing[0]!r}")
    config = {**_MODEL_KEYS, **model_config}
    name = config["model"]
    if name not in _MODELS:
        raise ValueError(f"unknown model {name!r}; use one of {', '.join(_MODELS)}")
    keep_prob = config["keep_prob"]
    if isinstance(keep_prob, bool) or not isinstance(keep_prob, (int, float)) or not 0.0 < keep_prob <= 1.0:
        raise ValueError(f"keep_prob {keep_prob!r} must be in (0, 1]")
    rate = max(0.0, 1.0 - float(keep_prob))
    if name in ("lstm", "gru"):
        return RNNLanguageModel(vocab_size=config["vocab_size"], hidden_size=config["hidden_size"],
                                num_layers=config["num_layers"], cell=name,
                                embedding_dim=config["embedding_dim"], dropout=rate,
                                forget_bias=config["forget_bias"], init_scale=config["init_scale"],
                                tie_weights=config["tie_weights"])
    return TransformerLanguageModel(vocab_size=config["vocab_size"], hidden_size=config["hidden_size"],
                                    num_layers=config["num_layers"], num_heads=config["num_heads"],
                                    ffn_dim=config["ffn_dim"], max_positions=config["max_positions"],
                                    dropout=rate, pre_layer_norm=config["pre_layer_norm"],
                                    tie_weights=config["tie_weights"], init_scale=config["init_scale"],
                                    embedding_dim=config["embedding_dim"],
                                    position_embedding=config["position_embedding"])
