"""Normalization over the last axis: :class:`LayerNorm` (GPT-2, BART) and :class:`RMSNorm` (the Llama family).

Both compute their statistics in float32, also for a bfloat16 or float16 input
(mixed precision), and return the input's dtype.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import tensorflow as tf

from lmkit.layers.base import Module, check_positive_float, check_positive_int, ones_initializer, zeros_initializer
from lmkit.layers.precision import cast_like

__all__ = ["LayerNorm", "RMSNorm"]


class LayerNorm(Module):
    """Layer normalization over the last axis (Ba et al., 2016).

    Variables: ``scale`` [dim] (ones) and, with ``use_offset``, ``offset`` [dim] (zeros).
    """

    def __init__(self, *, dim: int, epsilon: float = 1e-5, use_offset: bool = True,
                 name: Optional[str] = None) -> None:
        """Creates the variables.

        Args:
          dim: size of the last axis.
          epsilon: added to the variance.
          use_offset: add a learned offset after scaling (False: nanoGPT's ``bias=False`` norms).
          name: module name.

        Raises:
          ValueError: ``dim`` is not a positive integer or ``epsilon`` <= 0.
        """
        super().__init__(name=name)
        self.dim = check_positive_int("dim", dim)
        self.epsilon = check_positive_float("epsilon", epsilon)
        with self.name_scope:
            self.scale = tf.Variable(ones_initializer()([dim], tf.float32), name="scale")
            self.offset = tf.Variable(zeros_initializer()([dim], tf.float32), name="offset") if use_offset else None

    def __call__(self, inputs: tf.Tensor) -> tf.Tensor:
        """Normalizes ``inputs`` [..., dim]; returns the same shape and dtype.

        The statistics are computed in float32 also for a bfloat16 or float16
        input (mixed precision), then cast back.
        """
        x = tf.cast(inputs, tf.float32) if inputs.dtype != tf.float32 else inputs
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)  # [..., 1]
        normalized = (x - mean) * tf.math.rsqrt(variance + self.epsilon) * self.scale
        return cast_like(normalized if self.offset is None else normalized + self.offset, inputs)

    def get_config(self) -> Dict[str, Any]:
        return {"dim": self.dim, "epsilon": self.epsilon, "use_offset": self.offset is not None, "name": self.name}


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
