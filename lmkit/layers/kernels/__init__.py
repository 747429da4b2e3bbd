"""Which kernel computes a window's causal self-attention: ``TrainConfig.attention_kernel``.

:func:`lmkit.layers.attention.causal_attend` is where every lmkit model
(transformer, gpt2, llama, the seq2seq decoder) attends over a training or
evaluation window. By default it computes the scores with one matmul, the
softmax in float32 and the context with a second matmul
(:data:`MATMUL`, in query blocks). A kernel registered here may take over
inside a :func:`scope`, for the calls it :meth:`applies` to; the others keep
the matmuls. Adding a kernel takes one file (an object with ``applies``,
``__call__`` and ``probe``) and one line in :data:`KERNELS`.

The trainer resolves the setting once (:func:`resolve`) and traces its
compiled steps inside :func:`scope`: the choice is made while tracing, so it
costs nothing per step.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, List, Optional

from lmkit.core.errors import UsageError
from lmkit.core.registry import lookup
from lmkit.layers.precision import PRECISIONS
from lmkit.layers.precision import get as precision_policy

__all__ = ["AUTO", "KERNELS", "MATMUL", "SETTINGS", "active", "check_setting", "declined", "get", "resolve",
           "scope"]

MATMUL = "matmul"  # the scores materialized: two matmuls and a float32 softmax (lmkit.layers.attention)
AUTO = "auto"

# name -> "module:object" (an instance with applies(), __call__() and probe(); lmkit.core.registry)
KERNELS = {
    "cudnn": "lmkit.layers.kernels.cudnn:KERNEL",
}
SETTINGS = (MATMUL, *KERNELS, AUTO)

_local = threading.local()  # the native backend traces each replica in its own thread


def check_setting(value: Any) -> str:
    """Returns ``value`` when it names a kernel, ``"matmul"`` or ``"auto"``.

    Raises:
      UsageError: anything else (the message lists the choices).
    """
    if value in SETTINGS:
        return value
    raise UsageError(f"attention_kernel = {value!r} is not one of {', '.join(SETTINGS)} "
                     "(matmul: scores through two matmuls, everywhere; cudnn: cuDNN's fused attention on "
                     "a GPU under XLA in mixed precision; auto: cudnn where it runs, else matmul)")


def get(name: str) -> Any:
    """The registered kernel object called ``name`` (not ``"matmul"``)."""
    return lookup(KERNELS, name, "attention kernel")


def resolve(setting: str, *, device_type: str, xla: bool, precision: str,
            log: Optional[Callable[[str], None]] = None) -> str:
    """The kernel a run uses for ``setting`` (``"matmul"`` or a name in :data:`KERNELS`).

    A kernel needs a GPU, the XLA-compiled step and a 16-bit compute dtype,
    and must pass its :meth:`probe` (a small attention compiled and checked
    against the matmuls on this machine). ``"auto"`` takes the first kernel
    that qualifies and otherwise the matmuls (saying why through ``log``
    when a GPU was there); a kernel named outright that cannot run is an
    error.

    Raises:
      UsageError: a named kernel that cannot run here, with the reason.
    """
    check_setting(setting)
    if setting == MATMUL:
        return MATMUL
    names = list(KERNELS) if setting == AUTO else [setting]
    reasons = {}
    for name in names:
        reason = _unmet(device_type, xla, precision) or get(name).probe()
        if reason is None:
            return name
        reasons[name] = reason
    if setting != AUTO:
        raise UsageError(f"attention_kernel = {setting!r} cannot run here: {reasons[setting]}; "
                         f"use attention_kernel = {MATMUL!r} (or 'auto': {setting} where it runs)")
    if log is not None and device_type == "GPU":
        log(f"attention_kernel = 'auto': the matmuls ({'; '.join(f'{n}: {r}' for n, r in reasons.items())})")
    return MATMUL


def _unmet(device_type: str, xla: bool, precision: str) -> Optional[str]:
    """Why no fused kernel applies to a run on ``device_type`` (None: it may)."""
    if device_type != "GPU":
        return f"it needs a GPU (this run computes on {device_type})"
    if not xla:
        return "it needs the XLA-compiled step (jit_compile = 'auto' or True)"
    if precision_policy(precision).compute_dtype == "float32":
        sixteen_bit = " or ".join(repr(p.name) for p in PRECISIONS.values() if p.compute_dtype != "float32")
        return f"it needs precision {sixteen_bit} (this run: {precision!r})"
    return None


def declined(name: str) -> List[str]:
    """One line per kind of call the kernel ``name`` left to the matmuls so far, saying why.

    A kernel may keep a ``declined`` mapping (what -> why) of calls it could
    not take on this machine (:meth:`lmkit.layers.kernels.cudnn.CudnnAttention.fits`).
    """
    if name == MATMUL:
        return []
    found = getattr(get(name), "declined", None) or {}
    return [f"attention_kernel {name!r}: the matmuls for {what} ({why})" for what, why in found.items()]


@contextlib.contextmanager
def scope(name: str) -> Iterator[None]:
    """Inside, :func:`active` is the kernel called ``name`` (None for ``"matmul"``); scopes nest."""
    kernel = None if name == MATMUL else get(name)
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(kernel)
    try:
        yield
    finally:
        stack.pop()


def active() -> Any:
    """The kernel of the innermost :func:`scope`, or None (the matmuls; also outside any scope)."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None
