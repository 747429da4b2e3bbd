"""The transformer's residual layers and the decoder-only stack, with cached decoding.

* :class:`ResidualLayer`: an attention block and a feed-forward block, each
  with a residual connection, pre- or post-layer-norm; what every transformer
  layer of lmkit shares (the encoder's and the cross-attending decoder's in
  :mod:`lmkit.layers.encoder_decoder` too).
* :class:`TransformerLayer`, :class:`TransformerDecoder`: causal
  self-attention (:class:`~lmkit.layers.attention.Attention`) and the MLP
  (GPT-2's layer), stacked, with a final layer norm for pre-layer-norm.
* :func:`run_layers`, :func:`layer_stack`, :func:`empty_state`: the pieces of
  every stack, the Llama family's too; :func:`initialize_like_gpt2`: GPT-2's
  initial values for a stack's model.

For incremental decoding a stack takes a :class:`TransformerState`: per-row
positions [batch] int32 and, per layer, the key/value cache of
:mod:`lmkit.layers.attention` ([batch, kv_heads, max_length, head_dim],
allocated once by ``initial_state``); every tensor keeps one shape from the
first step to the last, and every state tensor has the batch first
(``reorder_state`` is a gather).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import tensorflow as tf

from lmkit.core.checks import check_heads
from lmkit.core.errors import UsageError
from lmkit.layers.attention import Attention, AttentionCache, check_attention_blocks
from lmkit.layers.base import Linear, Module, Training, check_positive_float, check_positive_int, check_rate, dropout
from lmkit.layers.documents import Documents
from lmkit.layers.feedforward import check_activation, feed_forward
from lmkit.layers.norms import LayerNorm

__all__ = [
    "ResidualLayer",
    "TransformerDecoder",
    "TransformerLayer",
    "TransformerState",
    "default_ffn_dim",
    "empty_state",
    "initialize_like_gpt2",
    "layer_stack",
    "run_layers",
]


class TransformerState(NamedTuple):
    """Decoding state of a :class:`TransformerDecoder`.

    Attributes:
      positions: [batch] int32, the number of tokens already in each row's
        cache (= the position of the next token).
      caches: one :class:`AttentionCache` per layer.
    """

    positions: tf.Tensor
    caches: Tuple[AttentionCache, ...]


def run_layers(layers: Sequence[Any], inputs: tf.Tensor, state: Optional[TransformerState], training: Training,
               documents: Optional[Documents] = None) -> Tuple[tf.Tensor, Optional[TransformerState]]:
    """Runs decoder ``layers`` (each ``layer(x, training, cache, positions) -> (x, cache)``) over a window.

    Without a state every layer attends within the window (within each example of a packed window:
    ``documents``, passed to each layer as ``documents=``); with one, each
    extends its cache and the state advances by the window's length.
    """
    x = inputs
    if state is None:
        for layer in layers:
            x, _ = layer(x, training) if documents is None else layer(x, training, documents=documents)
        return x, None
    if len(state.caches) != len(layers):
        raise UsageError(f"state has {len(state.caches)} layer caches but the decoder has "
                         f"{len(layers)} layers; use this decoder's initial_state")
    caches: List[AttentionCache] = []
    for layer, cache in zip(layers, state.caches):
        x, cache = layer(x, training, cache, state.positions)
        caches.append(cache)
    return x, TransformerState(state.positions + tf.shape(inputs)[1], tuple(caches))


class ResidualLayer(Module):
    """What every transformer layer shares: an attention block and a feed-forward block (and, in
    subclasses, blocks between them), each with a residual connection.

    Pre-layer-norm (GPT-2): ``x + drop(f(norm(x)))``; post-layer-norm
    (Vaswani et al.): ``norm(x + drop(f(x)))``. A subclass names its
    attention (:meth:`_attention`) and any modules between the two blocks
    (:meth:`_middle`); the variables are created in the order attention,
    ``attention_norm``, the middle's, ``ffn_inner`` (Linear dim -> ffn_dim),
    ``ffn_outer`` (Linear ffn_dim -> dim), ``ffn_norm``. Without ``use_bias`` the
    projections have no ``bias`` and the norms no ``offset``.
    """

    def __init__(self,
                 *,
                 dim: int,
                 num_heads: int,
                 ffn_dim: int,
                 dropout: float = 0.0,
                 attention_dropout: Optional[float] = None,
                 pre_layer_norm: bool = True,
                 activation: str = "gelu",
                 init_scale: float = 0.1,
                 layer_norm_epsilon: float = 1e-5,
                 use_bias: bool = True,
                 name: Optional[str] = None) -> None:
        """Creates the sub-modules.

        Args:
          dim: model size; a multiple of ``num_heads``.
          num_heads: attention heads.
          ffn_dim: inner size of the feed-forward block.
          dropout: residual dropout rate while training.
          attention_dropout: dropout on attention probabilities; ``dropout`` when None.
          pre_layer_norm: normalize before (True) or after (False) each block.
          activation: ``"gelu"`` (tanh approximation), ``"gelu_exact"`` or ``"relu"``.
          init_scale: kernels from uniform(-init_scale, init_scale).
          layer_norm_epsilon: added to the variance in every layer norm.
          use_bias: biases in the projections and offsets in the layer norms
            (False: neither, as nanoGPT's ``bias=False``).
          name: module name.

        Raises:
          ValueError: bad sizes, rates or activation.
        """
        super().__init__(name=name)
        self.dim = check_positive_int("dim", dim)
        check_heads("dim", dim, num_heads)
        self.num_heads = num_heads
        self.ffn_dim = check_positive_int("ffn_dim", ffn_dim)
        self.dropout = check_rate("dropout", dropout)
        self.attention_dropout = check_rate(
            "attention_dropout", dropout if attention_dropout is None else attention_dropout)
        self.activation = check_activation(activation)
        self.pre_layer_norm = bool(pre_layer_norm)
        self.init_scale = check_positive_float("init_scale", init_scale)
        self.use_bias = bool(use_bias)
        with self.name_scope:
            self.attention = self._attention()
            self.attention_norm = LayerNorm(dim=dim, epsilon=layer_norm_epsilon, use_offset=self.use_bias,
                                            name="attention_norm")
            self._middle()
            self.ffn_inner = Linear(input_size=dim, output_size=ffn_dim, use_bias=self.use_bias, init_scale=init_scale,
                                    name="ffn_inner")
            self.ffn_outer = Linear(input_size=ffn_dim, output_size=dim, use_bias=self.use_bias, init_scale=init_scale,
                                    name="ffn_outer")
            self.ffn_norm = LayerNorm(dim=dim, epsilon=layer_norm_epsilon, use_offset=self.use_bias, name="ffn_norm")

    def _attention(self) -> Module:
        """The first block's attention module (named ``attention``)."""
        raise NotImplementedError

    def _middle(self) -> None:
        """Creates the modules of any blocks between attention and feed-forward (none here)."""

    def _residual(self, x: tf.Tensor, norm: LayerNorm, block: Callable[[tf.Tensor], tf.Tensor],
                  training: Training) -> tf.Tensor:
        """``x + drop(block(norm(x)))`` (pre-LN) or ``norm(x + drop(block(x)))`` (post-LN)."""
        if self.pre_layer_norm:
            return x + dropout(block(norm(x)), self.dropout, training)
        return norm(x + dropout(block(x), self.dropout, training))

    def _feed_forward(self, x: tf.Tensor, training: Training = False) -> tf.Tensor:
        return feed_forward(x, self.ffn_inner, self.ffn_outer, self.activation, training)  # [batch, time, dim]

    def get_config(self) -> Dict[str, Any]:
        return {"dim": self.dim, "num_heads": self.num_heads, "ffn_dim": self.ffn_dim,
                "dropout": self.dropout, "attention_dropout": self.attention_dropout,
                "pre_layer_norm": self.pre_layer_norm, "activation": self.activation,
                "init_scale": self.init_scale, "layer_norm_epsilon": self.attention_norm.epsilon,
                "use_bias": self.use_bias, "name": self.name}


class TransformerLayer(ResidualLayer):
    """Causal self-attention and a feed-forward block, each with a residual connection.

    Pre-layer-norm (GPT-2): ``x + drop(f(norm(x)))``; post-layer-norm
    (Vaswani et al.): ``norm(x + drop(f(x)))``. Arguments as :class:`ResidualLayer`.

    Variables: ``attention/...`` (an :class:`~lmkit.layers.attention.Attention` with one ``qkv`` kernel),
    ``attention_norm/...``, ``ffn_inner`` (Linear dim -> ffn_dim),
    ``ffn_outer`` (Linear ffn_dim -> dim), ``ffn_norm/...``.

    ``attention_blocks``: the query blocks of a window's attention without a
    cache (:func:`~lmkit.layers.attention.causal_attend`); 1 = one block; ``"auto"``: 4 from windows of
    1024 positions.
    """

    def __init__(self, *, attention_blocks: Union[int, str] = "auto", **options: Any) -> None:
        self.attention_blocks = check_attention_blocks(attention_blocks)
        super().__init__(**options)

    def _attention(self) -> Module:
        return Attention(dim=self.dim, num_heads=self.num_heads, fused="qkv", dropout=self.attention_dropout,
                         qkv_bias=self.use_bias, output_bias=self.use_bias, init_scale=self.init_scale,
                         attention_blocks=self.attention_blocks, name="attention")

    def get_config(self) -> Dict[str, Any]:
        return {**super().get_config(), "attention_blocks": self.attention_blocks}

    def __call__(self,
                 inputs: tf.Tensor,
                 training: Training = False,
                 cache: Optional[AttentionCache] = None,
                 positions: Optional[tf.Tensor] = None,
                 documents: Optional[Documents] = None) -> Tuple[tf.Tensor, Optional[AttentionCache]]:
        """Applies the layer; arguments as in :meth:`lmkit.layers.attention.Attention.__call__`.

        Returns:
          ``(outputs [batch, time, dim], cache)``.
        """
        x, cache = self._self_attention(inputs, training, cache, positions, documents)
        return self._residual(x, self.ffn_norm, lambda h: self._feed_forward(h, training), training), cache

    def _self_attention(self, inputs: tf.Tensor, training: Training, cache: Optional[AttentionCache],
                        positions: Optional[tf.Tensor],
                        documents: Optional[Documents] = None) -> Tuple[tf.Tensor, Optional[AttentionCache]]:
        """The first block (residual included) and the extended cache."""
        extended = [cache]

        def attention(x: tf.Tensor) -> tf.Tensor:
            attended, extended[0] = self.attention(x, training, cache, positions, documents=documents)
            return attended

        return self._residual(inputs, self.attention_norm, attention, training), extended[0]


def default_ffn_dim(ffn_dim: int, dim: int) -> int:
    """A stack's feed-forward size: ``ffn_dim``, or ``4 * dim`` for 0."""
    if isinstance(ffn_dim, bool) or not isinstance(ffn_dim, int) or ffn_dim < 0:
        raise UsageError(f"ffn_dim {ffn_dim!r} must be an integer >= 0 (0 means 4 * dim = {4 * dim})")
    return ffn_dim or 4 * dim


def layer_stack(layer_class: Any, num_layers: int, **options: Any) -> Tuple[List[Any], Optional[LayerNorm]]:
    """``num_layers`` layers ``layer_<i>`` of ``layer_class`` and, with ``pre_layer_norm``, the final layer
    norm ``final_norm`` (None otherwise): the body of every transformer stack. Call it in the stack's name scope."""
    layers = [layer_class(name=f"layer_{i}", **options) for i in range(num_layers)]
    final_norm = (LayerNorm(dim=options["dim"], epsilon=options["layer_norm_epsilon"],
                            use_offset=options.get("use_bias", True), name="final_norm")
                  if options["pre_layer_norm"] else None)
    return layers, final_norm


def initialize_like_gpt2(module: tf.Module, layers: Sequence[Any], init_scale: float) -> None:
    """Redraws every matrix of ``module`` (its variables of rank 2: kernels, embedding tables) as GPT-2 starts.

    From normal(0, init_scale), and the two projections of each of ``layers``
    that write into the residual stream (attention's ``output`` and
    ``ffn_outer``) from normal(0, init_scale / sqrt(2 * len(layers))), which
    keeps the stream's variance from growing with depth (GPT-2 paper, section
    2.3; nanoGPT's ``_init_weights`` with 0.02). Biases and norms keep their
    values. Draws from TensorFlow's global seed, in ``module.variables`` order.
    """
    residual_scale = init_scale / math.sqrt(2 * len(layers))
    residual = {kernel.ref() for layer in layers for kernel in (layer.attention.output.kernel, layer.ffn_outer.kernel)}
    for variable in module.variables:  # a LoRA base's frozen() variables too, not only the trainable ones
        if variable.shape.rank == 2:
            stddev = residual_scale if variable.ref() in residual else init_scale
            variable.assign(tf.random.normal(variable.shape, stddev=stddev, dtype=variable.dtype))


def empty_state(attentions: Sequence[Any], batch_size: Union[int, tf.Tensor], max_length: Optional[int],
                max_positions: int) -> TransformerState:
    """A :class:`TransformerState` at position 0 with an empty cache of ``max_length`` (default
    ``max_positions``) positions for each of ``attentions`` (modules with ``initial_cache``).

    Raises:
      UsageError: ``max_length`` is not in [1, max_positions].
    """
    if max_length is None:
        max_length = max_positions
    check_positive_int("max_length", max_length)
    if max_length > max_positions:
        raise UsageError(f"max_length {max_length} exceeds max_positions {max_positions}; "
                         f"use max_length <= {max_positions} or build with a larger max_positions")
    return TransformerState(positions=tf.zeros([batch_size], tf.int32),
                            caches=tuple(a.initial_cache(batch_size, max_length) for a in attentions))


class TransformerDecoder(Module):
    """A stack of causal :class:`TransformerLayer` s with a cached decoding step.

    Takes already-embedded inputs (token plus position embeddings: the
    language model adds them). With ``pre_layer_norm`` a final layer norm
    follows the last layer, as in GPT-2.

    Variables: ``layer_<i>/...`` per layer and, with ``pre_layer_norm``,
    ``final_norm/scale`` and (with ``use_bias``) ``final_norm/offset``.
    """

    def __init__(self,
                 *,
                 num_layers: int,
                 dim: int,
                 num_heads: int,
                 ffn_dim: int = 0,
                 dropout: float = 0.0,
                 attention_dropout: Optional[float] = None,
                 pre_layer_norm: bool = True,
                 max_positions: int = 512,
                 activation: str = "gelu",
                 init_scale: float = 0.1,
                 layer_norm_epsilon: float = 1e-5,
                 attention_blocks: Union[int, str] = "auto",
                 use_bias: bool = True,
                 name: Optional[str] = None) -> None:
        """Creates the layers.

        Args:
          num_layers: number of layers.
          dim: model size; a multiple of ``num_heads``.
          num_heads: attention heads.
          ffn_dim: feed-forward inner size; 0 means ``4 * dim``.
          dropout: residual dropout rate while training.
          attention_dropout: dropout on attention probabilities; ``dropout`` when None.
          pre_layer_norm: GPT-2 style (True) or the original post-layer-norm.
          max_positions: default and largest cache length of ``initial_state``.
          activation: ``"gelu"`` (tanh approximation), ``"gelu_exact"`` or ``"relu"``.
          init_scale: kernels from uniform(-init_scale, init_scale).
          layer_norm_epsilon: added to the variance in every layer norm
            (GPT-2's ``layer_norm_epsilon``).
          attention_blocks: the query blocks of a window's attention without a
            cache (:func:`~lmkit.layers.attention.causal_attend`: the masked keys after each block are
            skipped); 1 = one block; ``"auto"`` (default): 4 blocks for windows of
            at least 1024 positions, else 1. Speed only: the results are the same.
          use_bias: biases in the projections and offsets in the layer norms
            (False: neither, as nanoGPT's ``bias=False``).
          name: module name.

        Raises:
          ValueError: ``dim`` is not divisible by ``num_heads``, or a bad size,
            rate or activation.
        """
        super().__init__(name=name)
        self.num_layers = check_positive_int("num_layers", num_layers)
        self.dim = check_positive_int("dim", dim)
        check_heads("dim", dim, num_heads)
        self.num_heads = num_heads
        self.ffn_dim = default_ffn_dim(ffn_dim, dim)
        self.max_positions = check_positive_int("max_positions", max_positions)
        self.pre_layer_norm = bool(pre_layer_norm)
        with self.name_scope:
            self.layers, self.final_norm = layer_stack(
                TransformerLayer, num_layers, dim=dim, num_heads=num_heads, ffn_dim=self.ffn_dim, dropout=dropout,
                attention_dropout=attention_dropout, pre_layer_norm=pre_layer_norm, activation=activation,
                init_scale=init_scale, layer_norm_epsilon=layer_norm_epsilon, attention_blocks=attention_blocks,
                use_bias=use_bias)

    def initial_state(self, batch_size: Union[int, tf.Tensor],
                      max_length: Optional[int] = None) -> TransformerState:
        """An empty cache.

        Args:
          batch_size: rows.
          max_length: cache length (prompt plus generated tokens);
            ``max_positions`` when None.

        Returns:
          A :class:`TransformerState` with positions 0 and zeroed caches of
          [batch, heads, max_length, head_dim].

        Raises:
          ValueError: ``max_length`` is not in [1, max_positions].
        """
        return empty_state([layer.attention for layer in self.layers], batch_size, max_length, self.max_positions)

    def __call__(self,
                 inputs: tf.Tensor,
                 state: Optional[TransformerState] = None,
                 training: Training = False,
                 documents: Optional[Documents] = None) -> Tuple[tf.Tensor, Optional[TransformerState]]:
        """Runs the stack over a window.

        Args:
          inputs: [batch, time, dim] float32 embedded tokens.
          state: None for a self-contained window (training); or a state from
            :meth:`initial_state` or an earlier call, whose cache this window
            extends (prompt prefill, chunked decoding).
          training: apply dropout.
          documents: without a state: a packed window's examples (:mod:`lmkit.layers.documents`).

        Returns:
          ``(outputs [batch, time, dim], state)``; the state is None when
          none was given, else advanced by ``time`` positions.
        """
        x, state = run_layers(self.layers, inputs, state, training, documents)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, state

    def step(self,
             inputs: tf.Tensor,
             state: TransformerState,
             training: Training = False) -> Tuple[tf.Tensor, TransformerState]:
        """One cached decoding step.

        Args:
          inputs: [batch, dim] float32, the embedded token at ``state.positions``.
          state: the state after the previous tokens.
          training: apply dropout.

        Returns:
          ``(outputs [batch, dim], new_state)``.
        """
        outputs, state = self(inputs[:, tf.newaxis, :], state, training)
        return outputs[:, 0, :], state

    def get_config(self) -> Dict[str, Any]:
        layer = self.layers[0]
        return {"num_layers": self.num_layers, "dim": self.dim, "num_heads": self.num_heads,
                "ffn_dim": self.ffn_dim, "dropout": layer.dropout,
                "attention_dropout": layer.attention_dropout, "pre_layer_norm": self.pre_layer_norm,
                "layer_norm_epsilon": layer.attention_norm.epsilon,
                "max_positions": self.max_positions, "activation": layer.activation,
                "init_scale": layer.init_scale, "attention_blocks": layer.attention_blocks, "use_bias": layer.use_bias,
                "name": self.name}
