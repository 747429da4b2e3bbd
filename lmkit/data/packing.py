"""Examples with loss weights as training rows: packed several to a window, or padded one to a row.

An example (:class:`~lmkit.data.chat.Example`) is ``ids`` and ``weights``
(1: the loss counts the id as a target). A row holds ``num_steps + 1`` ids,
as a window of :mod:`lmkit.data.windows` does: the inputs are its first
``num_steps``, the targets its last ``num_steps``. Every row comes as a
:class:`Rows` of five arrays ``[rows, num_steps]`` (a packed row's window may
be shorter): ``inputs``, ``targets``, ``weights`` (of the targets, float32),
``segment_ids`` (which example an input belongs to: 1, 2, ... within the row,
0 for padding) and ``positions`` (restarting at 0 for each example).

* **Too long** (:func:`fit_examples`): an example longer than a row is cut
  at its end (its start is kept: the system prompt and the first turns); one
  left with no target of weight 1 is dropped. Both are counted.
* **Packed** (:func:`pack_groups`, :class:`PackedBatches`): examples are laid
  one after the other in rows, each into the first of the last
  ``open_rows`` rows it fits in. No loss crosses a boundary: the target of
  an example's last id would be the next example's first id, and it weighs
  0; the model attends within each example (``segment_ids``, a
  block-diagonal causal mask) and counts positions from its start. Rows come
  in a few windows (:func:`window_lengths`: ``num_steps``, its half, its
  quarter; :class:`PackLayout`, :func:`cheapest_packing`); a batch of a window
  ``num_steps / m`` has ``m`` times the rows, as many positions as any other
  batch, and its attention scores ``m`` times fewer keys per query.
* **Padded** (:class:`PaddedBatches`): one example a row, rows of similar
  lengths batched together (:func:`lmkit.data.paired.bucketed_batches`) and
  padded to the global batch's longest, rounded up to a length bucket
  (:func:`lmkit.data.paired.padded_length`); padding weighs 0.

``batch_size`` is the GLOBAL batch, and sharding is a pure function of
``(rank, size)``: every epoch's rows are made the same on every rank from
``np.random.default_rng([seed, epoch])``, and rank ``r`` of ``N`` takes rows
``[r*B/N, (r+1)*B/N)`` of each global batch of ``B`` rows (``batch_size``, or
a multiple of it for a packed batch of a shorter window). ``weighted_tokens[i]`` is the
weight of global batch ``i`` (every rank's rows): the divisor of a loss per
weighted token, known on every rank without a collective.
"""

from __future__ import annotations

import bisect
import collections
from typing import Any, Callable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from lmkit.data.batching import check_shard
from lmkit.data.errors import DataError
from lmkit.data.examples import ExampleSet
from lmkit.data.paired import bucketed_batches, padded_length, shard_rows

__all__ = ["MIN_WINDOW", "PACK_WINDOWS", "SHARE", "SHARES", "FitReport", "PackLayout", "PackedBatches", "PaddedBatches",
           "Rows", "cheapest_packing", "eval_rows", "fit_examples", "pack_groups", "rows_of", "top_up",
           "window_lengths"]

#: How many of the last rows an example may go into (first fit): more fills rows better, and costs time.
OPEN_ROWS = 32
#: The window lengths packed rows come in by default (``data.pack_windows``): the context, its half, its quarter.
PACK_WINDOWS = 3
#: A window takes the examples that fill at most 1/share of its row (share 2: two or more fit); the shares
#: :func:`cheapest_packing` tries. A share of 1 moves more examples to shorter windows and fills their rows less.
SHARE = 2
SHARES = (1.0, 1.25, 1.5, 2.0)
#: The shortest window a packed row is cut to.
MIN_WINDOW = 16


class Rows(NamedTuple):
    """Training rows, each array ``[rows, num_steps]``: see the module's docstring."""

    inputs: np.ndarray
    targets: np.ndarray
    weights: np.ndarray
    segment_ids: np.ndarray
    positions: np.ndarray


class FitReport(NamedTuple):
    """What :func:`fit_examples` did: ``cut`` examples shortened, ``dropped`` left out (no target left)."""

    kept: int
    cut: int
    dropped: int

    def lines(self, what: str, max_length: int) -> List[str]:
        """The log line (none when nothing was cut or dropped)."""
        if not (self.cut or self.dropped):
            return []
        return [f"{what}: {self.cut + self.dropped} examples are longer than {max_length} tokens: {self.cut} cut "
                f"at the end, {self.dropped} dropped (no assistant token left)"]


def fit_examples(examples: Any, max_length: int) -> Tuple[ExampleSet, FitReport]:
    """The examples cut to ``max_length`` ids (``num_steps + 1``) at their end; those then without a
    target of weight > 0 (the first id is never a target) or shorter than 2 ids left out.

    Args:
      examples: an :class:`~lmkit.data.examples.ExampleSet` or a sequence of ``(ids, weights)``.

    Returns:
      ``(kept examples, FitReport)``: an :class:`~lmkit.data.examples.ExampleSet` sharing the arrays.
    """
    if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or max_length < 2:
        raise DataError(f"max_length = {max_length!r} must be an integer >= 2 (num_steps + 1)")
    examples = ExampleSet.of(examples)
    long = examples.lengths > max_length
    fitted = examples.cut(int(max_length))
    keep = (fitted.lengths >= 2) & (fitted.targets() > 0)
    return fitted.subset(np.flatnonzero(keep)), FitReport(int(keep.sum()), int((long & keep).sum()),
                                                          int((~keep).sum()))


def _lengths(examples: ExampleSet, length: int) -> np.ndarray:
    lengths = examples.lengths
    if len(lengths) and lengths.max() > length:
        raise DataError(f"an example of {int(lengths.max())} ids does not fit a row of {length} (num_steps + 1); "
                        "cut the examples first (lmkit.data.packing.fit_examples)")
    return lengths


def pack_groups(lengths: Sequence[int], length: int, order: Sequence[int],
                open_rows: int = OPEN_ROWS) -> List[List[int]]:
    """The examples of ``order`` (indices into ``lengths``) laid into rows of ``length`` ids: each goes
    into the first of the last ``open_rows`` rows with room for it, else a new row.

    Returns:
      one list of example indices per row, in the order they lie there.
    """
    groups: List[List[int]] = []
    room: List[int] = []
    for index in order:
        need = int(lengths[index])
        first = max(0, len(groups) - open_rows)
        for row in range(first, len(groups)):
            if room[row] >= need:
                groups[row].append(int(index))
                room[row] -= need
                break
        else:
            groups.append([int(index)])
            room.append(length - need)
    return groups


def rows_of(examples: Any, groups: Sequence[Sequence[int]], num_steps: int,
            pad_id: int = 0) -> Rows:
    """The :class:`Rows` of ``groups`` (lists of example indices, each list one row of ``num_steps + 1`` ids,
    the examples one after the other, then ``pad_id``)."""
    count, width = len(groups), int(num_steps) + 1
    ids = np.full([count, width], pad_id, np.int32)
    weights = np.zeros([count, width], np.float32)
    segments = np.zeros([count, width], np.int32)
    positions = np.zeros([count, width], np.int32)
    for row, group in enumerate(groups):
        at = 0
        for segment, index in enumerate(group, 1):
            example_ids, example_weights = examples[index]
            end = at + len(example_ids)
            ids[row, at:end] = example_ids
            weights[row, at:end] = example_weights
            segments[row, at:end] = segment
            positions[row, at:end] = np.arange(len(example_ids))
            at = end
    # A target counts only inside its input's example: not across a boundary, not in padding.
    same = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] > 0)
    return Rows(ids[:, :-1], ids[:, 1:], weights[:, 1:] * same, segments[:, :-1], positions[:, :-1])


class _RowBatches:
    """What the packed and the padded batches share: ``len()`` steps, ``[i]`` this rank's :class:`Rows`
    of global batch ``i``, ``weighted_tokens`` [steps] (every rank's weight per global batch)."""

    def __init__(self, examples: ExampleSet, groups: List[List[List[int]]], num_steps: int, rank: int, size: int,
                 pad_id: int) -> None:
        self.examples, self.groups = examples, groups  # groups: [steps, batch_size] of row groups
        self.num_steps, self.rank, self.size, self.pad_id = int(num_steps), int(rank), int(size), int(pad_id)
        targets = examples.targets()
        self.weighted_tokens = np.array([sum(targets[i] for row in batch for i in row) for batch in groups],
                                        np.float64)

    def __len__(self) -> int:
        return len(self.groups)

    def _length(self, i: int) -> int:
        return self.num_steps

    def __getitem__(self, i: int) -> Rows:
        if not -len(self) <= i < len(self):
            raise IndexError(f"batch {i} of {len(self)}")
        i %= len(self)
        mine = shard_rows(np.arange(len(self.groups[i])), self.rank, self.size)
        return rows_of(self.examples, [self.groups[i][r] for r in mine], self._length(i), self.pad_id)


def top_up(groups: List[List[int]], lengths: Sequence[int], length: int, candidates: Sequence[int]) -> set:
    """Fills the room left in ``groups`` (rows of ``length`` ids, changed in place) with ``candidates`` (example
    indices): row after row, the longest candidate that fits, the first of ``candidates`` among equals.

    Returns:
      the candidates left out, as a set.
    """
    queues: dict = {}
    for i in candidates:
        queues.setdefault(int(lengths[i]), collections.deque()).append(int(i))
    sizes = sorted(queues)
    for group in groups:
        room = length - sum(int(lengths[i]) for i in group)
        while sizes and room >= sizes[0]:
            at = bisect.bisect_right(sizes, room) - 1
            need = sizes[at]
            group.append(queues[need].popleft())
            room -= need
            if not queues[need]:
                del sizes[at]
    return {i for queue in queues.values() for i in queue}


def window_lengths(num_steps: int, count: int = PACK_WINDOWS) -> Tuple[int, ...]:
    """The windows packed rows come in, shortest first: ``num_steps``, then its half, its quarter, ... (``count``
    lengths at most, each a whole fraction of ``num_steps`` and at least :data:`MIN_WINDOW` ids).

    Raises:
      DataError: ``count`` is not a positive integer.
    """
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
        raise DataError(f"pack_windows = {count!r} must be a positive integer (1: every packed row num_steps long)")
    windows = [int(num_steps)]
    while len(windows) < count and windows[-1] % 2 == 0 and windows[-1] // 2 >= MIN_WINDOW:
        windows.append(windows[-1] // 2)
    return tuple(sorted(windows))


class PackLayout(NamedTuple):
    """How :class:`PackedBatches` lays examples into rows: ``windows`` (how many window lengths,
    :func:`window_lengths`), ``share`` (a window takes the examples that fill at most ``1 / share`` of its row)
    and ``open_rows`` (how many of the last rows first fit looks at, :func:`pack_groups`)."""

    windows: int = PACK_WINDOWS
    share: float = SHARE
    open_rows: int = OPEN_ROWS


class PackedBatches(_RowBatches):
    """One epoch of packed rows, this rank's share of each global batch (see the module's docstring).

    The examples are shuffled by ``np.random.default_rng([seed, epoch])`` (in order without
    ``shuffle``) and each goes to the shortest of the ``layout``'s windows (:class:`PackLayout`,
    :func:`window_lengths`: the context, its half, its quarter) whose row it fills at most ``1 / share`` of
    (else the longest). Each window's examples
    are packed (:func:`pack_groups`) into rows of that window and cut into global batches of
    ``batch_size * num_steps / window`` rows: every batch holds ``batch_size * num_steps`` positions, and a
    short window's rows attend over fewer keys. The rows after a window's last full batch go on to the next
    window; those after the longest window's last full batch are left out of that epoch. With several
    windows the batches are then shuffled by the same generator. A batch is ``[rows // size, window]``;
    ``windows = 1`` gives every batch ``[batch_size // size, num_steps]``.
    """

    def __init__(self, examples: Any, batch_size: int, num_steps: int, *, epoch: int, seed: int, rank: int = 0,
                 size: int = 1, shuffle: bool = True, pad_id: int = 0, layout: Optional[PackLayout] = None) -> None:
        check_shard(batch_size, rank, size)
        layout = PackLayout() if layout is None else layout
        windows, share, open_rows = layout
        self.layout = layout
        examples = ExampleSet.of(examples)
        lengths = _lengths(examples, int(num_steps) + 1)
        rng = np.random.default_rng([int(seed), int(epoch)])
        order = rng.permutation(len(lengths)) if shuffle else np.arange(len(lengths))
        self.window_lengths = window_lengths(int(num_steps), windows)
        # each example's window: the shortest it fills at most 1/share of, else the longest
        shortest = np.minimum(np.searchsorted(np.array(self.window_lengths) + 1, lengths[order] * float(share)),
                              len(self.window_lengths) - 1)
        # Longest window first: its rows' room is filled with the shorter windows' examples (best fit), so that
        # fewer short rows are needed; a row costs its window's positions however full it is.
        pools = [[int(i) for i in order[shortest == k]] for k in range(len(self.window_lengths))]
        packed: List[List[List[int]]] = [[] for _ in self.window_lengths]
        for k in reversed(range(len(self.window_lengths))):
            window = self.window_lengths[k]
            packed[k] = pack_groups(lengths, window + 1, pools[k], open_rows)
            if k:
                shorter = top_up(packed[k], lengths, window + 1, [i for pool in pools[:k] for i in pool])
                pools[:k] = [[i for i in pool if i in shorter] for pool in pools[:k]]
        # Then batches, shortest window first: the examples of a window's last, partial batch go on to the next.
        batches: List[Tuple[int, List[List[int]]]] = []
        carried: List[int] = []
        groups: List[List[int]] = []
        for k, window in enumerate(self.window_lengths):
            groups = packed[k]
            if carried:
                rest = top_up(groups, lengths, window + 1, carried)
                groups = groups + pack_groups(lengths, window + 1, [i for i in carried if i in rest], open_rows)
            rows = int(batch_size) * (int(num_steps) // window)
            full = len(groups) // rows * rows
            if k < len(self.window_lengths) - 1:  # a partial batch's examples go on to the next window
                carried = [i for group in groups[full:] for i in group]
                groups = groups[:full]
            batches.extend((window, groups[s:s + rows]) for s in range(0, full, rows))
        if not batches:
            raise DataError(f"the examples make {len(groups)} packed rows, too few for one batch of batch_size "
                            f"{batch_size}; use a smaller batch_size or more examples")
        if len(self.window_lengths) > 1 and shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        #: the ids the epoch's batches hold, padding left out
        self.ids = int(sum(lengths[i] for _, groups in batches for row in groups for i in row))
        #: the share of a packed row's ids that are not padding
        self.fill = self.ids / max(1, sum(len(g) * (w + 1) for w, g in batches))
        self.windows = [window for window, _ in batches]  # [steps]: each global batch's window
        super().__init__(examples, [groups for _, groups in batches], num_steps, rank, size, pad_id)

    def _length(self, i: int) -> int:
        return self.windows[i]

    def cost(self, position_cost: Callable[[int], float]) -> float:
        """The epoch's cost per id packed: every batch's positions times ``position_cost(window)``."""
        return sum(len(batch) * w * position_cost(w) for batch, w in zip(self.groups, self.windows)) / max(1, self.ids)


def cheapest_packing(examples: Any, batch_size: int, num_steps: int, *, windows: int, seed: int,
                     position_cost: Callable[[int], float], shares: Sequence[float] = SHARES) -> PackLayout:
    """The :class:`PackLayout` whose first epoch costs least per id (:meth:`PackedBatches.cost`): every row
    ``num_steps`` long, or ``windows`` windows at each of ``shares``.

    Shorter windows cost less per position (``position_cost``, a model's FLOPs per position of a window:
    :func:`lmkit.train.tasks.position_cost`) but may fill their rows less: which wins depends on the examples'
    lengths and on the model. A pure function of its arguments: every rank chooses the same.
    """
    one = PackLayout(windows=1)
    if windows <= 1 or len(window_lengths(int(num_steps), windows)) == 1:
        return one
    best, best_cost = one, None
    for layout in [one] + [PackLayout(windows, float(s)) for s in shares]:
        try:
            cost = PackedBatches(examples, batch_size, num_steps, epoch=0, seed=seed, layout=layout).cost(position_cost)
        except DataError:  # too few rows of this layout for a batch
            continue
        if best_cost is None or cost < best_cost:
            best, best_cost = layout, cost
    return best


class PaddedBatches(_RowBatches):
    """One epoch of one example a row, rows of similar lengths batched together, this rank's share.

    Global batch ``i`` is padded to the length bucket (:func:`~lmkit.data.paired.padded_length`) of its
    longest example less one, at most ``num_steps``: batches come in a few lengths.
    """

    def __init__(self, examples: Any, batch_size: int, num_steps: int, *, epoch: int, seed: int, rank: int = 0,
                 size: int = 1, pad_id: int = 0) -> None:
        check_shard(batch_size, rank, size)
        examples = ExampleSet.of(examples)
        self.lengths = _lengths(examples, int(num_steps) + 1)
        if len(self.lengths) < batch_size:
            raise DataError(f"{len(self.lengths)} examples make no batch of batch_size {batch_size}; use a smaller "
                            "batch_size or more examples")
        index = bucketed_batches(self.lengths, np.zeros_like(self.lengths), batch_size, epoch=epoch, seed=seed)
        super().__init__(examples, [[[int(i)] for i in batch] for batch in index], num_steps, rank, size, pad_id)

    def _length(self, i: int) -> int:
        longest = max(int(self.lengths[row[0]]) for row in self.groups[i])
        return min(self.num_steps, padded_length(longest - 1))


def eval_rows(examples: Any, batch_size: int, num_steps: int, pad_id: int = 0) -> Iterator[Rows]:
    """Every example once, one a row, for an evaluation in one process: sorted by length, ``batch_size`` rows
    a batch (the last filled up with empty rows), each batch padded to its length bucket, at most
    ``num_steps`` (cut the examples first: :func:`fit_examples`).

    Yields:
      each batch's :class:`Rows` (their ``weights`` sum to every example's targets' weight).
    """
    examples = ExampleSet.of(examples)
    lengths = _lengths(examples, int(num_steps) + 1)
    order = [int(i) for i in np.argsort(lengths, kind="stable")]
    for first in range(0, len(order), batch_size):
        rows = [[i] for i in order[first:first + batch_size]]
        longest = max(int(lengths[row[0]]) for row in rows)
        rows += [[] for _ in range(batch_size - len(rows))]  # empty rows: padding, weight 0
        yield rows_of(examples, rows, min(int(num_steps), padded_length(longest - 1)), pad_id)
