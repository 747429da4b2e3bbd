"""Token and position embedders.

``WordEmbedder`` looks rows up with ``tf.gather``, so the gradient of its
``embeddings`` variable is a ``tf.IndexedSlices`` holding only the rows a
batch used (cheap to all-reduce sparsely, and what sparse-aware optimizers
expect).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Union

import numpy as np
import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.layers.base import (
    Initializer,
    Module,
    Seed,
    Training,
    check_positive_float,
    check_positive_int,
    check_rate,
    dropout,
    uniform_initializer,
)
from lmkit.layers.precision import cast_to_compute

__all__ = ["PositionEmbedder", "SinusoidsPositionEmbedder", "WordEmbedder"]

_DEFAULT_INIT_SCALE = 0.1


class WordEmbedder(Module):
    """Maps token ids to vectors.

    Variables: ``embeddings`` [vocab_size, dim].

    ``get_config`` leaves out ``initializer`` (it only sets the initial
    values, which a checkpoint restores anyway).
    """

    def __init__(self,
                 *,
                 vocab_size: int,
                 dim: int,
                 initializer: Optional[Initializer] = None,
                 dropout: float = 0.0,
                 name: Optional[str] = None) -> None:
        """Creates the embedding table.

        Args:
          vocab_size: number of token ids.
          dim: embedding size.
          initializer: ``(shape, dtype) -> tensor``; uniform(-0.1, 0.1) when None.
          dropout: rate of dropout on the output while training (Zaremba et al.
            drop the embedding output with the same rate as between layers).
          name: module name.

        Raises:
          ValueError: a size is not a positive integer or ``dropout`` is not in [0, 1).
        """
        super().__init__(name=name)
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.dim = check_positive_int("dim", dim)
        self.dropout = check_rate("dropout", dropout)
        initializer = initializer or uniform_initializer(_DEFAULT_INIT_SCALE)
        with self.name_scope:
            self.embeddings = tf.Variable(initializer([vocab_size, dim], tf.float32), name="embeddings")

    def __call__(self, ids: tf.Tensor, training: Training = False, seed: Seed = None) -> tf.Tensor:
        """Looks the ids up.

        Args:
          ids: int tensor of any shape, values in [0, vocab_size).
          training: apply dropout (Python bool or scalar bool tensor).
          seed: optional dropout seed (see :func:`lmkit.layers.base.dropout`).

        Returns:
          a tensor of shape ``ids.shape + [dim]`` in the compute dtype
          (float32 unless inside a :func:`lmkit.layers.precision.scope`).
        """
        # gather (not one-hot @ table) keeps the gradient an IndexedSlices (float32:
        # the cast comes after the lookup).
        outputs = cast_to_compute(tf.gather(self.embeddings, ids))  # [..., dim]
        return dropout(outputs, self.dropout, training, seed)

    def get_config(self) -> Dict[str, Any]:
        return {"vocab_size": self.vocab_size, "dim": self.dim, "dropout": self.dropout,
                "name": self.name}


def _positions(positions: Union[int, tf.Tensor], limit: Optional[int]) -> tf.Tensor:
    """A Python int length becomes ``range(length)``; tensors pass through."""
    if isinstance(positions, (int, np.integer)) and not isinstance(positions, bool):
        if positions < 0:
            raise UsageError(f"length {positions} must be >= 0")
        if limit is not None and positions > limit:
            raise UsageError(f"length {positions} exceeds max_positions {limit}; "
                             f"build the embedder with max_positions >= {positions}")
        return tf.range(positions, dtype=tf.int32)
    return tf.convert_to_tensor(positions)


class PositionEmbedder(Module):
    """Learned absolute position embeddings (GPT-2).

    Variables: ``embeddings`` [max_positions, dim].
    """

    def __init__(self,
                 *,
                 max_positions: int,
                 dim: int,
                 init_scale: float = _DEFAULT_INIT_SCALE,
                 name: Optional[str] = None) -> None:
        """Creates the table.

        Args:
          max_positions: number of positions (0 .. max_positions - 1).
          dim: embedding size.
          init_scale: values from uniform(-init_scale, init_scale).
          name: module name.

        Raises:
          ValueError: a size is not a positive integer or ``init_scale`` <= 0.
        """
        super().__init__(name=name)
        self.max_positions = check_positive_int("max_positions", max_positions)
        self.dim = check_positive_int("dim", dim)
        self.init_scale = check_positive_float("init_scale", init_scale)
        with self.name_scope:
            self.embeddings = tf.Variable(
                uniform_initializer(init_scale)([max_positions, dim], tf.float32), name="embeddings")

    def __call__(self, positions: Union[int, tf.Tensor]) -> tf.Tensor:
        """Embeds positions.

        Args:
          positions: an int tensor of positions (any shape), or a Python int
            length meaning ``range(length)``.

        Returns:
          ``positions.shape + [dim]`` (``[length, dim]`` for a length), in the
          compute dtype.

        Raises:
          ValueError: a Python length exceeds ``max_positions``.
        """
        return cast_to_compute(tf.gather(self.embeddings, _positions(positions, self.max_positions)))

    def get_config(self) -> Dict[str, Any]:
        return {"max_positions": self.max_positions, "dim": self.dim,
                "init_scale": self.init_scale, "name": self.name}


class SinusoidsPositionEmbedder(Module):
    """Fixed sinusoid position signals (Vaswani et al., 2017); no variables.

    Dimension ``k < dim/2`` holds ``sin(p / max_timescale**(k / (dim/2 - 1)))``
    and dimension ``dim/2 + k`` the matching cosine (the Tensor2Tensor layout),
    for any position ``p``.
    """

    def __init__(self,
                 *,
                 dim: int,
                 min_timescale: float = 1.0,
                 max_timescale: float = 1.0e4,
                 name: Optional[str] = None) -> None:
        """Precomputes the inverse timescales.

        Args:
          dim: embedding size; even and >= 2.
          min_timescale: shortest wavelength / (2 pi).
          max_timescale: longest wavelength / (2 pi).
          name: module name.

        Raises:
          ValueError: ``dim`` is odd or below 2, or a timescale is not > 0.
        """
        super().__init__(name=name)
        self.dim = check_positive_int("dim", dim)
        if dim % 2 or dim < 2:
            raise UsageError(f"dim {dim} must be even and >= 2 (half sines, half cosines); "
                             f"use dim={dim + 1 if dim % 2 else 2}")
        self.min_timescale = check_positive_float("min_timescale", min_timescale)
        self.max_timescale = check_positive_float("max_timescale", max_timescale)
        half = dim // 2
        log_increment = np.log(max_timescale / min_timescale) / max(half - 1, 1)
        # A NumPy constant, not a tf.Variable: nothing to train or checkpoint.
        self._inv_timescales = (min_timescale * np.exp(-log_increment * np.arange(half))).astype(np.float32)

    def __call__(self, positions: Union[int, tf.Tensor]) -> tf.Tensor:
        """Embeds positions.

        Args:
          positions: an int tensor of positions (any shape), or a Python int
            length meaning ``range(length)``.

        Returns:
          ``positions.shape + [dim]`` in the compute dtype (computed in float32).
        """
        positions = tf.cast(_positions(positions, None), tf.float32)
        angles = positions[..., tf.newaxis] * self._inv_timescales  # [..., dim/2]
        return cast_to_compute(tf.concat([tf.sin(angles), tf.cos(angles)], axis=-1))  # [..., dim]

    def get_config(self) -> Dict[str, Any]:
        return {"dim": self.dim, "min_timescale": self.min_timescale,
                "max_timescale": self.max_timescale, "name": self.name}
