"""Feed-forward blocks: the transformer's two-layer MLP and the gated one of the Llama family.

* :func:`feed_forward`: ``outer(act(inner(x)))`` (GPT-2, BART, Vaswani et
  al.). A transformer layer holds the two :class:`~lmkit.layers.base.Linear`
  layers itself, as ``ffn_inner`` and ``ffn_outer`` (the names its
  checkpoints and Hugging Face weight maps use), and calls this function.
* :class:`GatedFeedForward`: ``down(act(gate(x)) * up(x))`` (SwiGLU; Llama,
  Qwen2, Mistral), a module of its own.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional

import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.layers.base import Linear, Module, Training, check_positive_float, check_positive_int

__all__ = ["ACTIVATIONS", "GATED_ACTIVATIONS", "GatedFeedForward", "check_activation", "feed_forward"]

#: The MLP's activations.
ACTIVATIONS: Dict[str, Callable[[tf.Tensor], tf.Tensor]] = {
    "gelu": lambda x: tf.nn.gelu(x, approximate=True),  # GPT-2's tanh approximation
    "gelu_exact": lambda x: tf.nn.gelu(x, approximate=False),  # the erf form (BART; Hugging Face's "gelu")
    "relu": tf.nn.relu,
}

#: The gate's activations (``silu``: SwiGLU).
GATED_ACTIVATIONS: Dict[str, Callable[[tf.Tensor], tf.Tensor]] = {
    "silu": tf.nn.silu,
    "gelu": lambda x: tf.nn.gelu(x, approximate=True),
}


def check_activation(activation: Any, choices: Mapping[str, Any] = ACTIVATIONS) -> str:
    """Returns ``activation`` when it is a key of ``choices``.

    Raises:
      UsageError: ``activation 'swish' is not one of gelu, gelu_exact, relu``.
    """
    if activation not in choices:
        raise UsageError(f"activation {activation!r} is not one of {', '.join(choices)}")
    return activation


def feed_forward(inputs: tf.Tensor, inner: Linear, outer: Linear, activation: str,
                 training: Training = False) -> tf.Tensor:
    """The transformer's MLP: ``outer(act(inner(inputs)))``, inputs [..., dim] -> [..., dim].

    Args:
      inputs: [..., dim].
      inner: Linear dim -> ffn_dim.
      outer: Linear ffn_dim -> dim.
      activation: a key of :data:`ACTIVATIONS`.
      training: reaches the layers' adapters (LoRA dropout).
    """
    return outer(ACTIVATIONS[activation](inner(inputs, training)), training)  # [..., dim]


class GatedFeedForward(Module):
    """``down(act(gate(x)) * up(x))`` (SwiGLU with ``silu``; Shazeer, 2020), without biases.

    Variables: ``gate/kernel`` and ``up/kernel`` [dim, ffn_dim], ``down/kernel`` [ffn_dim, dim].
    """

    def __init__(self, *, dim: int, ffn_dim: int, activation: str = "silu", init_scale: float = 0.02,
                 name: Optional[str] = None) -> None:
        """Creates the three projections.

        Args:
          dim: model size.
          ffn_dim: inner size.
          activation: the gate's, a key of :data:`GATED_ACTIVATIONS`.
          init_scale: kernels from uniform(-init_scale, init_scale).
          name: module name.
        """
        super().__init__(name=name)
        self.dim = check_positive_int("dim", dim)
        self.ffn_dim = check_positive_int("ffn_dim", ffn_dim)
        self.activation = check_activation(activation, GATED_ACTIVATIONS)
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
        gated = GATED_ACTIVATIONS[self.activation](self.gate(inputs, training)) * self.up(inputs, training)
        return self.down(gated, training)  # [..., dim]

    def get_config(self) -> Dict[str, Any]:
        return {"dim": self.dim, "ffn_dim": self.ffn_dim, "activation": self.activation,
                "init_scale": self.init_scale, "name": self.name}
