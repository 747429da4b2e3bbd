"""Rotary position embeddings (Su et al., 2021), with Hugging Face's ``rope_scaling`` variants.

An :class:`~lmkit.layers.attention.Attention` given a :class:`RotaryEmbedding`
turns its queries and keys by their positions (the Llama family: Llama, Qwen2,
Mistral); positions then need no table, and ``max_positions`` only bounds the
key/value cache.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Tuple

import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.layers.base import Module, check_positive_float, check_positive_int, plain
from lmkit.layers.precision import cast_like

__all__ = ["ROPE_TYPES", "RotaryEmbedding"]

#: rope_scaling types: none, "linear" (positions / factor), "llama3" (Llama 3.1's frequency bands).
ROPE_TYPES = ("default", "linear", "llama3")


def _check_rope_scaling(scaling: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    """``scaling`` normalized (``rope_type`` set, ``type`` dropped), None for no scaling.

    Raises:
      UsageError: an unknown type, or a factor or band that is missing or not positive.
    """
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
