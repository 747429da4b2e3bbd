"""Small helpers shared by every lmkit module.

* :class:`Module`: a ``tf.Module`` with the ``get_config`` convention: the
  dict holds the constructor's keyword arguments (JSON-friendly values only),
  so ``type(m)(**m.get_config())`` rebuilds a module of the same shape.
  Arguments that cannot be written to JSON (an initializer callable, a tied
  embedder) are left out and say so in the module's docstring.
* Initializers: callables ``(shape, dtype) -> tf.Tensor``; variables are
  created eagerly in ``__init__`` so the trainer can broadcast them before the
  first step.
* :func:`dropout`: dropout that is a no-op unless ``training``.
* :class:`Linear` and :func:`matmul_last_axis`: ``x @ kernel + bias`` over
  the last axis of any rank.
* ``check_*``: re-exported from :mod:`lmkit.core.checks` (their
  :class:`~lmkit.core.errors.UsageError` names the argument, the bad value and the fix).
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, Dict, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from lmkit.core.checks import (
    check_float,
    check_non_negative_float,
    check_positive_float,
    check_positive_int,
    check_rate,
)
from lmkit.layers.layouts import stored_layout
from lmkit.layers.precision import cast_like

Initializer = Callable[[Sequence[int], tf.dtypes.DType], tf.Tensor]
Training = Union[bool, tf.Tensor]
Seed = Union[None, int, tf.Tensor]

__all__ = [
    "Initializer",
    "Linear",
    "Module",
    "check_float",
    "check_non_negative_float",
    "check_positive_float",
    "check_positive_int",
    "check_rate",
    "dropout",
    "leading_shape",
    "matmul_last_axis",
    "ones_initializer",
    "plain",
    "uniform_initializer",
    "zeros_initializer",
]


class Module(tf.Module):
    """Base of the lmkit modules: a ``tf.Module`` that can describe itself."""

    def get_config(self) -> Dict[str, Any]:
        """The constructor's keyword arguments (JSON-friendly values only)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement get_config")


def plain(value: Any) -> Any:
    """``value`` with the dicts and lists that ``tf.Module`` wraps for tracking turned back into plain ones.

    A dict or list kept as a module attribute comes back wrapped (``_DictWrapper``, ``ListWrapper``);
    ``get_config`` returns plain ones, which ``json.dumps`` writes.
    """
    if isinstance(value, (str, bytes)):
        return value
    if hasattr(value, "keys") and hasattr(value, "items"):  # dict, or tf's _DictWrapper (not a Mapping)
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ in ("ListWrapper", "_TupleWrapper"):
        return [plain(v) for v in value]
    return value


# --- initializers -----------------------------------------------------------


def uniform_initializer(init_scale: float, seed: Optional[int] = None) -> Initializer:
    """Values from uniform(-init_scale, init_scale), as in Zaremba et al. (2014).

    Args:
      init_scale: half-width of the interval; must be > 0.
      seed: optional op seed (the global seed of ``tf.random.set_seed`` applies
        as usual).

    Returns:
      A callable ``(shape, dtype) -> tf.Tensor``.

    Raises:
      ValueError: ``init_scale`` is not a positive number.
    """
    check_positive_float("init_scale", init_scale)

    def initialize(shape: Sequence[int], dtype: tf.dtypes.DType = tf.float32) -> tf.Tensor:
        return tf.random.uniform(shape, -init_scale, init_scale, dtype=dtype, seed=seed)

    return initialize


def zeros_initializer() -> Initializer:
    """Zeros (biases and layer-norm offsets)."""
    return lambda shape, dtype=tf.float32: tf.zeros(shape, dtype)


def ones_initializer() -> Initializer:
    """Ones (layer-norm scales)."""
    return lambda shape, dtype=tf.float32: tf.ones(shape, dtype)


# --- dropout ------------------------------------------------------------------


def dropout(x: tf.Tensor, rate: float, training: Training, seed: Seed = None) -> tf.Tensor:
    """Inverted dropout that only acts while training.

    Args:
      x: any float tensor.
      rate: fraction of units dropped, in [0, 1).
      training: a Python bool (the usual case: the trainer traces training and
        evaluation as separate functions, so no graph branch is built) or a
        scalar bool tensor (then a ``tf.cond`` picks the branch).
      seed: None (the default) draws the mask from TensorFlow's global
        ``tf.random.Generator``, so ``tf.random.set_global_generator`` makes
        dropout reproducible, checkpointable and different per worker; a
        shape-[2] int tensor gives a stateless, reproducible mask; a Python
        int is an op seed for ``tf.nn.dropout``.

    Returns:
      ``x`` with units zeroed with probability ``rate`` and the rest scaled by
      ``1 / (1 - rate)`` while training; ``x`` itself otherwise.
    """
    if rate == 0.0:
        return x

    def drop() -> tf.Tensor:
        if isinstance(seed, numbers.Integral):
            return tf.nn.dropout(x, rate=rate, seed=seed)
        if seed is None:
            # init_scope: a first-time creation of the global generator must
            # happen eagerly, not inside a tf.function trace.
            with tf.init_scope():
                generator = tf.random.get_global_generator()
            step_seed = generator.make_seeds(1)[:, 0]  # [2]
        else:
            step_seed = seed
        return tf.nn.experimental.stateless_dropout(x, rate=rate, seed=step_seed)

    if isinstance(training, (bool, np.bool_)):
        return drop() if training else x
    return tf.cond(tf.cast(training, tf.bool), drop, lambda: tf.identity(x))


def leading_shape(x: tf.Tensor) -> list:
    """``x``'s shape without the last axis: static sizes where known, else scalar tensors.

    Reshaping back to ``leading_shape(x) + [n]`` keeps static shapes in graphs
    and needs no shape ``concat`` when the shape is fully known.
    """
    dynamic = None
    dims = []
    for i, size in enumerate(x.shape[:-1]):
        if size is None:
            dynamic = tf.shape(x) if dynamic is None else dynamic
            size = dynamic[i]
        dims.append(size)
    return dims


def matmul_last_axis(inputs: tf.Tensor, kernel: tf.Tensor, bias: Optional[tf.Tensor] = None,
                     transpose_kernel: bool = False) -> tf.Tensor:
    """``inputs @ kernel (+ bias)`` over the last axis of an input of any rank.

    Inputs of rank > 2 are flattened to one 2-D matmul and reshaped back: on
    CPU that is faster than a broadcasting batch matmul.

    Mixed precision: the kernel and bias are cast to the input's dtype
    (:mod:`lmkit.layers.precision`), so float32 variables serve a bfloat16 or
    float16 input and receive float32 gradients.

    Args:
      inputs: [..., n] float.
      kernel: [n, m] (or [m, n] with ``transpose_kernel``, e.g. a tied
        embedding table, without materialising its transpose).
      bias: [m] or None.
      transpose_kernel: multiply by ``kernel^T``.

    Returns:
      [..., m].
    """
    inputs = tf.convert_to_tensor(inputs)
    rank = inputs.shape.rank
    width_in, width = (kernel.shape[1], kernel.shape[0]) if transpose_kernel else kernel.shape
    flat = inputs if rank == 2 else tf.reshape(inputs, [-1, width_in])  # [rows, n]
    copy = stored_layout(kernel, transpose_kernel, flat.shape[0])
    if copy is not None:  # lmkit.layers.layouts: the faster of the two layouts
        kernel, transpose_kernel = copy, not transpose_kernel
    kernel = cast_like(kernel, inputs)  # mixed precision: the float32 variable at the input's dtype
    outputs = tf.matmul(flat, kernel, transpose_b=transpose_kernel)  # [rows, m]
    if bias is not None:
        outputs = tf.nn.bias_add(outputs, cast_like(bias, outputs))
    if rank == 2:
        return outputs
    return tf.reshape(outputs, leading_shape(inputs) + [width])


# --- linear layer -----------------------------------------------------------------


class Linear(Module):
    """``y = x @ kernel + bias`` over the last axis of an input of any rank.

    Variables: ``kernel`` [input_size, output_size] and, with ``use_bias``,
    ``bias`` [output_size]. ``adapter``: None, or a low-rank update added to
    the output (:func:`lmkit.layers.lora.add_lora` sets it).
    """

    adapter: Optional[Any] = None

    def __init__(self,
                 *,
                 input_size: int,
                 output_size: int,
                 use_bias: bool = True,
                 init_scale: float = 0.1,
                 initializer: Optional[Initializer] = None,
                 bias_initializer: Optional[Initializer] = None,
                 name: Optional[str] = None) -> None:
        """Creates the variables.

        Args:
          input_size: size of the last input axis.
          output_size: size of the last output axis.
          use_bias: whether to add a bias.
          init_scale: kernel values from uniform(-init_scale, init_scale) when
            ``initializer`` is None.
          initializer: kernel initializer (overrides ``init_scale``).
          bias_initializer: bias initializer; zeros when None.
          name: module name.

        Raises:
          ValueError: a size is not a positive integer or ``init_scale`` <= 0.
        """
        super().__init__(name=name)
        self.input_size = check_positive_int("input_size", input_size)
        self.output_size = check_positive_int("output_size", output_size)
        self.use_bias = bool(use_bias)
        self.init_scale = check_positive_float("init_scale", init_scale)
        initializer = initializer or uniform_initializer(init_scale)
        bias_initializer = bias_initializer or zeros_initializer()
        with self.name_scope:
            self.kernel = tf.Variable(initializer([input_size, output_size], tf.float32), name="kernel")
            if self.use_bias:
                self.bias = tf.Variable(bias_initializer([output_size], tf.float32), name="bias")

    def __call__(self, inputs: tf.Tensor, training: Training = False) -> tf.Tensor:
        """Applies the layer.

        Args:
          inputs: [..., input_size] float (float32, or the compute dtype of
            a mixed-precision policy).
          training: passed to the adapter (its dropout), if there is one.

        Returns:
          [..., output_size] in the input's dtype.
        """
        outputs = matmul_last_axis(inputs, self.kernel, self.bias if self.use_bias else None)
        if self.adapter is not None:
            outputs = outputs + self.adapter(inputs, training)
        return outputs

    def get_config(self) -> Dict[str, Any]:
        return {"input_size": self.input_size, "output_size": self.output_size,
                "use_bias": self.use_bias, "init_scale": self.init_scale, "name": self.name}
