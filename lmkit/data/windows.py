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

Random-offset windows (``sampling="random"``) draw every window's start
uniformly from ``[0, len(ids) - num_steps - 1]`` with
``np.random.default_rng([seed, epoch])``, as many per epoch as fixed windows:
windows overlap and an epoch no longer covers the text exactly once, the way
small-model recipes (nanoGPT) train.

:class:`WindowBatches` gives the same batches one at a time, reading only
each batch's windows from ``ids`` (a ``numpy.memmap`` of the data cache is
never loaded whole); :func:`window_arrays` stacks them.

``batch_size`` is the GLOBAL batch. Sharding is a pure function of
``(rank, size)``: rank ``r`` of ``N`` takes rows ``[r*B/N, (r+1)*B/N)`` of every
global batch, so every rank runs the same number of steps, no window is on
two ranks, and the ranks' rows stacked in rank order are exactly the
single-process batch.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

from lmkit.data.batching import Batches, check_shard, check_stream
from lmkit.data.errors import DataError

__all__ = ["window_arrays", "num_window_batches", "num_windows", "WindowBatches", "SAMPLINGS"]

#: How windows are placed: ``"windows"`` (fixed, shuffled: exact epochs) or ``"random"`` offsets.
SAMPLINGS = ("windows", "random")


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


class WindowBatches(Batches):
    """This worker's windows of one epoch, made one batch at a time.

    ``len(batches)`` is the number of steps; ``batches[i]`` is ``(inputs,
    targets)``, int32 ``[batch_size // size, num_steps]``, equal to row ``i``
    of :func:`window_arrays`.
    """

    def __init__(self, ids: np.ndarray, batch_size: int, num_steps: int, *, epoch: int, seed: int,
                 rank: int = 0, size: int = 1, shuffle: bool = True,
                 sampling: str = "windows") -> None:
        """Args: as :func:`window_arrays`.

        Raises:
          DataError: as :func:`window_arrays`, or an unknown ``sampling``.
        """
        per_rank = check_shard(batch_size, rank, size)
        ids = check_stream(ids, num_steps)
        epoch, seed = _check_seed("epoch", epoch), _check_seed("seed", seed)
        if sampling not in SAMPLINGS:
            raise DataError(f"sampling = {sampling!r} is not one of {', '.join(SAMPLINGS)}")
        count = num_windows(ids.size, num_steps)
        num_batches = count // batch_size
        if num_batches < 1:
            raise DataError(f"{ids.size} ids give {count} windows of num_steps {num_steps}, too few "
                            f"for one batch of batch_size {batch_size}: that needs batch_size * "
                            f"num_steps + 1 = {batch_size * num_steps + 1} ids; use a smaller "
                            "batch_size or num_steps, or more text")
        rng = np.random.default_rng([seed, epoch])
        if sampling == "random" and shuffle:
            starts = rng.integers(0, ids.size - num_steps, size=(num_batches, batch_size))
        else:
            order = rng.permutation(count) if shuffle else np.arange(count)
            starts = order[:num_batches * batch_size].reshape(num_batches, batch_size) * num_steps
        self.starts = np.ascontiguousarray(starts[:, rank * per_rank:(rank + 1) * per_rank])  # [steps, B/N]
        self.ids = ids
        self.num_steps = int(num_steps)
        self.shape = (num_batches, per_rank, self.num_steps)

    def _batch(self, i: int) -> np.ndarray:
        return self.ids[self.starts[i][:, None] + np.arange(self.num_steps + 1)]  # [B/N, T+1]


def window_arrays(ids: np.ndarray, batch_size: int, num_steps: int, *, epoch: int, seed: int,
                  rank: int = 0, size: int = 1, shuffle: bool = True,
                  sampling: str = "windows") -> Tuple[np.ndarray, np.ndarray]:
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
      sampling: ``"windows"`` (fixed windows, shuffled) or ``"random"``
        (random offsets; see the module's docstring).

    Returns:
      ``(inputs, targets)`` shaped as by :func:`~lmkit.data.batching.bptt_arrays`
      (int32 ``[num_batches, batch_size // size, num_steps]``, each target
      the stream's next id), ``num_batches`` being :func:`num_window_batches`.

    Raises:
      DataError: the checks of ``bptt_arrays``, a negative ``epoch`` or
        ``seed``, or too few ids for one batch (naming the sizes and the fix).
    """
    batches = WindowBatches(ids, batch_size, num_steps, epoch=epoch, seed=seed, rank=rank, size=size,
                            shuffle=shuffle, sampling=sampling)
    positions = batches.starts[..., None] + np.arange(num_steps + 1)  # [num_batches, B/N, T+1]
    windows = np.asarray(batches.ids[positions], dtype=np.int32)
    return np.ascontiguousarray(windows[..., :-1]), np.ascontiguousarray(windows[..., 1:])
