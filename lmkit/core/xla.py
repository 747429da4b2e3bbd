"""When the trainer compiles its steps with XLA: ``TrainConfig.jit_compile``.

``"auto"`` (the default) compiles where it was measured to be faster:

* on GPUs, XLA: an H100 ran the XLA-compiled step of every config 1.3-3x
  faster than PyTorch eager, the plain step 0.26-0.95x (most of its time
  launching small kernels; GPU utilisation under 10 %), and bfloat16 pays
  only once its casts fuse into the matmuls (issue 27). On an H200 the
  default step (XLA) then ran 1.8-3.2x PyTorch eager and 6.5x the plain
  step on config_transformer (``docs/performance.md#one-gpu``);
* on CPUs, the plain step: XLA's CPU matmuls are slower than TensorFlow's
  oneDNN/Eigen kernels, 0.65-0.85x on the PTB configs and 0.98-1.02x on the
  tiny transformer (``benchmarks/results/train_throughput*.json``).

``True`` or ``False`` force it either way. With more than one replica the
collectives stay outside XLA (Horovod's cannot be compiled): the
per-replica forward and backward pass (with the accumulation loop) is one
compiled function and the update after the averaging another.
"""

from __future__ import annotations

from typing import Any, Tuple

from lmkit.core.errors import UsageError

__all__ = ["JIT_COMPILE_CHOICES", "use_autograph", "use_xla"]

JIT_COMPILE_CHOICES: Tuple[Any, ...] = ("auto", True, False)
DEVICE_TYPES = ("CPU", "GPU")


def use_xla(setting: Any, device_type: str) -> bool:
    """Whether to compile with XLA for ``jit_compile = setting`` on ``device_type`` replicas.

    Raises:
      UsageError: ``setting`` is not True, False or "auto", or an unknown device type.
    """
    if setting not in JIT_COMPILE_CHOICES or (setting in (0, 1) and not isinstance(setting, bool)):
        raise UsageError(f"jit_compile = {setting!r} is not one of True, False, 'auto' "
                         "('auto': XLA on GPUs, the plain step on CPUs)")
    if device_type not in DEVICE_TYPES:
        raise UsageError(f"device type {device_type!r} is not one of {', '.join(DEVICE_TYPES)}")
    if setting == "auto":
        return device_type == "GPU"
    return bool(setting)


def use_autograph(model: Any, *others: Any) -> bool:
    """Whether the steps and decode loops that call ``model`` (and ``others``: a sampler) trace with AutoGraph.

    AutoGraph rewrites Python ``if``/``for``/``while`` on tensors into graph ops,
    at a cost paid by every process at start-up: it transformed some 700
    functions of the training step, and a 0.8M-parameter transformer's step
    traced in 7.8 s with it and 2.5 s without (``lmkit train``, 2 cores).
    lmkit's own models, modules and step write their loops and branches as
    graph ops (``tf.while_loop``, ``tf.cond``, selects), so they trace without
    it. A model class from outside lmkit (``--model package.module:Class``, or
    a model composed in a user's code) may rely on it: it keeps AutoGraph, as
    does a decode loop with a user's sampler. ``lmkit generate`` on a tiny
    transformer once spent some 3 s of its 8 converting 214 functions.
    """
    return any(not type(obj).__module__.startswith("lmkit.") for obj in (model, *others) if obj is not None)
