"""Line-aligned source/target pairs for conditional generation: reading, checking, bucketing, sharding.

Line ``i`` of the source file goes with line ``i`` of the target file
(translation, summarization, any transduction). :func:`read_pairs` checks
that the files have as many lines, :func:`encode_pairs` tokenizes them and
leaves out, counting each kind, the pairs with an empty side and the pairs
longer than the limits (:class:`PairReport` says how many, and which lines
first), and :func:`bucketed_batches` forms an epoch's global batches:

* pairs are shuffled by ``np.random.default_rng([seed, epoch])`` (the same on
  every rank), cut into pools of ``pool_batches`` batches, each pool sorted
  by (source length, target length) and cut into batches, and the batches
  shuffled again: rows of one batch have similar lengths (little padding)
  while the order stays random;
* only full batches are kept, so every epoch has ``len(pairs) // batch_size``
  of them, whatever the lengths.

``batch_size`` is the GLOBAL batch and sharding is a pure function of
``(rank, size)`` as for language models: rank ``r`` of ``N`` takes rows
``[r*B/N, (r+1)*B/N)`` of every global batch (:func:`shard_rows`), so every
rank runs the same number of steps and the ranks' rows in rank order are the
single-process batch.

:class:`PairBatches` turns the bucketed batches into what the trainer feeds
the model, one batch at a time: ``(source, source_mask, target_inputs)`` and
``(target_outputs, weights)``. Every rank pads its rows to the lengths of the
*global* batch, rounded up to a length bucket (:func:`padded_length`: 8, 16,
24, 32, then about 1.5 times the one before, so a compiled step sees few
shapes and about a third of a row at most is padding), and the weights are the target mask times
``batch_size / tokens``, ``tokens`` the global batch's target tokens: the
trainer's loss (the mean over rows of the weighted sum over positions) is
then the mean loss per target token of the global batch, whatever the number
of ranks and micro-batches it is split into. :func:`eval_pair_batches` reads
pairs in order for evaluation, with weights 1 (the sum).
"""

from __future__ import annotations

import collections.abc
import dataclasses
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from lmkit.data.batching import check_shard
from lmkit.data.errors import DataError

__all__ = ["PAD_MULTIPLE", "LineRows", "PairBatches", "PairReport", "Pairs", "bucketed_batches", "encode_pairs",
           "SpecialIds", "check_pair_files", "count_lines", "eval_pair_batches", "pad_rows", "padded_length",
           "pairs_from_lines", "read_lines", "read_pairs", "shard_rows"]

#: Batches are padded to a multiple of this many positions (and to buckets growing by 1.5x past 32).
PAD_MULTIPLE = 8


def read_lines(path: str, side: str) -> List[str]:
    """The file's lines split at "\n" only (as `wc -l` counts them), a final "\r" (CRLF) dropped."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            lines = f.read().split("\n")
    except FileNotFoundError:
        raise DataError(f"{side}_file {path} does not exist; pass an existing UTF-8 text file") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{side}_file {path} is not UTF-8 text (byte {exc.start}); convert it to UTF-8") from None
    if lines and lines[-1] == "":  # the end of the last line
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_pairs(source_path: str, target_path: str) -> Tuple[List[str], List[str]]:
    """The lines of both files (without line ends); they must have as many lines.

    Raises:
      DataError: a missing or non-UTF-8 file, or files of different line counts
        (naming both counts).
    """
    source, target = read_lines(source_path, "source"), read_lines(target_path, "target")
    _check_line_counts(len(source), len(target), source_path, target_path)
    return source, target


def count_lines(path: str, side: str) -> int:
    """The number of lines :func:`read_lines` finds in the file, counted without decoding or keeping them."""
    count, last = 0, b"\n"
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                count += chunk.count(b"\n")
                last = chunk[-1:]
    except FileNotFoundError:
        raise DataError(f"{side}_file {path} does not exist; pass an existing UTF-8 text file") from None
    return count + (last != b"\n")


def check_pair_files(source_path: str, target_path: str) -> None:
    """:func:`read_pairs`' checks of the line counts, reading no more than the line ends.

    Raises:
      DataError: as :func:`read_pairs` (a missing file, no lines, different line counts).
    """
    _check_line_counts(count_lines(source_path, "source"), count_lines(target_path, "target"), source_path,
                       target_path)


def _check_line_counts(source: int, target: int, source_path: str, target_path: str) -> None:
    for lines, path in ((source, source_path), (target, target_path)):
        if not lines:
            raise DataError(f"{path} holds no lines; pass a file with one example a line")
    if source != target:
        raise DataError(f"source_file {source_path} has {source} lines but target_file {target_path} has "
                        f"{target}; the files must be line-aligned (line i of one goes with line i of the "
                        "other)")


@dataclasses.dataclass
class PairReport:
    """What :func:`encode_pairs` kept and left out (1-based line numbers, the first few of each kind)."""

    kept: int = 0
    empty: int = 0
    too_long: int = 0
    empty_lines: List[int] = dataclasses.field(default_factory=list)
    too_long_lines: List[int] = dataclasses.field(default_factory=list)

    def summary(self, source: str = "") -> str:
        """One line for the log, e.g. ``kept 998 pairs; skipped 1 with an empty side (line 7), ...``."""
        def lines(numbers: List[int], count: int) -> str:
            shown = ", ".join(str(n) for n in numbers)
            return f" (line{'s' if count > 1 else ''} {shown}{', ...' if count > len(numbers) else ''})"

        parts = [f"kept {self.kept} pairs" + (f" of {source}" if source else "")]
        if self.empty:
            parts.append(f"skipped {self.empty} with an empty side{lines(self.empty_lines, self.empty)}")
        if self.too_long:
            parts.append(f"skipped {self.too_long} longer than the limits{lines(self.too_long_lines, self.too_long)}")
        return "; ".join(parts)


@dataclasses.dataclass
class Pairs:
    """Encoded pairs: ``source[i]`` and ``target[i]`` int32 id arrays, and what was left out."""

    source: Sequence[np.ndarray]
    target: Sequence[np.ndarray]
    report: PairReport

    def __len__(self) -> int:
        return len(self.source)

    def lengths(self) -> Tuple[np.ndarray, np.ndarray]:
        if isinstance(self.source, LineRows) and isinstance(self.target, LineRows):
            return self.source.lengths(), self.target.lengths()
        return (np.array([len(s) for s in self.source], np.int64), np.array([len(t) for t in self.target], np.int64))


class LineRows(collections.abc.Sequence):
    """Some lines of a file encoded line by line (:class:`lmkit.data.token_cache.LineIds`, memory-mapped):
    ``rows[i]`` is line ``index[i]``'s ids as int32, read when asked for."""

    def __init__(self, lines: Any, index: np.ndarray) -> None:
        self.lines, self.index = lines, np.asarray(index, np.int64)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> np.ndarray:  # type: ignore[override]
        return self.lines.line(int(self.index[i]))

    def lengths(self) -> np.ndarray:
        """int64: each row's number of ids."""
        return self.lines.lengths()[self.index]


_SHOWN = 5


def encode_pairs(source_lines: Sequence[str], target_lines: Sequence[str],
                 encode_source: Callable[[str], Sequence[int]], encode_target: Callable[[str], Sequence[int]], *,
                 max_source_length: int, max_target_length: int) -> Pairs:
    """Tokenizes line-aligned pairs; pairs with an empty side or over a limit are counted and left out.

    Args:
      source_lines, target_lines: as :func:`read_pairs` returns them.
      encode_source, encode_target: text -> ids (the same tokenizer's encode for a shared vocabulary).
      max_source_length, max_target_length: the most ids a side may have
        (the target's count includes the start and end tokens the model adds:
        pass the limit less those).

    Raises:
      DataError: different line counts, bad limits, or no pair left.
    """
    if len(source_lines) != len(target_lines):
        raise DataError(f"{len(source_lines)} source lines but {len(target_lines)} target lines; pairs must align")
    _check_limits(max_source_length, max_target_length)
    report = PairReport()
    source: List[np.ndarray] = []
    target: List[np.ndarray] = []
    for number, (s, t) in enumerate(zip(source_lines, target_lines), start=1):
        if not s.strip() or not t.strip():
            report.empty += 1
            if len(report.empty_lines) < _SHOWN:
                report.empty_lines.append(number)
            continue
        s_ids, t_ids = np.asarray(encode_source(s), np.int32), np.asarray(encode_target(t), np.int32)
        if len(s_ids) > max_source_length or len(t_ids) > max_target_length or not len(s_ids) or not len(t_ids):
            report.too_long += 1
            if len(report.too_long_lines) < _SHOWN:
                report.too_long_lines.append(number)
            continue
        source.append(s_ids)
        target.append(t_ids)
    report.kept = len(source)
    if not source:
        raise DataError(f"no pair is left ({report.summary()}); check the files or raise the length limits")
    return Pairs(source, target, report)


def pairs_from_lines(source: Any, target: Any, *, source_path: str, target_path: str, max_source_length: int,
                     max_target_length: int) -> Pairs:
    """:func:`encode_pairs` of two files encoded line by line (:func:`lmkit.data.token_cache.cached_lines`).

    The same pairs, report and errors as ``encode_pairs(*read_pairs(source_path, target_path), ...)``
    with the tokenizers that encoded the lines, computed on the line lengths; the pairs' ids
    stay in the (memory-mapped) cache files until a batch reads them.

    Args:
      source, target: :class:`~lmkit.data.token_cache.LineIds` of the two files.
      source_path, target_path: the files, for messages.
      max_source_length, max_target_length: as :func:`encode_pairs`.

    Raises:
      DataError: a file without lines, different line counts, bad limits, or no pair left.
    """
    _check_line_counts(source.lines, target.lines, source_path, target_path)
    _check_limits(max_source_length, max_target_length)
    source_lengths, target_lengths = source.lengths(), target.lengths()
    empty = (np.asarray(source.blank) != 0) | (np.asarray(target.blank) != 0)
    too_long = ~empty & ((source_lengths > max_source_length) | (target_lengths > max_target_length)
                         | (source_lengths == 0) | (target_lengths == 0))
    kept = np.flatnonzero(~empty & ~too_long)
    report = PairReport(kept=int(kept.size), empty=int(empty.sum()), too_long=int(too_long.sum()),
                        empty_lines=[int(k) + 1 for k in np.flatnonzero(empty)[:_SHOWN]],
                        too_long_lines=[int(k) + 1 for k in np.flatnonzero(too_long)[:_SHOWN]])
    if not kept.size:
        raise DataError(f"no pair is left ({report.summary()}); check the files or raise the length limits")
    return Pairs(LineRows(source, kept), LineRows(target, kept), report)


def _check_limits(max_source_length: int, max_target_length: int) -> None:
    for name, value in (("max_source_length", max_source_length), ("max_target_length", max_target_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DataError(f"{name} = {value!r} must be a positive integer")


def bucketed_batches(source_lengths: np.ndarray, target_lengths: np.ndarray, batch_size: int, *, epoch: int,
                     seed: int, pool_batches: int = 50) -> np.ndarray:
    """An epoch's global batches of pair indices, rows of similar lengths together: [num_batches, batch_size].

    Deterministic in ``(seed, epoch)``; ``len // batch_size`` full batches
    (the pairs left over rotate with the shuffle, so none is always out).

    Raises:
      DataError: a bad batch size, or fewer pairs than one batch.
    """
    check_shard(batch_size, 0, 1)
    source_lengths, target_lengths = np.asarray(source_lengths), np.asarray(target_lengths)
    count = len(source_lengths)
    if count < batch_size:
        raise DataError(f"{count} pairs make no batch of batch_size {batch_size}; use a smaller batch_size or "
                        "more pairs")
    if isinstance(pool_batches, bool) or not isinstance(pool_batches, int) or pool_batches < 1:
        raise DataError(f"pool_batches = {pool_batches!r} must be a positive integer")
    rng = np.random.default_rng([int(seed), int(epoch)])
    order = rng.permutation(count)[: count // batch_size * batch_size]
    pool = pool_batches * batch_size
    batches = []
    for start in range(0, len(order), pool):
        chunk = order[start:start + pool]
        # Stable sort by (source, target) length: the shuffle decides among equals.
        chunk = chunk[np.lexsort((target_lengths[chunk], source_lengths[chunk]))]
        batches.extend(chunk.reshape(-1, batch_size))
    batches = np.stack(batches)
    return batches[rng.permutation(len(batches))]


def shard_rows(batch: np.ndarray, rank: int, size: int) -> np.ndarray:
    """Rank ``rank`` of ``size``'s rows ``[rank*B/N, (rank+1)*B/N)`` of one global batch (any leading axis B)."""
    local = check_shard(len(batch), rank, size)
    return batch[rank * local:(rank + 1) * local]


def pad_rows(rows: Sequence[np.ndarray], pad_id: int, length: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """``(ids [len(rows), length] int32 padded with pad_id, lengths [len(rows)] int32)``; ``length`` defaults to
    the longest row's (a fixed length keeps one compiled shape)."""
    lengths = np.array([len(r) for r in rows], np.int32)
    width = int(lengths.max()) if length is None else int(length)
    if width < lengths.max():
        raise DataError(f"a row of {int(lengths.max())} ids does not fit length {width}")
    out = np.full([len(rows), width], pad_id, np.int32)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out, lengths


def padded_length(length: int, multiple: int = PAD_MULTIPLE) -> int:
    """The smallest bucket that holds ``length``: 8, 16, 24, 32, 48, 72, 112, 168, 256, ...

    Multiples of ``multiple`` up to ``4 * multiple``, then each bucket about 1.5
    times the one before (rounded up to a multiple of ``multiple``): few
    shapes for a compiled step (under XLA each one compiles once), and
    about a third of a padded row at most is padding.
    """
    bucket = multiple
    while bucket < length:
        bucket = bucket + multiple if bucket < 4 * multiple else -(-(bucket * 3 // 2) // multiple) * multiple
    return bucket


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """The target side's start (fed first), end (predicted last) and padding ids."""

    bos: int
    eos: int
    pad: int

    @classmethod
    def of(cls, tokenizer) -> "SpecialIds":
        """The tokenizer's ``bos_id``, ``eos_id`` and ``pad_id``.

        Raises:
          DataError: the tokenizer lacks one (naming it).
        """
        ids = {role: getattr(tokenizer, f"{role}_id", None) for role in ("bos", "eos", "pad")}
        missing = [role for role, value in ids.items() if value is None]
        if missing:
            raise DataError(f"the {getattr(tokenizer, 'name', type(tokenizer).__name__)} tokenizer has no "
                            f"{' or '.join(r + '_id' for r in missing)}; an encoder-decoder's targets need start, "
                            "end and padding ids: use the word, sentencepiece, char or byte tokenizer")
        return cls(**ids)


def _pair_arrays(pairs: Pairs, rows: np.ndarray, special: SpecialIds, source_length: int,
                 target_length: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """source, source mask, target inputs (bos + ids), target outputs (ids + eos), target mask of ``rows``."""
    source, source_lengths = pad_rows([pairs.source[j] for j in rows], special.pad, source_length)
    targets = [pairs.target[j] for j in rows]
    target_in, lengths = pad_rows([np.concatenate([[special.bos], t]) for t in targets], special.pad,
                                  target_length)
    target_out, _ = pad_rows([np.concatenate([t, [special.eos]]) for t in targets], special.pad, target_length)
    positions = np.arange(source_length)[np.newaxis]
    source_mask = positions < source_lengths[:, np.newaxis]
    target_mask = np.arange(target_length)[np.newaxis] < lengths[:, np.newaxis]
    return source, source_mask, target_in, target_out, target_mask


class PairBatches:
    """This rank's batches of one epoch of pairs: ``len()`` steps, ``[i]`` is ``(inputs, targets)``.

    ``inputs = (source [rows, S] int32, source_mask [rows, S] bool, target_inputs [rows, T] int32)``
    and ``targets = (target_outputs [rows, T] int32, weights [rows, T] float32)``, ``rows`` =
    ``batch_size / size``; ``S`` and ``T`` the global batch's longest source and target (plus
    one: the start or end id), rounded up to :data:`PAD_MULTIPLE`. The weights are the target
    mask times ``batch_size / tokens`` (``tokens``: the global batch's target positions), so
    the mean over rows of the weighted loss sum is the global batch's mean loss per token.

    Attributes:
      loss_tokens: 1: a step's loss is already per token (a language model's window sums
        ``num_steps`` of them).
      tokens_per_step: the mean number of target tokens of a global batch.
    """

    loss_tokens = 1

    def __init__(self, pairs: Pairs, batch_size: int, special: SpecialIds, *, epoch: int, seed: int,
                 rank: int = 0, size: int = 1, pool_batches: int = 50) -> None:
        """Args and errors: as :func:`bucketed_batches` and :func:`shard_rows`."""
        check_shard(batch_size, rank, size)
        self.pairs, self.special = pairs, special
        self.batch_size, self.rank, self.size = int(batch_size), int(rank), int(size)
        self.source_lengths, self.target_lengths = pairs.lengths()
        self.index = bucketed_batches(self.source_lengths, self.target_lengths, batch_size, epoch=epoch,
                                      seed=seed, pool_batches=pool_batches)
        self.tokens_per_step = float(np.mean(np.sum(self.target_lengths[self.index] + 1, axis=1)))

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> Tuple[Tuple[np.ndarray, np.ndarray, np.ndarray], Tuple[np.ndarray, np.ndarray]]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"batch {i} of {len(self)}")
        rows = self.index[i]  # the global batch: the same on every rank
        source_length = padded_length(self.source_lengths[rows].max())
        target_length = padded_length(self.target_lengths[rows].max() + 1)
        tokens = int(np.sum(self.target_lengths[rows] + 1))
        source, source_mask, target_in, target_out, target_mask = _pair_arrays(
            self.pairs, shard_rows(rows, self.rank, self.size), self.special, source_length, target_length)
        weights = target_mask.astype(np.float32) * np.float32(self.batch_size / tokens)
        return (source, source_mask, target_in), (target_out, weights)


def eval_pair_batches(pairs: Pairs, batch_size: int, special: SpecialIds):
    """Every pair once, ``batch_size`` rows at a time sorted by length, as ``(inputs, (outputs, mask))``.

    The mask is 1.0 at each target position (0 for padding); the last batch
    is filled up with copies of its first row, masked out entirely, so each
    batch has ``batch_size`` rows. Yields ``(inputs, targets)`` like
    :class:`PairBatches` with the plain mask as the weights: the weighted sum
    is a batch's total loss.
    """
    check_shard(batch_size, 0, 1)
    source_lengths, target_lengths = pairs.lengths()
    order = np.lexsort((target_lengths, source_lengths))
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        real = len(rows)
        rows = np.concatenate([rows, np.full(batch_size - real, rows[0])])
        source, source_mask, target_in, target_out, target_mask = _pair_arrays(
            pairs, rows, special, padded_length(source_lengths[rows].max()),
            padded_length(target_lengths[rows].max() + 1))
        target_mask[real:] = False
        yield (source, source_mask, target_in), (target_out, target_mask.astype(np.float32))
