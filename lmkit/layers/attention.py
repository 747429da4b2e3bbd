"""Attention: the one module every lmkit transformer attends with, and the functions it computes with.

:class:`Attention` covers, by its settings:

* query heads and as many or fewer key/value heads (grouped-query attention:
  Llama, Qwen2, Mistral), of any ``head_dim``;
* causal self-attention (``causal=True``), optionally with a sliding window
  (Mistral) and rotary positions (a :class:`~lmkit.layers.rotary.RotaryEmbedding`),
  and a pre-allocated key/value cache for incremental decoding;
* attention to a memory (``causal=False``): the encoder's outputs
  (cross-attention, keys and values computed once per source by
  :meth:`Attention.memory`), or a padded source attending to itself (an encoder);
* biases per projection, dropout on the probabilities, and three layouts of
  the projections (``fused``), so that every family keeps the variable names
  its checkpoints and Hugging Face weight maps use: GPT-2's one ``qkv``
  kernel, BART's ``query`` and ``key_value``, Llama's ``query``, ``key`` and ``value``.

The cache: per layer, keys and values of shape [batch, kv_heads, max_length,
head_dim] allocated once (:meth:`Attention.initial_cache`). A call writes the
new keys and values at each row's positions with ``tf.tensor_scatter_nd_update``
(:func:`write_cache`) and masks out the slots not yet written, so every tensor
keeps one shape from the first step to the last (one trace under
``tf.function``), every state tensor has the batch first (beam search reorders
it with a gather), and rows may sit at different positions.

A window without a cache attends through :func:`causal_attend`: in query
blocks that skip the masked keys, or through a fused kernel of
:mod:`lmkit.layers.kernels` inside its scope. The functions it computes
with live in :mod:`lmkit.layers.attend` (and are importable from here).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping, NamedTuple, Optional, Tuple, Union

import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.layers.attend import (
    AUTO_BLOCKS,
    AUTO_BLOCKS_FROM,
    attend,
    attention_blocks_for,
    causal_attend,
    causal_mask,
    check_attention_blocks,
    grouped_attend,
    masked_softmax,
)
from lmkit.layers.base import (
    Linear,
    Module,
    Training,
    check_positive_float,
    check_positive_int,
    check_rate,
    plain,
)
from lmkit.layers.documents import Documents
from lmkit.layers.precision import cast_like
from lmkit.layers.rotary import RotaryEmbedding

__all__ = [
    "AUTO_BLOCKS",
    "AUTO_BLOCKS_FROM",
    "FUSED",
    "Attention",
    "AttentionCache",
    "attend",
    "attention_blocks_for",
    "causal_attend",
    "causal_mask",
    "check_attention_blocks",
    "grouped_attend",
    "masked_softmax",
    "write_cache",
]

#: How :class:`Attention` stores its input projections: None (``query``, ``key``, ``value``),
#: ``"kv"`` (``query``, ``key_value``), ``"qkv"`` (one ``qkv``).
FUSED = (None, "kv", "qkv")


class AttentionCache(NamedTuple):
    """Keys and values of one layer, each [batch, kv_heads, max_length or keys, head_dim] (a cache or a memory)."""

    keys: tf.Tensor
    values: tf.Tensor


def write_cache(cache: AttentionCache, keys: tf.Tensor, values: tf.Tensor,
                query_positions: tf.Tensor) -> AttentionCache:
    """``cache`` with ``keys`` and ``values`` [batch, kv_heads, time, head_dim] written at
    ``query_positions`` [batch, time] of each row (one shape throughout: no concat)."""
    batch, heads, length = tf.shape(keys)[0], tf.shape(keys)[1], tf.shape(keys)[2]
    index_shape = [batch, heads, length]
    indices = tf.stack([
        tf.broadcast_to(tf.range(batch)[:, tf.newaxis, tf.newaxis], index_shape),
        tf.broadcast_to(tf.range(heads)[tf.newaxis, :, tf.newaxis], index_shape),
        tf.broadcast_to(query_positions[:, tf.newaxis, :], index_shape),
    ], axis=-1)  # [batch, heads, time, 3]
    return AttentionCache(tf.tensor_scatter_nd_update(cast_like(cache.keys, keys), indices, keys),
                          tf.tensor_scatter_nd_update(cast_like(cache.values, values), indices, values))


def _check_head_dim(dim: int, num_heads: int, head_dim: Optional[int]) -> int:
    """``head_dim``, or ``dim // num_heads`` when None (``dim`` must then split evenly over the heads)."""
    if head_dim is not None:
        return check_positive_int("head_dim", head_dim)
    if dim % num_heads:
        raise UsageError(f"dim {dim} is not divisible by num_heads {num_heads}; use a multiple of {num_heads} "
                         "or give head_dim")
    return dim // num_heads


class Attention(Module):
    """Multi-head attention with grouped key/value heads, causal (with a cache) or to a memory.

    Query head ``h`` reads key/value head ``h // (num_heads / num_kv_heads)``
    (Hugging Face's ``repeat_kv`` order); ``num_kv_heads == num_heads`` is
    plain multi-head attention, 1 is multi-query attention.

    Variables, by ``fused``: None: ``query/kernel`` [dim, heads * head_dim],
    ``key/kernel`` and ``value/kernel`` [dim, kv_heads * head_dim];
    ``"kv"``: ``query/kernel`` and ``key_value/kernel`` [dim, 2 * kv_heads *
    head_dim] (keys, then values); ``"qkv"``: ``qkv/kernel`` [dim, (heads + 2
    kv_heads) * head_dim] (queries, keys, values). Then ``output/kernel``
    [heads * head_dim, dim]. Each input projection has a ``bias`` with
    ``qkv_bias``, the output with ``output_bias``.

    The families: GPT-2 ``Attention(fused="qkv")``; BART's encoder and
    cross-attention ``Attention(causal=False, fused="kv")``; Llama
    ``Attention(num_kv_heads=..., rotary={...}, qkv_bias=False,
    output_bias=False)``, Qwen2 with ``qkv_bias=True``, Mistral with a
    ``sliding_window``.
    """

    def __init__(self, *, dim: int, num_heads: int, num_kv_heads: Optional[int] = None,
                 head_dim: Optional[int] = None, causal: bool = True, sliding_window: Optional[int] = None,
                 rotary: Union[RotaryEmbedding, Mapping[str, Any], None] = None, fused: Optional[str] = None,
                 qkv_bias: bool = True, output_bias: bool = True, dropout: float = 0.0, init_scale: float = 0.1,
                 attention_blocks: Union[int, str] = "auto", name: Optional[str] = None) -> None:
        """Creates the projections.

        Args:
          dim: model size (of the inputs and the outputs).
          num_heads: query heads.
          num_kv_heads: key/value heads, a divisor of ``num_heads`` (default: ``num_heads``).
          head_dim: features per head (default ``dim // num_heads``).
          causal: self-attention where each position sees itself and those
            before it (True), or attention to a memory or to every position
            of a padded input (False).
          sliding_window: None, or how many positions (the query's own
            included) a query sees; causal only.
          rotary: None; a :class:`RotaryEmbedding` of ``head_dim``; or its
            arguments (``{"theta": ..., "scaling": ...}``). Turns queries and
            keys by their positions; causal only.
          fused: how the input projections are stored (:data:`FUSED`); ``"qkv"`` is causal only.
          qkv_bias, output_bias: biases on the input and the output projections.
          dropout: on the attention probabilities while training.
          init_scale: kernels from uniform(-init_scale, init_scale).
          attention_blocks: a causal window without a cache attends in this
            many query blocks that skip the masked keys (:func:`causal_attend`;
            the same results, fewer scores); 1 = the whole window at once;
            ``"auto"`` (default): 4 blocks for windows of at least 1024 positions, else 1.
          name: module name.

        Raises:
          UsageError: a bad size or rate, heads that do not divide, or a
            setting that needs ``causal=True``.
        """
        super().__init__(name=name)
        self.dim = check_positive_int("dim", dim)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.num_kv_heads = check_positive_int("num_kv_heads", num_kv_heads or num_heads)
        if num_heads % self.num_kv_heads:
            raise UsageError(f"num_heads {num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        self.head_dim = _check_head_dim(dim, num_heads, head_dim)
        self.causal = bool(causal)
        self.sliding_window = None if not sliding_window else check_positive_int("sliding_window", sliding_window)
        if fused not in FUSED:
            raise UsageError(f"fused {fused!r} is not one of {', '.join(map(repr, FUSED))}")
        self.fused = fused
        if not self.causal and (self.sliding_window or rotary is not None or fused == "qkv"):
            raise UsageError("a sliding_window, rotary positions and fused='qkv' need causal self-attention; "
                             "pass causal=True, or leave them out")
        self.qkv_bias, self.output_bias = bool(qkv_bias), bool(output_bias)
        self.dropout = check_rate("dropout", dropout)
        self.init_scale = check_positive_float("init_scale", init_scale)
        self.attention_blocks = check_attention_blocks(attention_blocks)
        with self.name_scope:
            self.rotary = self._rotary(rotary)
            self._create_projections()

    def _rotary(self, rotary: Union[RotaryEmbedding, Mapping[str, Any], None]) -> Optional[RotaryEmbedding]:
        if rotary is None or isinstance(rotary, RotaryEmbedding):
            if rotary is not None and rotary.head_dim != self.head_dim:
                raise UsageError(f"the rotary embedding's head_dim {rotary.head_dim} differs from the attention's "
                                 f"{self.head_dim}; build it with head_dim={self.head_dim}")
            return rotary
        return RotaryEmbedding(head_dim=self.head_dim, name="rotary", **dict(rotary))

    def _create_projections(self) -> None:
        """The input projections in the layout ``fused`` names (queries first), then ``output``."""
        inner, kv_inner = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim

        def linear(name: str, input_size: int, output_size: int, use_bias: bool) -> Linear:
            return Linear(input_size=input_size, output_size=output_size, use_bias=use_bias,
                          init_scale=self.init_scale, name=name)

        if self.fused == "qkv":
            self.qkv = linear("qkv", self.dim, inner + 2 * kv_inner, self.qkv_bias)
        else:
            self.query = linear("query", self.dim, inner, self.qkv_bias)
            if self.fused == "kv":
                self.key_value = linear("key_value", self.dim, 2 * kv_inner, self.qkv_bias)
            else:
                self.key = linear("key", self.dim, kv_inner, self.qkv_bias)
                self.value = linear("value", self.dim, kv_inner, self.qkv_bias)
        self.output = linear("output", inner, self.dim, self.output_bias)

    def initial_cache(self, batch_size: Union[int, tf.Tensor], max_length: int) -> AttentionCache:
        """An empty cache for ``max_length`` positions: keys and values [batch, kv_heads, max_length, head_dim]."""
        zeros = tf.zeros([batch_size, self.num_kv_heads, max_length, self.head_dim], tf.float32)
        return AttentionCache(zeros, zeros)

    def memory(self, memory: tf.Tensor, training: Training = False) -> AttentionCache:
        """The keys and values of ``memory`` [batch, keys, dim], each [batch, kv_heads, keys, head_dim].

        Computed once per source and passed to every call that attends to it
        (every decoding step).

        Raises:
          UsageError: the projections are fused into one ``qkv``.
        """
        if self.fused == "qkv":
            raise UsageError("memory() needs keys and values projected apart from the queries; build the "
                             "attention with fused='kv' or None")
        return self._keys_values(memory, training)

    def _heads(self, x: tf.Tensor, heads: int) -> tf.Tensor:
        """[batch, time, heads * head_dim] -> [batch, heads, time, head_dim]."""
        batch, length = tf.shape(x)[0], tf.shape(x)[1]
        return tf.transpose(tf.reshape(x, [batch, length, heads, self.head_dim]), [0, 2, 1, 3])

    def _keys_values(self, x: tf.Tensor, training: Training) -> AttentionCache:
        """Keys and values of ``x`` [batch, time, dim] (separate or ``key_value`` projections)."""
        if self.fused == "kv":
            keys, values = tf.split(self.key_value(x, training), 2, axis=-1)  # each [batch, time, kv_heads * hd]
        else:
            keys, values = self.key(x, training), self.value(x, training)
        return AttentionCache(self._heads(keys, self.num_kv_heads), self._heads(values, self.num_kv_heads))

    def _project(self, inputs: tf.Tensor, training: Training) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """Queries [batch, heads, time, head_dim], keys and values [batch, kv_heads, time, head_dim] of ``inputs``."""
        if self.fused == "qkv":
            inner, kv_inner = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            queries, keys, values = tf.split(self.qkv(inputs, training), [inner, kv_inner, kv_inner], axis=-1)
            return (self._heads(queries, self.num_heads), self._heads(keys, self.num_kv_heads),
                    self._heads(values, self.num_kv_heads))
        queries = self._heads(self.query(inputs, training), self.num_heads)
        keys, values = self._keys_values(inputs, training)
        return queries, keys, values

    def __call__(self, inputs: tf.Tensor, training: Training = False, cache: Optional[AttentionCache] = None,
                 positions: Optional[tf.Tensor] = None, *, memory: Optional[AttentionCache] = None,
                 mask: Optional[tf.Tensor] = None,
                 documents: Optional[Documents] = None) -> Tuple[tf.Tensor, Optional[AttentionCache]]:
        """Attends from ``inputs`` [batch, time, dim].

        Causal: each position attends to itself and the (windowed) positions
        before it. Without a ``cache`` the window stands alone and starts at
        position 0; with one it extends the cache from ``positions``.
        Not causal: the inputs attend to ``memory`` (cross-attention) or,
        without one, to themselves (an encoder), every key that ``mask`` keeps.

        Args:
          inputs: [batch, time, dim] float32 (or the compute dtype of a mixed-precision policy).
          training: apply dropout.
          cache: causal only: None, or the keys and values of the earlier positions.
          positions: with ``cache``: [batch] int32, where each row's window
            starts (the number of tokens already cached). Rows must satisfy
            ``positions + time <= max_length`` (on CPU a violation raises an
            error; on GPU the write would be dropped).
          memory: not causal only: keys and values from :meth:`memory`.
          mask: not causal only: [batch, keys] bool, True where a key holds a
            token (False: padding, never attended); None keeps every key.
          documents: causal without a cache only: a packed window's per-token examples and positions
            (:class:`~lmkit.layers.documents.Documents`): a query sees its own example's keys alone.

        Returns:
          ``(outputs [batch, time, dim], cache)``; the cache is None when none was given.

        Raises:
          UsageError: a cache without positions, or an argument the other kind of attention takes.
        """
        batch, length = tf.shape(inputs)[0], tf.shape(inputs)[1]
        if self.causal:
            if memory is not None or mask is not None:
                raise UsageError("a causal attention attends to its inputs: build it with causal=False to pass "
                                 "a memory or a mask")
            context, cache = self._causal(inputs, training, cache, positions, documents)
        else:
            if cache is not None or documents is not None:
                raise UsageError("a cache and documents serve causal self-attention; an attention built with "
                                 "causal=False takes its keys and values as memory=")
            context = self._to_memory(inputs, training, memory, mask)
        context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [batch, length, self.num_heads * self.head_dim])
        return self.output(context, training), cache

    def _causal(self, inputs: tf.Tensor, training: Training, cache: Optional[AttentionCache],
                positions: Optional[tf.Tensor],
                documents: Optional[Documents]) -> Tuple[tf.Tensor, Optional[AttentionCache]]:
        """The context [batch, heads, time, head_dim] of causal self-attention, and the extended cache."""
        length = tf.shape(inputs)[1]
        if documents is not None and cache is not None:
            raise UsageError("documents describe a packed window, which is attended without a cache")
        if cache is None:  # [1, time], or a packed window's [batch, time]
            query_positions = tf.range(length)[tf.newaxis, :] if documents is None else documents.positions
        else:
            if positions is None:
                raise UsageError("positions is None but a cache was given; pass the [batch] int32 positions")
            query_positions = tf.cast(positions, tf.int32)[:, tf.newaxis] + tf.range(length)[tf.newaxis, :]
        queries, keys, values = self._project(inputs, training)
        if self.rotary is not None:
            cos, sin = self.rotary.cos_sin(query_positions)  # [1 or batch, time, head_dim]
            cos, sin = cos[:, tf.newaxis], sin[:, tf.newaxis]  # broadcast over heads
            queries, keys = self.rotary.rotate(queries, cos, sin), self.rotary.rotate(keys, cos, sin)
        # Scaling the queries is cheaper than scaling the [time, keys] scores.
        queries = queries * (1.0 / math.sqrt(self.head_dim))
        if cache is None:  # one window from position 0: query i sees keys 0..i (in its sliding window)
            context = causal_attend(queries, keys, values, self.attention_blocks, self.dropout, training,
                                    self.sliding_window, None if documents is None else documents.segment_ids)
            return context, None
        cache = write_cache(cache, keys, values, query_positions)
        keys, values = cache  # [batch, kv_heads, max_length, head_dim]
        # [batch, 1, time, max_length]: slots after the query (or before its window) are future or unwritten.
        mask = causal_mask(query_positions, tf.range(tf.shape(keys)[2]), self.sliding_window)
        return grouped_attend(queries, keys, values, mask, self.dropout, training), cache

    def _to_memory(self, inputs: tf.Tensor, training: Training, memory: Optional[AttentionCache],
                   mask: Optional[tf.Tensor]) -> tf.Tensor:
        """The context [batch, heads, time, head_dim] of attention to ``memory`` (or to ``inputs``), masked."""
        if memory is None:  # a padded source attending to itself
            memory = self._keys_values(inputs, training)
        queries = self._heads(self.query(inputs, training), self.num_heads) * (1.0 / math.sqrt(self.head_dim))
        if mask is not None:
            mask = tf.cast(mask, tf.bool)[:, tf.newaxis, tf.newaxis, :]  # [batch, 1, 1, keys]
        # A memory computed under another precision than this call's takes the queries' dtype.
        return grouped_attend(queries, cast_like(memory.keys, queries), cast_like(memory.values, queries), mask,
                              self.dropout, training)

    def get_config(self) -> Dict[str, Any]:
        rotary = None if self.rotary is None else {"theta": self.rotary.theta, "scaling": plain(self.rotary.scaling)}
        return {"dim": self.dim, "num_heads": self.num_heads, "num_kv_heads": self.num_kv_heads,
                "head_dim": self.head_dim, "causal": self.causal, "sliding_window": self.sliding_window,
                "rotary": rotary, "fused": self.fused, "qkv_bias": self.qkv_bias, "output_bias": self.output_bias,
                "dropout": self.dropout, "init_scale": self.init_scale, "attention_blocks": self.attention_blocks,
                "name": self.name}
