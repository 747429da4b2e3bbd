"""Numeric precision of training: the policies and the compute-dtype scope.

A *policy* names the dtype the arithmetic runs in; variables, optimizer
slots, the softmax, the loss and the gradient averaging stay float32 under
every policy:

* ``float32``: everything in float32 (the default).
* ``mixed_bfloat16``: activations and matmuls in bfloat16 (float32's range,
  8 bits of mantissa): no loss scaling needed. Fast on GPUs from Ampere on,
  TPUs and CPUs with AVX512-BF16 or AMX; slower than float32 on a CPU
  without them (every op converts).
* ``mixed_float16``: activations and matmuls in float16 (10 bits of
  mantissa, largest value 65504), with dynamic loss scaling
  (:class:`lmkit.train.loss_scale.DynamicLossScale`): the loss is
  multiplied by a scale before the backward pass so small gradients do not
  flush to zero. Fast on GPUs from Volta on (tensor cores).

How lmkit's modules follow the policy: the embedders cast their output to
:func:`compute_dtype` (the scope's dtype, float32 outside any scope); every
other module computes in the dtype of its input, casting its float32
variables at use (:func:`cast_like`), so their gradients arrive in float32;
layer normalization and the attention softmax compute in float32 inside;
the output projection returns float32 logits. A recurrent state enters the
time loop in the compute dtype and leaves it as float32, so the state the
trainer carries and checkpoints is float32. A model of your own follows the
policy by casting its inputs with :func:`cast_to_compute` in the same way.

The trainer enters ``scope(config.precision)`` inside its compiled training
and evaluation steps (the dtype is fixed when the step is traced).
Generation runs in float32. Importing this module does not import
TensorFlow (the config checks names against :data:`PRECISIONS`).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any, Dict, Iterator

__all__ = ["PRECISIONS", "Precision", "cast_like", "cast_to_compute", "compute_dtype", "get", "scope",
           "state_in_dtype_of"]


@dataclass(frozen=True)
class Precision:
    """One policy: its name, the compute dtype's name and whether the loss is scaled."""

    name: str
    compute_dtype: str  # a tf.dtypes name: "float32", "bfloat16", "float16"
    loss_scaling: bool
    hardware: str  # where it pays off (docs and --help)


# The one registry of policies: config validation, --precision and the trainer read it.
PRECISIONS: Dict[str, Precision] = {
    p.name: p for p in (
        Precision("float32", "float32", False, "everywhere; the reference"),
        Precision("mixed_bfloat16", "bfloat16", False,
                  "GPUs from Ampere (A100, RTX 30xx) on, TPUs, CPUs with AVX512-BF16 or AMX"),
        Precision("mixed_float16", "float16", True, "GPUs from Volta (V100, T4) on"),
    )
}

_local = threading.local()  # the native backend traces each replica in its own thread


def get(name: str) -> Precision:
    """The policy called ``name``.

    Raises:
      UsageError: an unknown name (the message lists the known ones).
    """
    if name not in PRECISIONS:
        from lmkit.core.checks import did_you_mean
        from lmkit.core.errors import UsageError
        raise UsageError(f"precision {name!r} is unknown; {did_you_mean(name, list(PRECISIONS))}")
    return PRECISIONS[name]


@contextlib.contextmanager
def scope(name: str) -> Iterator[Precision]:
    """Inside, :func:`compute_dtype` is the policy's dtype (scopes nest)."""
    policy = get(name)
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(policy)
    try:
        yield policy
    finally:
        stack.pop()


def compute_dtype() -> Any:
    """The ``tf.DType`` of the innermost :func:`scope` (float32 outside any)."""
    import tensorflow as tf
    stack = getattr(_local, "stack", None)
    return tf.as_dtype(stack[-1].compute_dtype if stack else "float32")


def cast_to_compute(x: Any) -> Any:
    """A floating tensor in the compute dtype (other tensors unchanged)."""
    import tensorflow as tf
    x = tf.convert_to_tensor(x)
    dtype = compute_dtype()
    return tf.cast(x, dtype) if x.dtype.is_floating and x.dtype != dtype else x


def cast_like(value: Any, reference: Any) -> Any:
    """``value`` (a variable or tensor) cast to ``reference``'s floating dtype when they differ.

    The cast of a float32 variable passes its gradient back as float32.
    """
    import tensorflow as tf
    dtype = reference.dtype
    if value.dtype.base_dtype == dtype or not dtype.is_floating:
        return value
    return tf.cast(value, dtype)


def state_in_dtype_of(reference: Any, state: Any, run: Any) -> Any:
    """``run(state)`` with ``state`` cast to ``reference``'s dtype; its new state cast back to the old dtypes.

    A recurrent state carried as float32 between windows computes in the
    compute dtype inside a time loop (or one step) and leaves as float32.

    Args:
      reference: a tensor in the dtype to compute in.
      state: a nest of tensors.
      run: ``state -> (output, new_state)``.

    Returns:
      ``(output, new_state)``, the new state in ``state``'s dtypes.
    """
    import tensorflow as tf
    dtypes = tf.nest.map_structure(lambda s: s.dtype, state)
    output, new_state = run(tf.nest.map_structure(lambda s: cast_like(s, reference), state))
    new_state = tf.nest.map_structure(lambda s, dtype: s if s.dtype == dtype else tf.cast(s, dtype),
                                      new_state, dtypes)
    return output, new_state
