"""Any text corpus, one sentence or paragraph a line: text files -> id streams.

* :func:`load_text_data` checks the train/valid/test files
  (:func:`~lmkit.data.textfile.check_text_file`), encodes them with a
  tokenizer of :mod:`lmkit.data.tokenizers` into int32 id streams (an eos id
  after every line) and counts their words, for perplexity per word;
* :class:`TextCorpus` turns text into id streams (for :func:`bptt_arrays` or
  :func:`~lmkit.data.windows.window_arrays`) or one id array a line (for
  :func:`sentence_dataset`, which shuffles, buckets, pads and shards
  sentences across workers).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from lmkit.core.fileio import PathLike
from lmkit.data.batching import check_shard
from lmkit.data.errors import DataError
from lmkit.data.sentencepiece import SentencePieceTokenizer, train_sentencepiece
from lmkit.data.textfile import check_text_file, count_words
from lmkit.data.tokenizers import Tokenizer, WordTokenizer
from lmkit.data.vocab import Vocab, read_lines

__all__ = ["TextCorpus", "TextData", "load_text_data", "sentence_dataset", "LineBatching"]

SPLITS = ("train", "valid", "test")


class TextCorpus:
    """Encodes text files (one sentence or paragraph a line) with a tokenizer.

    Blank lines are skipped. ``add_eos`` ends every line with the eos id
    (as PTB's newline), ``add_bos`` starts it with the bos id.

    Example::

        corpus = TextCorpus(train_tokenizer("sentencepiece", "train.txt", "run",
                                            vocab_size=8000))
        stream = corpus.encode_stream("train.txt")          # for bptt_arrays
        lines = corpus.encode_lines("train.txt")            # for sentence_dataset
    """

    def __init__(self, tokenizer: Tokenizer, *, add_bos: bool = False, add_eos: bool = True) -> None:
        """Args:
          tokenizer: any :class:`~lmkit.data.tokenizers.Tokenizer`.
          add_bos: start every line with the tokenizer's ``bos_id``.
          add_eos: end every line with the tokenizer's ``eos_id``.

        Raises:
          DataError: ``add_bos``/``add_eos`` asked for but the tokenizer has
            no such id.
        """
        if add_bos and tokenizer.bos_id is None:
            raise DataError("add_bos = True but the tokenizer has no bos token; "
                            "set add_bos = False or build the vocabulary with bos_token")
        if add_eos and tokenizer.eos_id is None:
            raise DataError("add_eos = True but the tokenizer has no eos token; "
                            "set add_eos = False or build the vocabulary with eos_token")
        self.tokenizer = tokenizer
        self.add_bos = add_bos
        self.add_eos = add_eos

    @classmethod
    def word_level(cls, train_file: str, *, max_size: Optional[int] = None, min_count: int = 1,
                   add_bos: bool = False, add_eos: bool = True) -> "TextCorpus":
        """A corpus of words, with a :class:`Vocab` (``<unk> <eos> <bos> <pad>`` first)
        built from ``train_file``."""
        vocab = Vocab.build(train_file, max_size=max_size, min_count=min_count)
        return cls(WordTokenizer(vocab, max_vocab=max_size, min_count=min_count), add_bos=add_bos,
                   add_eos=add_eos)

    @classmethod
    def subword(cls, train_file: str, vocab_size: int, *, model_prefix: PathLike,
                model_type: str = "unigram", add_bos: bool = False,
                add_eos: bool = True) -> "TextCorpus":
        """A corpus of SentencePiece pieces trained on ``train_file`` (or reused) at
        ``model_prefix``, a path in the model folder."""
        model = train_sentencepiece(train_file, vocab_size, model_prefix, model_type)
        return cls(SentencePieceTokenizer(model, model_type=model_type), add_bos=add_bos,
                   add_eos=add_eos)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def encode_text_lines(self, lines: Iterable[str]) -> List[np.ndarray]:
        """One int32 id array for each non-blank line, with bos/eos as configured."""
        texts = [line for line in lines if line.strip()]
        head = [self.tokenizer.bos_id] if self.add_bos else []
        tail = [self.tokenizer.eos_id] if self.add_eos else []
        return [np.asarray(head + ids + tail, dtype=np.int32)
                for ids in self.tokenizer.encode_batch(texts)]

    def encode_lines(self, path: str) -> List[np.ndarray]:
        """One int32 id array for each non-blank line of the file.

        Raises:
          DataError: the file is missing, not UTF-8 or has no text.
        """
        encoded = self.encode_text_lines(read_lines(path))
        if not encoded:
            raise DataError(f"text file {os.fspath(path)!r} is empty (no non-blank line); "
                            "check the path and the file")
        return encoded

    def encode_stream(self, path: str) -> np.ndarray:
        """All lines of the file as one int32 id stream (for :func:`bptt_arrays`)."""
        return np.concatenate(self.encode_lines(path)).astype(np.int32, copy=False)


@dataclass(eq=False)
class TextData:
    """The splits of a text corpus as int32 id streams, with their word counts.

    Perplexity per word of a split is ``exp(total NLL of its stream / its
    words)``: the same total as perplexity per token, divided by a count that
    does not depend on the tokenizer, so runs with word, sentencepiece, char
    and byte tokenizers compare. ``words`` counts the whitespace-separated
    words of the text plus one per non-blank line when the stream ends lines
    with an eos id (that eos is predicted too; PTB counts it as the word
    ``<eos>``), so for the word tokenizer the two perplexities are equal.

    Attributes:
      tokenizer: the tokenizer that made the streams.
      train: the ids of the training text, eos after every non-blank line
        (int32, or a memory-mapped uint16/uint32 array from the data cache).
      valid: the validation stream, or None when no file was given.
      test: the test stream, or None.
      train_words: the words of the training text (see above).
      valid_words: the words of the validation text, or None.
      test_words: the words of the test text, or None.
    """

    tokenizer: Tokenizer
    train: np.ndarray
    valid: Optional[np.ndarray]
    test: Optional[np.ndarray]
    train_words: int
    valid_words: Optional[int]
    test_words: Optional[int]

    def splits(self) -> Iterator[Tuple[str, np.ndarray, int]]:
        """``(name, ids, words)`` of each split present, in the order train, valid, test."""
        for name in SPLITS:
            ids = getattr(self, name)
            if ids is not None:
                yield name, ids, getattr(self, f"{name}_words")


def load_text_data(tokenizer: Tokenizer, train_file: Union[PathLike, Sequence[PathLike]],
                   valid_file: Optional[Union[PathLike, Sequence[PathLike]]] = None,
                   test_file: Optional[Union[PathLike, Sequence[PathLike]]] = None, *,
                   cache_dir: Optional[str] = None, workers: Optional[int] = None,
                   log: Callable[[str], None] = lambda line: None,
                   names: Optional[Mapping[str, str]] = None, text_field: str = "text",
                   text_column: str = "text") -> TextData:
    """Checks and encodes the text files of a corpus.

    Every non-blank line is encoded and followed by the tokenizer's eos id
    (when it has one), as PTB does with newlines; blank lines are skipped.

    Args:
      tokenizer: any :class:`~lmkit.data.tokenizers.Tokenizer`.
      train_file: UTF-8 text, one sentence or paragraph a line, or a
        source of another format (JSON Lines, Parquet, a ``datasets`` folder,
        compressed text: :mod:`lmkit.data.formats`, one document a record):
        a file, a folder, a glob pattern, several of them separated by
        commas, or a list (:func:`~lmkit.data.sources.resolve_sources`); the
        files are read in sorted order.
      valid_file, test_file: the validation and test text, or None.
      cache_dir: a data cache folder (:func:`~lmkit.data.token_cache.cache_root`):
        each split is encoded once into it, in parallel, and memory-mapped
        (later calls with the same files and tokenizer only map it). None
        encodes into memory, in this process.
      workers: encoding processes for the cache (None: one per core for large texts).
      log: where the cache's progress lines go.
      names: what messages call a split's files (``{"train": "--text_file"}``);
        default ``train_file``, ``valid_file``, ``test_file``.
      text_field: JSON Lines: the field of a record that holds its text.
      text_column: Parquet and ``datasets`` folders: the column that holds the text
        (a ``DatasetDict`` folder gives each split its own: train, validation, test).

    Returns:
      A :class:`TextData`; with a cache its streams are read-only
      ``numpy.memmap`` arrays of uint16 (or uint32) ids, else int32 arrays.

    Raises:
      DataError: a file is missing, a folder without files, empty, binary or
        not UTF-8, or a pattern matches nothing (naming it as ``train_file``,
        ``valid_file`` or ``test_file``); a broken cache folder.
    """
    from lmkit.data.formats import DATASET_SPLITS, documents_for
    from lmkit.data.sources import resolve_sources

    add_eos = tokenizer.eos_id is not None
    corpus = TextCorpus(tokenizer, add_eos=add_eos)
    streams: Dict[str, Optional[np.ndarray]] = {}
    words: Dict[str, Optional[int]] = {}
    for name, spec in zip(SPLITS, (train_file, valid_file, test_file)):
        if spec is None or (isinstance(spec, (str, os.PathLike)) and not os.fspath(spec)):
            streams[name] = words[name] = None
            continue
        what = (names or {}).get(name, f"{name}_file")
        files = documents_for(tokenizer, resolve_sources(spec, what, text_field=text_field,
                                                         text_column=text_column, dataset_split=DATASET_SPLITS[name]))
        streams[name], words[name] = _encode_split(corpus, files, what, cache_dir, workers, log)
    return TextData(tokenizer=tokenizer, train=streams["train"], valid=streams["valid"],
                    test=streams["test"], train_words=words["train"],
                    valid_words=words["valid"], test_words=words["test"])


def _encode_split(corpus: TextCorpus, files: Sequence[str], what: str, cache_dir: Optional[str],
                  workers: Optional[int], log: Callable[[str], None]) -> Tuple[np.ndarray, int]:
    """``(ids, words)`` of a split's ``files``: from the data cache (encoded into it first when not there), or
    checked and encoded here as int32 (blank lines skipped)."""
    if cache_dir is not None:
        from lmkit.data.token_cache import cached_stream
        stream = cached_stream(cache_dir, corpus.tokenizer, files, corpus.add_eos, what=what, workers=workers,
                               log=log)
        return stream.ids, stream.words
    from lmkit.data.formats import text_lines

    for path in files:
        check_text_file(path, what)
    lines = [line for path in files for line in text_lines(path, what) if line.strip()]
    ids = np.concatenate(corpus.encode_text_lines(lines)).astype(np.int32, copy=False)
    return ids, count_words(lines, line_ends=corpus.add_eos,
                            document_end=getattr(corpus.tokenizer, "document_end", None))


def _checked_lines(ids_per_line: Sequence[Sequence[int]], max_length: Optional[int]) -> List[np.ndarray]:
    """The lines as 1-D integer arrays cut to ``max_length``; a :class:`DataError` names a bad one."""
    lines = []
    for i, line in enumerate(ids_per_line):
        array = np.asarray(line)
        if array.ndim != 1 or not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
            raise DataError(f"ids_per_line[{i}] must be a 1-D integer sequence, got shape "
                            f"{array.shape} dtype {array.dtype}")
        lines.append(array[:max_length] if max_length is not None else array)
    if not lines:
        raise DataError("ids_per_line is empty; give at least one line")
    return lines


def _checked_bounds(bucket_boundaries: Optional[Sequence[int]]) -> Optional[List[int]]:
    """``bucket_boundaries`` as ints, checked to be positive and strictly increasing (None stays None)."""
    if bucket_boundaries is None:
        return None
    bounds = [int(b) for b in bucket_boundaries]
    if not bounds or any(b < 1 for b in bounds) or any(a >= b for a, b in zip(bounds, bounds[1:])):
        raise DataError(f"bucket_boundaries = {list(bucket_boundaries)} must be a non-empty, "
                        "strictly increasing list of positive lengths")
    return bounds


@dataclass(frozen=True)
class LineBatching:
    """How :func:`sentence_dataset` orders, groups and pads lines (the same on every rank).

    Attributes:
      shuffle: shuffle the lines (a new order for every epoch).
      seed: shuffle seed; the same on every rank.
      bucket_boundaries: increasing lengths; lines are batched with others
        of their length bucket (``[b_{i-1}, b_i)``) to waste less padding.
        None batches lines in (shuffled) order.
      pad_id: the id that fills rows up to the longest line of the batch.
      max_length: cut longer lines to this many ids; None keeps them whole.
      drop_remainder: drop a last global batch (per bucket) with fewer than
        ``batch_size`` lines; must be True with several workers, so that all
        ranks get equal batches.
      prefetch: batches to prepare ahead.
    """

    shuffle: bool = True
    seed: int = 0
    bucket_boundaries: Optional[Sequence[int]] = None
    pad_id: int = 0
    max_length: Optional[int] = None
    drop_remainder: bool = True
    prefetch: int = 2


def sentence_dataset(ids_per_line: Sequence[Sequence[int]], batch_size: int, rank: int = 0, size: int = 1, *,
                     epoch: int = 0, batching: LineBatching = LineBatching()) -> tf.data.Dataset:
    """Padded batches of whole lines, this worker's share of each global batch.

    Every rank builds the same sequence of global batches (the shuffle is a
    NumPy permutation seeded by ``(seed, epoch)``, independent of TensorFlow's
    random seeds, which may differ between ranks) and keeps rows
    ``[rank*B/N, (rank+1)*B/N)`` of each; all ranks therefore see the same
    padded length.

    Args:
      ids_per_line: one 1-D integer sequence per line (:meth:`TextCorpus.encode_lines`).
      batch_size: the GLOBAL batch size, a multiple of ``size``.
      rank: this worker, in ``[0, size)``.
      size: the number of workers.
      epoch: the epoch number, which selects the shuffle order.
      batching: the order, buckets and padding (:class:`LineBatching`).

    Returns:
      A dataset of ``(ids [batch_size // size, max_len] int32,
      lengths [batch_size // size] int32)``.

    Raises:
      DataError: a bad shard, an empty or non-integer line list, bad bucket
        boundaries, or ``drop_remainder=False`` with several workers.
    """
    per_rank = check_shard(batch_size, rank, size)
    if size > 1 and not batching.drop_remainder:
        raise DataError(f"drop_remainder = False with {size} workers would give the ranks "
                        "unequal last batches; use drop_remainder = True")
    if batching.max_length is not None and batching.max_length < 1:
        raise DataError(f"max_length = {batching.max_length} must be >= 1 or None")
    lines = _checked_lines(ids_per_line, batching.max_length)
    if batching.drop_remainder and batching.bucket_boundaries is None and len(lines) < batch_size:
        raise DataError(f"{len(lines)} lines are too few for one batch of batch_size "
                        f"{batch_size}; use a smaller batch_size")
    bounds = _checked_bounds(batching.bucket_boundaries)
    dataset = _padded_batches(_lines_in_order(lines, batching, epoch), batch_size, bounds, batching)
    if size > 1:
        start, stop = rank * per_rank, (rank + 1) * per_rank
        dataset = dataset.map(lambda ids, length: (ids[start:stop], length[start:stop]))  # [B/N, T]
    return dataset.prefetch(batching.prefetch)


def _lines_in_order(lines: List[np.ndarray], batching: LineBatching, epoch: int) -> tf.data.Dataset:
    """``(ids [len], len)`` of each line, in the epoch's (seeded) order."""
    order = np.arange(len(lines))
    if batching.shuffle:
        order = np.random.default_rng([int(batching.seed), int(epoch)]).permutation(len(lines))
    lengths = np.array([lines[i].size for i in order], dtype=np.int64)
    values = np.concatenate([lines[i] for i in order]).astype(np.int32)
    ragged = tf.RaggedTensor.from_row_splits(values, np.concatenate([[0], np.cumsum(lengths)]))
    # Each element is a 1-D tensor; pair it with its length for padding/bucketing.
    return tf.data.Dataset.from_tensor_slices(ragged).map(
        lambda ids: (tf.ensure_shape(ids, [None]), tf.size(ids, out_type=tf.int32)))


def _padded_batches(dataset: tf.data.Dataset, batch_size: int, bounds: Optional[List[int]],
                    batching: LineBatching) -> tf.data.Dataset:
    """Global batches of ``batch_size`` lines padded to their longest, within a length bucket when ``bounds``."""
    padding = (tf.constant(batching.pad_id, tf.int32), tf.constant(0, tf.int32))
    if bounds is None:
        return dataset.padded_batch(batch_size, padded_shapes=([None], []), padding_values=padding,
                                    drop_remainder=batching.drop_remainder)
    return dataset.bucket_by_sequence_length(
        element_length_func=lambda ids, length: length, bucket_boundaries=bounds,
        bucket_batch_sizes=[batch_size] * (len(bounds) + 1), padded_shapes=([None], []),
        padding_values=padding, drop_remainder=batching.drop_remainder)
