"""The softmax layer: hidden states to vocabulary logits, optionally tied.

With ``tied_embedder`` the layer reuses the embedder's ``embeddings``
[vocab, dim] transposed (Press & Wolf, 2017; Inan et al., 2017), so the model
holds one table: ``model.trainable_variables`` lists it once and its gradient
sums the lookup (sparse) and the projection (dense) parts.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.layers.base import (
    Initializer,
    Module,
    check_positive_float,
    check_positive_int,
    matmul_last_axis,
    uniform_initializer,
    zeros_initializer,
)
from lmkit.layers.embeddings import WordEmbedder

__all__ = ["OutputProjection"]


class OutputProjection(Module):
    """``logits = x @ kernel + bias`` with ``kernel`` optionally the tied embeddings.

    Variables: ``kernel`` [dim, vocab_size] (untied only) and, with
    ``use_bias``, ``bias`` [vocab_size] (always its own).

    ``get_config`` cannot hold the embedder: rebuild a tied projection by
    passing ``tied_embedder`` again (``tied`` tells whether it had one).
    """

    def __init__(self,
                 *,
                 dim: int,
                 vocab_size: int,
                 tied_embedder: Optional[WordEmbedder] = None,
                 use_bias: bool = True,
                 init_scale: float = 0.1,
                 initializer: Optional[Initializer] = None,
                 bias_initializer: Optional[Initializer] = None,
                 name: Optional[str] = None) -> None:
        """Creates the variables.

        Args:
          dim: input size (the decoder's output size).
          vocab_size: number of logits.
          tied_embedder: a :class:`WordEmbedder` of shape [vocab_size, dim]
            whose table doubles as the (transposed) kernel.
          use_bias: add a bias (GPT-2's output layer has none).
          init_scale: kernel values from uniform(-init_scale, init_scale) when
            ``initializer`` is None.
          initializer: kernel initializer (overrides ``init_scale``).
          bias_initializer: bias initializer; zeros when None.
          name: module name.

        Raises:
          ValueError: a size is not a positive integer, or the tied embedder's
            shape does not match.
        """
        super().__init__(name=name)
        self.dim = check_positive_int("dim", dim)
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.init_scale = check_positive_float("init_scale", init_scale)
        if tied_embedder is not None:
            if not isinstance(tied_embedder, WordEmbedder):
                raise UsageError(f"tied_embedder {tied_embedder!r} must be a WordEmbedder")
            if (tied_embedder.vocab_size, tied_embedder.dim) != (vocab_size, dim):
                raise UsageError(
                    f"tied_embedder has shape [{tied_embedder.vocab_size}, {tied_embedder.dim}] but the "
                    f"projection needs [vocab_size, dim] = [{vocab_size}, {dim}]; build the embedder "
                    f"with dim={dim} or do not tie")
        self.tied_embedder = tied_embedder
        initializer = initializer or uniform_initializer(init_scale)
        bias_initializer = bias_initializer or zeros_initializer()
        with self.name_scope:
            if tied_embedder is None:
                self.kernel = tf.Variable(initializer([dim, vocab_size], tf.float32), name="kernel")
            self.bias = (tf.Variable(bias_initializer([vocab_size], tf.float32), name="bias")
                         if use_bias else None)

    @property
    def tied(self) -> bool:
        """Whether the kernel is the embedder's table."""
        return self.tied_embedder is not None

    def __call__(self, inputs: tf.Tensor) -> tf.Tensor:
        """Computes logits.

        Args:
          inputs: [..., dim] float (float32 or a mixed-precision compute dtype).

        Returns:
          [..., vocab_size] float32 logits (also when ``inputs`` are in a
          mixed-precision compute dtype: the softmax after them runs in float32).
        """
        if self.tied:  # [..., dim] x [vocab, dim]^T, without materialising E^T
            logits = matmul_last_axis(inputs, self.tied_embedder.embeddings, self.bias, transpose_kernel=True)
        else:
            logits = matmul_last_axis(inputs, self.kernel, self.bias)  # [..., vocab]
        return tf.cast(logits, tf.float32) if logits.dtype != tf.float32 else logits

    def get_config(self) -> Dict[str, Any]:
        return {"dim": self.dim, "vocab_size": self.vocab_size, "use_bias": self.bias is not None,
                "init_scale": self.init_scale, "name": self.name}
