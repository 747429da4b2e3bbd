"""Weight layouts for an XLA-compiled decode loop on a CPU (issue 58).

A cached decode step multiplies one row per sequence by every weight matrix:
at batch 1 a matrix-vector product, which reads the matrix from memory and
does little else. Measured on 2 cores (``benchmarks/decode_profile.py``,
docs/generation.md#speed), XLA's CPU dot reads a matrix about twice as fast
when its longer side is the contiguous one, and multiplies several rows by a
transposed matrix (``transpose_b``) at a half to a fifth of the speed of the
same matrix stored the other way. Both hit the decode loop: a tied output
projection multiplies by the embedding table [vocab, dim] transposed, and a
feed-forward network's second kernel [4 x dim, dim] has its short side
contiguous.

Inside :func:`decode_layouts` (entered once per compiled loop, around its
``tf.while_loop``), :func:`~lmkit.layers.base.matmul_last_axis` reads a
transposed copy of a 2-D variable where that layout is the faster one:

* a kernel used transposed (a tied projection): the copy, at every batch size;
* a kernel used as it is: the copy when one row is multiplied and the kernel
  has more rows than columns.

The copies are made once per call of the loop, outside the ``while``, so XLA
cannot fold them back into the products, and XLA drops the copies nothing
reads; a loop of fewer than :data:`MIN_STEPS` steps makes none. The products
are the same sums in another memory order: the tokens are those of the loop
without the scope (``tests/layers/test_layouts.py``). Outside the scope
nothing changes.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Optional

import tensorflow as tf

__all__ = ["decode_layouts", "pays", "stored_layout"]

#: False turns the scope off everywhere (``benchmarks/decode_profile.py`` times the loop both ways).
ENABLED = True
#: The fewest steps a loop must run to make its copies: on 2 cores the copies of the GPT-2-shaped model of
#: ``benchmarks/decode_profile.py`` (8 MB of embeddings, 4 MB of feed-forward kernels) took about 3 ms a call,
#: and saved 0.3-0.4 ms a step.
MIN_STEPS = 16
_SCOPES: List[Dict[Any, tf.Tensor]] = []  # per active scope: variable ref -> its transposed copy


def pays(xla: bool, steps: int) -> bool:
    """Whether a decode loop compiled with XLA (``xla``) of about ``steps`` steps enters the scope: on a CPU
    (no GPU visible), for :data:`MIN_STEPS` or more (the copies cost a few steps' time per call)."""
    return ENABLED and bool(xla) and steps >= MIN_STEPS and not tf.config.list_logical_devices("GPU")


@contextlib.contextmanager
def decode_layouts(module: Any, enabled: bool = True) -> Iterator[None]:
    """Within, products by ``module``'s 2-D float variables may read transposed copies made here.

    Args:
      module: a ``tf.Module`` (a model) whose variables the products read (an object without
        ``variables``, a model from outside lmkit: no copies).
      enabled: False makes the scope do nothing (the caller's switch: :func:`pays`).
    """
    if not enabled:
        yield
        return
    copies = {variable.ref(): tf.transpose(variable) for variable in getattr(module, "variables", ())
              if isinstance(variable, tf.Variable) and variable.shape.rank == 2 and variable.dtype.is_floating}
    _SCOPES.append(copies)
    try:
        yield
    finally:
        _SCOPES.pop()


def stored_layout(kernel: Any, transpose_kernel: bool, rows: Optional[int]) -> Optional[tf.Tensor]:
    """The transposed copy of ``kernel`` to multiply by instead, or None (use ``kernel`` as it is).

    Args:
      kernel: the variable ``matmul_last_axis`` was given.
      transpose_kernel: whether it multiplies by ``kernel^T``.
      rows: the static number of rows multiplied (None: unknown).
    """
    if not _SCOPES or not isinstance(kernel, tf.Variable):
        return None
    copy = _SCOPES[-1].get(kernel.ref())
    if copy is None or transpose_kernel:
        return copy
    return copy if rows == 1 and kernel.shape[0] > kernel.shape[1] else None
