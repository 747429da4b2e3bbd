"""Examples with loss weights held as flat arrays: in memory, or memory-mapped from the data cache.

An example (:class:`~lmkit.data.chat.Example`) is ``ids`` and ``weights``
(uint8, 1: the loss counts the id as a target). An :class:`ExampleSet`
holds many as four arrays, so that a file of a million conversations costs
no Python object per conversation and can be read straight from the cache
files (:mod:`lmkit.data.example_cache`)::

    ids      [tokens]    every example's ids, one after the other
    weights  [tokens]    uint8, one per id
    starts   [examples]  int64, where example i starts in ids
    lengths  [examples]  int64, its number of ids

Example ``i`` is ``ids[starts[i]:starts[i] + lengths[i]]``. Cutting an
example (:meth:`ExampleSet.cut`) or leaving some out
(:meth:`ExampleSet.subset`) changes ``lengths`` and ``starts`` only, never
the ids: a cached set stays memory-mapped. ``starts`` stay ascending.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np

from lmkit.data.chat import Example

__all__ = ["ExampleSet"]

#: Examples whose target counts :meth:`ExampleSet.targets` sums at a time (bounds its memory).
_CHUNK = 4096


class ExampleSet:
    """Examples as flat arrays (see the module's docstring); a sequence of :class:`~lmkit.data.chat.Example`.

    Args:
      ids: 1-D ids (any unsigned or int dtype; a memory map of the cache's is fine).
      weights: 1-D uint8 weights, one per id.
      starts: int64 [examples], ascending.
      lengths: int64 [examples].
    """

    def __init__(self, ids: np.ndarray, weights: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
        self.ids, self.weights = ids, weights
        self.starts = np.asarray(starts, np.int64)
        self.lengths = np.asarray(lengths, np.int64)

    @classmethod
    def of(cls, examples: Any) -> "ExampleSet":
        """``examples`` as a set: an :class:`ExampleSet` as it is, a sequence of ``(ids, weights)`` concatenated."""
        if isinstance(examples, ExampleSet):
            return examples
        examples = list(examples)
        lengths = np.array([len(ids) for ids, _ in examples], np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(lengths) else lengths
        ids = np.concatenate([np.asarray(i, np.int32) for i, _ in examples]) if examples else np.zeros(0, np.int32)
        weights = (np.concatenate([np.asarray(w, np.uint8) for _, w in examples]) if examples
                   else np.zeros(0, np.uint8))
        return cls(ids, weights, starts, lengths)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> Example:
        start, end = int(self.starts[i]), int(self.starts[i] + self.lengths[i])
        return Example(np.asarray(self.ids[start:end], np.int32), np.asarray(self.weights[start:end], np.uint8))

    def __iter__(self) -> Iterator[Example]:
        return (self[i] for i in range(len(self)))

    @property
    def tokens(self) -> int:
        """The ids of every example together."""
        return int(self.lengths.sum())

    def targets(self) -> np.ndarray:
        """float64 [examples]: each example's weight on its targets, ``weights[1:]`` (its first id is never one)."""
        out = np.zeros(len(self), np.float64)
        for first in range(0, len(self), _CHUNK):
            starts = self.starts[first:first + _CHUNK]
            ends = starts + self.lengths[first:first + _CHUNK]
            if not len(starts):
                continue
            low, high = int(starts.min()), int(ends.max())
            sums = np.concatenate([[0], np.cumsum(np.asarray(self.weights[low:high], np.int64))])
            out[first:first + len(starts)] = np.where(ends > starts + 1, sums[ends - low] - sums[
                np.minimum(starts + 1, ends) - low], 0)
        return out

    def subset(self, index: Sequence[int]) -> "ExampleSet":
        """The examples at ``index`` (ascending), sharing the arrays."""
        index = np.asarray(index, np.int64)
        return ExampleSet(self.ids, self.weights, self.starts[index], self.lengths[index])

    def cut(self, max_length: int) -> "ExampleSet":
        """Every example cut to its first ``max_length`` ids, sharing the arrays."""
        return ExampleSet(self.ids, self.weights, self.starts, np.minimum(self.lengths, int(max_length)))

    def in_memory(self) -> "ExampleSet":
        """A copy holding only these examples, in memory (to send to a rank that cannot map the cache)."""
        return ExampleSet.of(list(self))
