"""The blocks of Llama-family decoders: RMSNorm, rotary positions, gated feed-forward, grouped-query attention.

Llama 3, Qwen2/2.5, Mistral, SmolLM and TinyLlama share one layer: RMSNorm
before attention and before a SwiGLU feed-forward block, rotary position
embeddings on queries and keys, fewer key/value heads than query heads
(grouped-query attention), no biases (Qwen2: on q/k/v) and, for Mistral, a
sliding attention window. Each block here works alone, under ``tf.function``
and XLA, in mixed precision (statistics and rotations in float32), and with
the pre-allocated key/value cache of :mod:`lmkit.layers.transformer` (the
same :class:`TransformerState`, ``[batch, kv_heads, max_length, head_dim]``
per layer, so the decode loop, sliding generation and beam search serve it).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.layers.base import (Linear, Module, Training, check_positive_float, check_positive_int,
                                check_rate, dropout, ones_initializer)
from lmkit.layers.transformer import (AttentionCache, TransformerState, causal_attend, causal_mask,
                                       check_attention_blocks, empty_state, grouped_attend, run_layers, write_cache)
from lmkit.layers.precision import cast_like

__all__ = ["GatedFeedForward", "GroupedQueryAttention", "LlamaDecoder", "LlamaLayer", "RMSNorm",
           "RotaryEmbedding", "ROPE_TYPES"]


_ACTIVATIONS = {"silu": tf.nn.silu, "gelu": lambda x: tf.nn.gelu(x, approximate=True)}

#: rope_scaling types: none, "linear" (positions / factor), "llama3" (Llama 3.1's frequency bands).
ROPE_TYPES = ("default", "linear", "llama3")


class RMSNorm(Module):
    """Root-mean-square normalization (Zhang and Sennrich, 2019): ``x / rms(x) * scale``.

    Variables: ``scale`` [dim] (ones). No mean is subtracted and there is no offset.
    """

    def __init__(self, *, dim: int, epsilon: float = 1e-6, name: Optional[str] = None) -> None:
        """Creates the variable.

        Args:
          dim: size of the last axis.
          epsilon: added to the mean square.
          name: module name.
        """
        super().__init__(name=name)
        self.dim = check_positive_int("dim", dim)
        self.epsilon = check_positive_float("epsilon", epsilon)
        with self.name_scope:
            self.scale = tf.Variable(ones_initializer()([dim], tf.float32), name="scale")

    def __call__(self, inputs: tf.Tensor) -> tf.Tensor:
        """Normalizes ``inputs`` [..., dim]; the statistics in float32, the result in the input's dtype.

        As in Hugging Face's Llama, the normalized value is cast back to the
        input's dtype before the scale multiplies it.
        """
        x = tf.cast(inputs, tf.float32)
        normalized = x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), axis=-1, keepdims=True) + self.epsilon)
        return cast_like(self.scale, inputs) * cast_like(normalized, inputs)

    def get_config(self) -> Dict[str, Any]:
        return {"dim": self.dim, "epsilon": self.epsilon, "name": self.name}


def plain(value: Any) -> Any:
    """``value`` with the dicts and lists that ``tf.Module`` wraps for tracking turned back into plain ones."""
    if isinstance(value, (str, bytes)):
        return value
    if hasattr(value, "keys") and hasattr(value, "items"):  # dict, or tf's _DictWrapper (not a Mapping)
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ in ("ListWrapper", "_TupleWrapper"):
        return [plain(v) for v in value]
    return value


def _check_rope_scaling(scaling: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    if not scaling:
        return None
    scaling = dict(scaling)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise UsageError(f"rope_scaling type {kind!r} is not supported; lmkit computes {', '.join(ROPE_TYPES)}")
    scaling["rope_type"] = kind
    scaling.pop("type", None)
    if kind == "default":
        return None
    factor = scaling.get("factor")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0:
        raise UsageError(f"rope_scaling factor {factor!r} must be a number > 0")
    if kind == "llama3":
        for key in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if not isinstance(scaling.get(key), (int, float)) or scaling[key] <= 0:
                raise UsageError(f"rope_scaling of type llama3 needs {key} > 0, got {scaling.get(key)!r}")
        if scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
            raise UsageError("rope_scaling: high_freq_factor must exceed low_freq_factor")
    return scaling


class RotaryEmbedding(Module):
    """Rotary position embeddings (Su et al., 2021) in Hugging Face's half-split layout.

    The first and second halves of each head's features form the pairs that
    rotate by ``position * inv_freq``, with ``inv_freq[i] = theta ** (-2i / head_dim)``,
    optionally rescaled (``scaling``: ``{"rope_type": "linear", "factor": f}``
    or Llama 3.1's ``{"rope_type": "llama3", "factor", "low_freq_factor",
    "high_freq_factor", "original_max_position_embeddings"}``). No variables.
    """

    def __init__(self, *, head_dim: int, theta: float = 10000.0,
                 scaling: Optional[Mapping[str, Any]] = None, name: Optional[str] = None) -> None:
        """Computes the frequencies.

        Args:
          head_dim: features per head (even).
          theta: the base (``rope_theta``).
          scaling: None, or a ``rope_scaling`` dict as in a Hugging Face config.
          name: module name.
        """
        super().__init__(name=name)
        self.head_dim = check_positive_int("head_dim", head_dim)
        if head_dim % 2:
            raise UsageError(f"head_dim {head_dim} must be even for rotary embeddings")
        self.theta = check_positive_float("rope_theta", float(theta))
        self.scaling = _check_rope_scaling(scaling)
        self.inv_freq = tf.constant(self._inv_freq(), tf.float32)  # [head_dim / 2]

    def _inv_freq(self) -> List[float]:
        half = self.head_dim // 2
        inv = [1.0 / (self.theta ** (2 * i / self.head_dim)) for i in range(half)]
        if self.scaling is None:
            return inv
        factor = float(self.scaling["factor"])
        if self.scaling["rope_type"] == "linear":
            return [f / factor for f in inv]
        low, high = float(self.scaling["low_freq_factor"]), float(self.scaling["high_freq_factor"])
        old = float(self.scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old / low, old / high
        out = []
        for f in inv:
            wavelen = 2 * math.pi / f
            if wavelen < high_wavelen:  # high frequencies: unchanged
                out.append(f)
            elif wavelen > low_wavelen:  # low frequencies: interpolated
                out.append(f / factor)
            else:  # in between: a smooth blend
                smooth = (old / wavelen - low) / (high - low)
                out.append((1 - smooth) * f / factor + smooth * f)
        return out

    def cos_sin(self, positions: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        """``cos`` and ``sin`` of the rotation angles: positions [..., time] -> each [..., time, head_dim] float32."""
        angles = tf.cast(positions, tf.float32)[..., tf.newaxis] * self.inv_freq  # [..., time, half]
        angles = tf.concat([angles, angles], axis=-1)
        return tf.cos(angles), tf.sin(angles)

    @staticmethod
    def rotate(x: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor) -> tf.Tensor:
        """Rotates ``x`` [..., head_dim] by the angles whose ``cos``/``sin`` broadcast to it (float32 math)."""
        x32 = tf.cast(x, tf.float32)
        first, second = tf.split(x32, 2, axis=-1)
        rotated = tf.concat([-second, first], axis=-1)
        return cast_like(x32 * cos + rotated * sin, x)

    def get_config(self) -> Dict[str, Any]:
        return {"head_dim": self.head_dim, "theta": self.theta, "scaling": plain(self.scaling), "name": self.name}


class GatedFeedForward(Module):
    """``down(act(gate(x)) * up(x))`` (SwiGLU with ``silu``; Shazeer, 2020), without biases.

    Variables: ``gate/kernel`` and ``up/kernel`` [dim, ffn_dim], ``down/kernel`` [ffn_dim, dim].
    """

    def __init__(self, *, dim: int, ffn_dim: int, activation: str = "silu", init_scale: float = 0.02,
                 name: Optional[str] = None) -> None:
        super().__init__(name=name)
        self.dim = check_positive_int("dim", dim)
        self.ffn_dim = check_positive_int("ffn_dim", ffn_dim)
        if activation not in _ACTIVATIONS:
            raise UsageError(f"activation {activation!r} is not one of {', '.join(_ACTIVATIONS)}")
        self.activation = activation
        self.init_scale = check_positive_float("init_scale", init_scale)
        with self.name_scope:
            self.gate = Linear(input_size=dim, output_size=ffn_dim, use_bias=False, init_scale=init_scale,
                               name="gate")
            self.up = Linear(input_size=dim, output_size=ffn_dim, use_bias=False, init_scale=init_scale,
                             name="up")
            self.down = Linear(input_size=ffn_dim, output_size=dim, use_bias=False, init_scale=init_scale,
                               name="down")

    def __call__(self, inputs: tf.Tensor, training: Training = False) -> tf.Tensor:
        """inputs [..., dim] -> [..., dim]; ``training`` reaches the layers' adapters (LoRA dropout)."""
        gated = _ACTIVATIONS[self.activation](self.gate(inputs, training)) * self.up(inputs, training)
        return self.down(gated, training)

    def get_config(self) -> Dict[str, Any]:
        return {"dim": self.dim, "ffn_dim": self.ffn_dim, "activation": self.activation,
                "init_scale": self.init_scale, "name": self.name}


class GroupedQueryAttention(Module):
    """Causal self-attention with ``num_kv_heads`` key/value heads shared by groups of query heads.

    Query head ``h`` reads key/value head ``h // (num_heads / num_kv_heads)``
    (Hugging Face's ``repeat_kv`` order); ``num_kv_heads == num_heads`` is
    plain multi-head attention, 1 is multi-query attention. Rotary embeddings
    turn queries and keys by their positions; an optional sliding window
    limits how far back a query sees.

    Variables: ``query/kernel`` [dim, heads * head_dim], ``key/kernel`` and
    ``value/kernel`` [dim, kv_heads * head_dim], ``output/kernel``
    [heads * head_dim, dim]; biases on query/key/value with ``qkv_bias``
    (Qwen2) and on the output with ``output_bias``.
    """

    def __init__(self, *, dim: int, num_heads: int, num_kv_heads: Optional[int] = None,
                 head_dim: Optional[int] = None, rope_theta: float = 10000.0,
                 rope_scaling: Optional[Mapping[str, Any]] = None, sliding_window: Optional[int] = None,
                 qkv_bias: bool = False, output_bias: bool = False, dropout: float = 0.0,
                 init_scale: float = 0.02, attention_blocks: Union[int, str] = "auto",
                 name: Optional[str] = None) -> None:
        """Creates the projections.

        Args:
          dim: model size.
          num_heads: query heads.
          num_kv_heads: key/value heads, a divisor of ``num_heads`` (default: ``num_heads``).
          head_dim: features per head (default ``dim // num_heads``).
          rope_theta, rope_scaling: the rotary embedding's base and scaling.
          sliding_window: None, or how many positions (the query's own included) a query sees.
          qkv_bias, output_bias: biases on the query/key/value and output projections.
          dropout: on the attention probabilities while training.
          init_scale: kernels from uniform(-init_scale, init_scale).
          attention_blocks: a window without a cache attends in this many query
            blocks that skip the masked keys (:func:`lmkit.layers.transformer.causal_attend`;
            the same results, fewer scores); 1 = the whole window at once; ``"auto"``
            (default): 4 blocks for windows of at least 1024 positions, else 1.
          name: module name.
        """
        super().__init__(name=name)
        self.dim = check_positive_int("dim", dim)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.attention_blocks = check_attention_blocks(attention_blocks)
        self.num_kv_heads = check_positive_int("num_kv_heads", num_kv_heads or num_heads)
        if num_heads % self.num_kv_heads:
            raise UsageError(f"num_heads {num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if head_dim is None:
            if dim % num_heads:
                raise UsageError(f"dim {dim} is not divisible by num_heads {num_heads}; give head_dim")
            head_dim = dim // num_heads
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.sliding_window = None if not sliding_window else check_positive_int("sliding_window",
                                                                                 sliding_window)
        self.qkv_bias, self.output_bias = bool(qkv_bias), bool(output_bias)
        self.dropout = check_rate("dropout", dropout)
        self.init_scale = check_positive_float("init_scale", init_scale)
        inner, kv_inner = num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        with self.name_scope:
            self.rotary = RotaryEmbedding(head_dim=self.head_dim, theta=rope_theta, scaling=rope_scaling,
                                          name="rotary")
            self.query = Linear(input_size=dim, output_size=inner, use_bias=self.qkv_bias,
                                init_scale=init_scale, name="query")
            self.key = Linear(input_size=dim, output_size=kv_inner, use_bias=self.qkv_bias,
                              init_scale=init_scale, name="key")
            self.value = Linear(input_size=dim, output_size=kv_inner, use_bias=self.qkv_bias,
                                init_scale=init_scale, name="value")
            self.output = Linear(input_size=inner, output_size=dim, use_bias=self.output_bias,
                                 init_scale=init_scale, name="output")

    def initial_cache(self, batch_size: Union[int, tf.Tensor], max_length: int) -> AttentionCache:
        """An empty cache for ``max_length`` positions: keys and values [batch, kv_heads, max_length, head_dim]."""
        zeros = tf.zeros([batch_size, self.num_kv_heads, max_length, self.head_dim], tf.float32)
        return AttentionCache(zeros, zeros)

    def _heads(self, x: tf.Tensor, heads: int) -> tf.Tensor:
        """[batch, time, heads * head_dim] -> [batch, heads, time, head_dim]."""
        batch, length = tf.shape(x)[0], tf.shape(x)[1]
        return tf.transpose(tf.reshape(x, [batch, length, heads, self.head_dim]), [0, 2, 1, 3])

    def __call__(self, inputs: tf.Tensor, training: Training = False, cache: Optional[AttentionCache] = None,
                 positions: Optional[tf.Tensor] = None) -> Tuple[tf.Tensor, Optional[AttentionCache]]:
        """Attends from every position to itself and the (windowed) positions before it.

        Args and returns as :meth:`lmkit.layers.MultiHeadAttention.__call__`:
        ``inputs`` [batch, time, dim]; ``cache`` None (a self-contained window
        starting at position 0) or the earlier keys and values with
        ``positions`` [batch] int32 (where each row's window starts).
        """
        batch, length = tf.shape(inputs)[0], tf.shape(inputs)[1]
        if cache is None:
            query_positions = tf.range(length)[tf.newaxis, :]  # [1, time]
        else:
            if positions is None:
                raise UsageError("positions is None but a cache was given; pass the [batch] int32 positions")
            query_positions = tf.cast(positions, tf.int32)[:, tf.newaxis] + tf.range(length)[tf.newaxis, :]
        cos, sin = self.rotary.cos_sin(query_positions)  # [1 or batch, time, head_dim]
        cos, sin = cos[:, tf.newaxis], sin[:, tf.newaxis]  # broadcast over heads
        queries = self.rotary.rotate(self._heads(self.query(inputs, training), self.num_heads), cos, sin)
        keys = self.rotary.rotate(self._heads(self.key(inputs, training), self.num_kv_heads), cos, sin)
        values = self._heads(self.value(inputs, training), self.num_kv_heads)
        scaled = queries * (1.0 / math.sqrt(self.head_dim))
        if cache is None:  # one window from position 0: query i sees keys 0..i (in its sliding window)
            context = causal_attend(scaled, keys, values, self.attention_blocks, self.dropout, training,
                                    self.sliding_window)
        else:
            cache = write_cache(cache, keys, values, query_positions)
            keys, values = cache  # [batch, kv_heads, max_length, head_dim]
            mask = causal_mask(query_positions, tf.range(tf.shape(keys)[2]), self.sliding_window)  # [b, 1, time, keys]
            context = grouped_attend(scaled, keys, values, mask, self.dropout, training)
        context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [batch, length, self.num_heads * self.head_dim])
        return self.output(context, training), cache

    def get_config(self) -> Dict[str, Any]:
        return {"dim": self.dim, "num_heads": self.num_heads, "num_kv_heads": self.num_kv_heads,
                "head_dim": self.head_dim, "rope_theta": self.rotary.theta, "rope_scaling": plain(self.rotary.scaling),
                "sliding_window": self.sliding_window, "qkv_bias": self.qkv_bias,
                "output_bias": self.output_bias, "dropout": self.dropout, "init_scale": self.init_scale,
                "attention_blocks": self.attention_blocks, "name": self.name}


class LlamaLayer(Module):
    """``x + attn(norm(x))``, then ``x + ffn(norm(x))`` with RMSNorm, grouped-query attention and SwiGLU.

    Variables: ``attention/...``, ``attention_norm/scale``, ``ffn/...``, ``ffn_norm/scale``.
    """

    def __init__(self, *, dim: int, num_heads: int, ffn_dim: int, num_kv_heads: Optional[int] = None,
                 head_dim: Optional[int] = None, rope_theta: float = 10000.0,
                 rope_scaling: Optional[Mapping[str, Any]] = None, sliding_window: Optional[int] = None,
                 qkv_bias: bool = False, output_bias: bool = False, norm_epsilon: float = 1e-6,
                 activation: str = "silu", dropout: float = 0.0, init_scale: float = 0.02,
                 attention_blocks: Union[int, str] = "auto", name: Optional[str] = None) -> None:
        super().__init__(name=name)
        self.dropout = check_rate("dropout", dropout)
        self._config = {"dim": dim, "num_heads": num_heads, "ffn_dim": ffn_dim, "num_kv_heads": num_kv_heads,
                        "head_dim": head_dim, "rope_theta": rope_theta, "rope_scaling": rope_scaling,
                        "sliding_window": sliding_window, "qkv_bias": qkv_bias, "output_bias": output_bias,
                        "norm_epsilon": norm_epsilon, "activation": activation, "dropout": self.dropout,
                        "init_scale": init_scale, "attention_blocks": attention_blocks, "name": name}
        with self.name_scope:
            self.attention_norm = RMSNorm(dim=dim, epsilon=norm_epsilon, name="attention_norm")
            self.attention = GroupedQueryAttention(
                dim=dim, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                rope_theta=rope_theta, rope_scaling=rope_scaling, sliding_window=sliding_window,
                qkv_bias=qkv_bias, output_bias=output_bias, dropout=dropout, init_scale=init_scale,
                attention_blocks=attention_blocks, name="attention")
            self.ffn_norm = RMSNorm(dim=dim, epsilon=norm_epsilon, name="ffn_norm")
            self.ffn = GatedFeedForward(dim=dim, ffn_dim=ffn_dim, activation=activation, init_scale=init_scale,
                                        name="ffn")

    def __call__(self, inputs: tf.Tensor, training: Training = False, cache: Optional[AttentionCache] = None,
                 positions: Optional[tf.Tensor] = None) -> Tuple[tf.Tensor, Optional[AttentionCache]]:
        attended, cache = self.attention(self.attention_norm(inputs), training, cache, positions)
        x = inputs + dropout(attended, self.dropout, training)
        x = x + dropout(self.ffn(self.ffn_norm(x), training), self.dropout, training)
        return x, cache

    def get_config(self) -> Dict[str, Any]:
        return plain(self._config)


class LlamaDecoder(Module):
    """A stack of :class:`LlamaLayer` s and a final RMSNorm, with the cached decoding of
    :class:`lmkit.layers.TransformerDecoder` (same :class:`TransformerState`).

    ``sliding_windows`` gives each layer its window (None = full attention), as
    Mistral (every layer) or Qwen2's ``layer_types`` do.
    """

    def __init__(self, *, num_layers: int, dim: int, num_heads: int, ffn_dim: int,
                 num_kv_heads: Optional[int] = None, head_dim: Optional[int] = None, rope_theta: float = 10000.0,
                 rope_scaling: Optional[Mapping[str, Any]] = None,
                 sliding_windows: Optional[Sequence[Optional[int]]] = None, qkv_bias: bool = False,
                 output_bias: bool = False, norm_epsilon: float = 1e-6, activation: str = "silu",
                 max_positions: int = 2048, dropout: float = 0.0, init_scale: float = 0.02,
                 attention_blocks: Union[int, str] = "auto", name: Optional[str] = None) -> None:
        super().__init__(name=name)
        self.num_layers = check_positive_int("num_layers", num_layers)
        self.max_positions = check_positive_int("max_positions", max_positions)
        windows = list(sliding_windows) if sliding_windows is not None else [None] * num_layers
        if len(windows) != num_layers:
            raise UsageError(f"sliding_windows has {len(windows)} entries for {num_layers} layers")
        self._config = {"num_layers": num_layers, "dim": dim, "num_heads": num_heads, "ffn_dim": ffn_dim,
                        "num_kv_heads": num_kv_heads, "head_dim": head_dim, "rope_theta": rope_theta,
                        "rope_scaling": rope_scaling, "sliding_windows": windows, "qkv_bias": qkv_bias,
                        "output_bias": output_bias, "norm_epsilon": norm_epsilon, "activation": activation,
                        "max_positions": max_positions, "dropout": dropout, "init_scale": init_scale,
                        "attention_blocks": attention_blocks, "name": name}
        with self.name_scope:
            self.layers = [
                LlamaLayer(dim=dim, num_heads=num_heads, ffn_dim=ffn_dim, num_kv_heads=num_kv_heads,
                           head_dim=head_dim, rope_theta=rope_theta, rope_scaling=rope_scaling,
                           sliding_window=windows[i], qkv_bias=qkv_bias, output_bias=output_bias,
                           norm_epsilon=norm_epsilon, activation=activation, dropout=dropout,
                           init_scale=init_scale, attention_blocks=attention_blocks, name=f"layer_{i}")
                for i in range(num_layers)]
            self.final_norm = RMSNorm(dim=dim, epsilon=norm_epsilon, name="final_norm")

    def initial_state(self, batch_size: Union[int, tf.Tensor], max_length: Optional[int] = None) -> TransformerState:
        """An empty cache of ``max_length`` (default ``max_positions``) positions."""
        return empty_state([layer.attention for layer in self.layers], batch_size, max_length, self.max_positions)

    def __call__(self, inputs: tf.Tensor, state: Optional[TransformerState] = None,
                 training: Training = False) -> Tuple[tf.Tensor, Optional[TransformerState]]:
        """Runs the stack over ``inputs`` [batch, time, dim]; a state's cache is extended (as TransformerDecoder)."""
        x, state = run_layers(self.layers, inputs, state, training)
        return self.final_norm(x), state

    def get_config(self) -> Dict[str, Any]:
        return plain(self._config)
