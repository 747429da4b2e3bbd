"""BPTT batches of one id stream, split across workers (Zaremba et al. 2014).

The stream is cut into ``batch_size`` rows of equal length, and the rows are
read left to right in windows of ``num_steps``; window ``i`` of a row
continues window ``i - 1``, so a recurrent state carries across batches. The
targets are the inputs shifted by one position in the stream.

``batch_size`` is the GLOBAL batch. Sharding is a pure function of
``(rank, size)``: rank ``r`` of ``N`` takes the contiguous rows
``[r*B/N, (r+1)*B/N)`` of every batch, so the ranks' shards stacked in rank
order are exactly the single-worker batches and the per-rank losses average
to the global-batch loss.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

from lmkit.data.errors import DataError

__all__ = ["bptt_arrays", "num_bptt_batches", "bptt_dataset", "check_shard", "check_stream",
           "Batches", "BpttBatches"]


def check_shard(batch_size: int, rank: int, size: int) -> int:
    """Checks a global batch and a worker; returns the per-worker batch ``B // N``.

    Raises:
      DataError: ``batch_size``/``size`` not positive, ``rank`` outside
        ``[0, size)``, or ``batch_size`` not divisible by ``size``.
    """
    for name, value in (("batch_size", batch_size), ("size", size)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise DataError(f"{name} = {value!r} must be a positive integer")
    if not isinstance(rank, (int, np.integer)) or isinstance(rank, bool) or not 0 <= rank < size:
        raise DataError(f"rank = {rank!r} is not in [0, {size}) for {size} workers")
    if batch_size % size:
        raise DataError(f"batch_size {batch_size} is not divisible by {size} workers; "
                        f"use a multiple of {size}")
    return int(batch_size // size)


def check_stream(ids: np.ndarray, num_steps: int) -> np.ndarray:
    """Checks an id stream and a window length; returns the stream as a NumPy array.

    Raises:
      DataError: ``num_steps`` is not a positive integer, or ``ids`` is not a
        1-D integer array.
    """
    if not isinstance(num_steps, (int, np.integer)) or isinstance(num_steps, bool) or num_steps < 1:
        raise DataError(f"num_steps = {num_steps!r} must be a positive integer")
    ids = np.asarray(ids)
    if ids.ndim != 1 or not (np.issubdtype(ids.dtype, np.integer) or ids.size == 0):
        raise DataError(f"ids must be a 1-D integer array, got shape {ids.shape} dtype {ids.dtype}")
    return ids


def num_bptt_batches(num_ids: int, batch_size: int, num_steps: int) -> int:
    """Number of BPTT batches (windows) that ``num_ids`` ids give.

    Each of the ``batch_size`` rows holds ``num_ids // batch_size`` ids; a
    window needs ``num_steps`` inputs plus one more id for the last target.
    """
    if batch_size < 1 or num_steps < 1:
        raise DataError(f"batch_size = {batch_size} and num_steps = {num_steps} must be >= 1")
    row_len = int(num_ids) // int(batch_size)
    return max(0, (row_len - 1) // int(num_steps))


class Batches:
    """The batches of one epoch, made one at a time: ``len()`` steps, ``[i]`` is ``(inputs, targets)``.

    A subclass sets ``shape = (num_batches, rows, num_steps)`` and
    :meth:`_batch`, which returns int32 ``[rows, num_steps + 1]`` ids (the
    inputs are all but the last, the targets all but the first).
    """

    shape: Tuple[int, int, int]

    def __len__(self) -> int:
        return self.shape[0]

    def _batch(self, i: int) -> np.ndarray:
        raise NotImplementedError

    def __getitem__(self, i: int) -> Tuple[np.ndarray, np.ndarray]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"batch {i} of {len(self)}")
        window = np.asarray(self._batch(i % len(self)), dtype=np.int32)
        return np.ascontiguousarray(window[:, :-1]), np.ascontiguousarray(window[:, 1:])


class BpttBatches(Batches):
    """This worker's BPTT batches, made one at a time from ``ids`` (a memmap stays on disk).

    ``len(batches)`` is the number of windows; ``batches[i]`` is ``(inputs,
    targets)``, int32 ``[batch_size // size, num_steps]``, equal to row ``i``
    of :func:`bptt_arrays`.
    """

    def __init__(self, ids: np.ndarray, batch_size: int, num_steps: int, rank: int = 0,
                 size: int = 1) -> None:
        """Args and errors: as :func:`bptt_arrays`."""
        per_rank = check_shard(batch_size, rank, size)
        ids = check_stream(ids, num_steps)
        row_len = ids.size // batch_size
        num_batches = num_bptt_batches(ids.size, batch_size, num_steps)
        if num_batches < 1:
            raise DataError(f"{ids.size} ids are too few for one batch of batch_size {batch_size} x "
                            f"num_steps {num_steps}: that needs batch_size * (num_steps + 1) = "
                            f"{batch_size * (num_steps + 1)} ids; use a smaller batch_size or num_steps")
        rows = ids[:batch_size * row_len].reshape(batch_size, row_len)  # a view, nothing read
        self.rows = rows[rank * per_rank:(rank + 1) * per_rank]  # [B/N, row_len]
        self.num_steps = int(num_steps)
        self.shape = (num_batches, per_rank, self.num_steps)

    def _batch(self, i: int) -> np.ndarray:
        return self.rows[:, i * self.num_steps:(i + 1) * self.num_steps + 1]


def bptt_arrays(ids: np.ndarray, batch_size: int, num_steps: int, rank: int = 0,
                size: int = 1) -> Tuple[np.ndarray, np.ndarray]:
    """This worker's BPTT inputs and targets.

    Args:
      ids: the id stream, 1-D integers.
      batch_size: the GLOBAL batch size (rows), a multiple of ``size``.
      num_steps: the window length.
      rank: this worker, in ``[0, size)``.
      size: the number of workers.

    Returns:
      ``(inputs, targets)``, each int32 ``[num_batches, batch_size // size,
      num_steps]``; ``targets[i, b, t]`` is the id after ``inputs[i, b, t]``
      in the stream.

    Raises:
      DataError: a bad ``ids`` array, ``batch_size`` not divisible by
        ``size``, or too few ids for one batch (naming the sizes).
    """
    batches = BpttBatches(ids, batch_size, num_steps, rank, size)
    num_batches, per_rank, _ = batches.shape
    used = num_batches * num_steps
    rows = np.asarray(batches.rows[:, :used + 1], dtype=np.int32)
    # [B/N, num_batches, num_steps] -> [num_batches, B/N, num_steps]
    inputs = rows[:, :used].reshape(per_rank, num_batches, num_steps).transpose(1, 0, 2)
    targets = rows[:, 1:used + 1].reshape(per_rank, num_batches, num_steps).transpose(1, 0, 2)
    return np.ascontiguousarray(inputs), np.ascontiguousarray(targets)


def bptt_dataset(inputs: np.ndarray, targets: np.ndarray, prefetch: int = 2) -> "tf.data.Dataset":
    """A ``tf.data`` pipeline over :func:`bptt_arrays` output, in order.

    The batches are never shuffled here: a recurrent state carries from batch
    ``i`` to batch ``i + 1``. The output of
    :func:`lmkit.data.windows.window_arrays` (already shuffled) fits too.

    Args:
      inputs: int32 ``[num_batches, batch, num_steps]``.
      targets: int32, the same shape.
      prefetch: batches to prepare ahead (``tf.data.AUTOTUNE`` allowed).

    Returns:
      A dataset of ``(inputs [batch, num_steps], targets [batch, num_steps])``.

    Raises:
      DataError: the two arrays differ in shape or are not 3-D.
    """
    inputs, targets = np.asarray(inputs), np.asarray(targets)
    if inputs.shape != targets.shape or inputs.ndim != 3:
        raise DataError(f"inputs {inputs.shape} and targets {targets.shape} must both be "
                        "[num_batches, batch, num_steps]; pass the output of bptt_arrays or "
                        "window_arrays")
    import tensorflow as tf  # here: the batches themselves need no TensorFlow

    dataset = tf.data.Dataset.from_tensor_slices((inputs.astype(np.int32, copy=False),
                                                  targets.astype(np.int32, copy=False)))
    return dataset.prefetch(prefetch)
