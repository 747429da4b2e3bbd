"""Shuffled fixed-length windows of one id stream, for stateless models (transformers).

A recurrent model reads the stream in order (:mod:`lmkit.data.batching`, BPTT)
because its state carries from one batch to the next. A transformer carries
nothing, so it trains better on windows in a new random order every epoch:

* the stream is cut with stride ``num_steps`` into windows of
  ``num_steps + 1`` ids (window ``k`` is ``ids[k*T : k*T + T + 1]``; inputs are
  its first ``T`` ids, targets its last ``T``), ``(len(ids) - 1) // T`` of them;
* epoch ``e`` orders the windows by a permutation drawn from
  ``np.random.default_rng([seed, e])``: the same on every rank, and
  independent of TensorFlow's seeds, which may differ between ranks;
* global batch ``i`` is windows ``perm[i*B : (i+1)*B]``; the windows after the
  last full batch are left out of that epoch.

``batch_size`` is the GLOBAL batch. Sharding is a pure function of
``(rank, size)``: rank ``r`` of ``N`` takes rows ``[r*B/N, (r+1)*B/N)`` of every
global batch, so every rank runs the same number of steps, no window is on
two ranks, and the ranks' rows stacked in rank order are exactly the
single-process batch.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

from lmkit.data.batching import check_shard, check_stream
from lmkit.data.errors import DataError

__all__ = ["window_arrays", "num_window_batches", "num_windows"]


def num_windows(num_ids: int, num_steps: int) -> int:
    """Windows of ``num_steps + 1`` ids at stride ``num_steps`` in ``num_ids`` ids."""
    return max(0, (int(num_ids) - 1) // int(num_steps))


def num_window_batches(num_ids: int, batch_size: int, num_steps: int) -> int:
    """Global batches per epoch that :func:`window_arrays` gives for ``num_ids`` ids.

    Raises:
      DataError: ``batch_size`` or ``num_steps`` < 1.
    """
    if batch_size < 1 or num_steps < 1:
        raise DataError(f"batch_size = {batch_size} and num_steps = {num_steps} must be >= 1")
    return num_windows(num_ids, num_steps) // int(batch_size)


def _check_seed(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise DataError(f"{name} = {value!r} must be an integer >= 0 (the same on every rank)")
    return int(value)


def window_arrays(ids: np.ndarray, batch_size: int, num_steps: int, *, epoch: int, seed: int,
                  rank: int = 0, size: int = 1,
                  shuffle: bool = True) -> Tuple[np.ndarray, np.ndarray]:
    """This worker's windows for one epoch.

    Args:
      ids: the id stream, 1-D integers.
      batch_size: the GLOBAL batch size (windows per step), a multiple of
        ``size``.
      num_steps: the window length (positions the model predicts).
      epoch: the epoch, which picks the order (>= 0).
      seed: the shuffle seed, the same on every rank (>= 0).
      rank: this worker, in ``[0, size)``.
      size: the number of workers.
      shuffle: False keeps the windows in stream order (evaluation).

    Returns:
      ``(inputs, targets)`` shaped as by :func:`~lmkit.data.batching.bptt_arrays`
      (int32 ``[num_batches, batch_size // size, num_steps]``, each target
      the stream's next id), ``num_batches`` being :func:`num_window_batches`.

    Raises:
      DataError: the checks of ``bptt_arrays``, a negative ``epoch`` or
        ``seed``, or too few ids for one batch (naming the sizes and the fix).
    """
    per_rank = check_shard(batch_size, rank, size)
    ids = check_stream(ids, num_steps)
    epoch, seed = _check_seed("epoch", epoch), _check_seed("seed", seed)
    count = num_windows(ids.size, num_steps)
    num_batches = count // batch_size
    if num_batches < 1:
        raise DataError(f"{ids.size} ids give {count} windows of num_steps {num_steps}, too few "
                        f"for one batch of batch_size {batch_size}: that needs batch_size * "
                        f"num_steps + 1 = {batch_size * num_steps + 1} ids; use a smaller "
                        "batch_size or num_steps, or more text")
    order = (np.random.default_rng([seed, epoch]).permutation(count) if shuffle
             else np.arange(count))
    chosen = order[:num_batches * batch_size].reshape(num_batches, batch_size)
    chosen = chosen[:, rank * per_rank:(rank + 1) * per_rank]  # [num_batches, B/N] window numbers
    positions = chosen[..., None] * num_steps + np.arange(num_steps + 1)  # [num_batches, B/N, T+1]
    windows = ids.astype(np.int32, copy=False)[positions]
    return np.ascontiguousarray(windows[..., :-1]), np.ascontiguousarray(windows[..., 1:])
