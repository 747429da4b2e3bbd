"""Any text corpus, one sentence or paragraph a line: words or subwords -> ids.

Two tokenizers share one small interface (``encode(text) -> ids``,
``decode(ids) -> text``, ``vocab_size``, special ids, ``fingerprint()``):

* :class:`WordTokenizer`: whitespace-separated words through a :class:`Vocab`;
* :class:`SentencePieceTokenizer`: a SentencePiece model (unigram or BPE),
  trained and cached by :func:`train_sentencepiece`.

:class:`TextCorpus` turns files into id streams (for :func:`bptt_arrays`) or
one id array a line (for :func:`sentence_dataset`, which shuffles, buckets,
pads and shards sentences across workers).
"""

from __future__ import annotations

import hashlib
import os
from typing import Iterable, List, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from lmkit.data.batching import check_shard
from lmkit.data.errors import DataError
from lmkit.data.vocab import Vocab, read_lines

__all__ = [
    "WordTokenizer", "SentencePieceTokenizer", "train_sentencepiece", "TextCorpus",
    "sentence_dataset", "MODEL_TYPES",
]

MODEL_TYPES = ("unigram", "bpe")
# Ids given to the special pieces of models trained here.
SPM_UNK_ID, SPM_BOS_ID, SPM_EOS_ID, SPM_PAD_ID = 0, 1, 2, 3


def _import_sentencepiece():
    try:
        import sentencepiece
    except ImportError as exc:
        raise ImportError("subword tokenization needs the sentencepiece package: "
                          "pip install 'sentencepiece>=0.1.99'") from exc
    return sentencepiece


def _file_fingerprint(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


class WordTokenizer:
    """Whitespace-separated words mapped through a :class:`Vocab`."""

    def __init__(self, vocab: Vocab) -> None:
        """Args:
          vocab: the vocabulary; unknown words map to its ``unk_id``.
        """
        if not isinstance(vocab, Vocab):
            raise ValueError(f"vocab must be a Vocab, got {type(vocab).__name__}")
        self.vocab = vocab

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def unk_id(self) -> Optional[int]:
        return self.vocab.unk_id

    @property
    def eos_id(self) -> Optional[int]:
        return self.vocab.eos_id

    @property
    def bos_id(self) -> Optional[int]:
        return self.vocab.bos_id

    @property
    def pad_id(self) -> Optional[int]:
        return self.vocab.pad_id

    def encode(self, text: str) -> List[int]:
        """Ids of the words of ``text``."""
        return self.vocab.encode(text.split())

    def encode_batch(self, texts: Sequence[str]) -> List[List[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        """The words of ``ids`` joined by single spaces."""
        return " ".join(self.vocab.decode(ids))

    def fingerprint(self) -> str:
        return self.vocab.fingerprint()


class SentencePieceTokenizer:
    """A trained SentencePiece model (``.model`` file)."""

    def __init__(self, model_file: str) -> None:
        """Args:
          model_file: the ``.model`` file written by SentencePiece training.

        Raises:
          DataError: the file is missing or not a SentencePiece model.
        """
        spm = _import_sentencepiece()
        model_file = os.fspath(model_file)
        if not os.path.isfile(model_file):
            raise DataError(f"SentencePiece model {model_file!r} does not exist; train one with "
                            "train_sentencepiece")
        try:
            self._sp = spm.SentencePieceProcessor(model_file=model_file)
        except (RuntimeError, OSError) as exc:
            raise DataError(f"{model_file!r} is not a SentencePiece model ({exc}); "
                            "delete it and train again") from None
        self.model_file = model_file

    @property
    def vocab_size(self) -> int:
        return int(self._sp.get_piece_size())

    def __len__(self) -> int:
        return self.vocab_size

    @staticmethod
    def _maybe(value: int) -> Optional[int]:
        return None if value < 0 else int(value)  # SentencePiece says -1 for "disabled"

    @property
    def unk_id(self) -> Optional[int]:
        return self._maybe(self._sp.unk_id())

    @property
    def eos_id(self) -> Optional[int]:
        return self._maybe(self._sp.eos_id())

    @property
    def bos_id(self) -> Optional[int]:
        return self._maybe(self._sp.bos_id())

    @property
    def pad_id(self) -> Optional[int]:
        return self._maybe(self._sp.pad_id())

    def encode(self, text: str) -> List[int]:
        """Piece ids of ``text`` (no bos/eos added)."""
        return list(self._sp.encode(text, out_type=int))

    def encode_batch(self, texts: Sequence[str]) -> List[List[int]]:
        """Piece ids of many texts at once (faster than one by one)."""
        return [list(ids) for ids in self._sp.encode(list(texts), out_type=int)]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``; special pieces decode to nothing."""
        return self._sp.decode([int(i) for i in ids])

    def id_to_piece(self, token_id: int) -> str:
        return self._sp.id_to_piece(int(token_id))

    def piece_to_id(self, piece: str) -> int:
        return int(self._sp.piece_to_id(piece))

    def fingerprint(self) -> str:
        """A short hash of the model file, to check that all ranks agree."""
        return _file_fingerprint(self.model_file)


Tokenizer = Union[WordTokenizer, SentencePieceTokenizer]


def default_model_prefix(train_file: str, vocab_size: int, model_type: str) -> str:
    """``<data folder>/spm_cache/<file name>.<model_type><vocab_size>``."""
    folder = os.path.dirname(os.path.abspath(train_file))
    return os.path.join(folder, "spm_cache", f"{os.path.basename(train_file)}.{model_type}{vocab_size}")


def train_sentencepiece(train_file: str, vocab_size: int, model_prefix: Optional[str] = None,
                        model_type: str = "unigram", *, character_coverage: float = 1.0,
                        num_threads: int = 1, input_sentence_size: int = 0,
                        progress: bool = False) -> str:
    """Trains a SentencePiece model on ``train_file``, or reuses the cached one.

    The model is reused when ``<model_prefix>.model`` exists, is not older
    than ``train_file`` and has ``vocab_size`` pieces. Training writes to
    temporary names renamed into place, so a killed run leaves no broken
    cache. The pieces ``<unk>``, ``<s>``, ``</s>``, ``<pad>`` get ids 0-3. In
    a distributed job train on the chief only
    (``lmkit.dist.run_on_chief(lambda: train_sentencepiece(...))``).

    Args:
      train_file: UTF-8 text, one sentence or paragraph a line.
      vocab_size: number of pieces (specials included).
      model_prefix: where to write ``<prefix>.model`` and ``<prefix>.vocab``;
        default a ``spm_cache`` folder next to the data.
      model_type: ``"unigram"`` or ``"bpe"``.
      character_coverage: share of characters the model must cover (1.0
        for small alphabets, 0.9995 for CJK).
      num_threads: training threads (1 gives a reproducible model).
      input_sentence_size: train on at most this many lines (0 = all).
      progress: let SentencePiece log its training on stderr.

    Returns:
      The path of the ``.model`` file.

    Raises:
      ValueError: a bad ``vocab_size`` or ``model_type``.
      DataError: the training file is missing or training failed (e.g. a
        ``vocab_size`` too large for the corpus; the message gives the limit).
    """
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 5:
        raise ValueError(f"vocab_size = {vocab_size!r} must be an integer >= 5 "
                         "(4 special pieces plus at least one more)")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type = {model_type!r} is not one of {', '.join(MODEL_TYPES)}")
    train_file = os.fspath(train_file)
    if not os.path.isfile(train_file):
        raise DataError(f"training file {train_file!r} does not exist; check the path")
    prefix = os.fspath(model_prefix) if model_prefix else default_model_prefix(
        train_file, vocab_size, model_type)
    model_file = prefix + ".model"
    if _cache_is_fresh(model_file, train_file, vocab_size):
        return model_file
    spm = _import_sentencepiece()
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    temp_prefix = f"{prefix}.tmp{os.getpid()}"
    try:
        spm.SentencePieceTrainer.train(
            input=train_file, model_prefix=temp_prefix, vocab_size=vocab_size,
            model_type=model_type, character_coverage=character_coverage,
            unk_id=SPM_UNK_ID, bos_id=SPM_BOS_ID, eos_id=SPM_EOS_ID, pad_id=SPM_PAD_ID,
            num_threads=num_threads, input_sentence_size=input_sentence_size,
            shuffle_input_sentence=input_sentence_size > 0, minloglevel=0 if progress else 2)
        # The .model file is the cache key, so it is put in place last.
        os.replace(temp_prefix + ".vocab", prefix + ".vocab")
        os.replace(temp_prefix + ".model", model_file)
    except RuntimeError as exc:
        raise DataError(f"SentencePiece training on {train_file!r} with vocab_size {vocab_size} "
                        f"failed: {exc}") from None
    finally:
        for suffix in (".model", ".vocab"):
            if os.path.exists(temp_prefix + suffix):
                os.remove(temp_prefix + suffix)
    return model_file


def _cache_is_fresh(model_file: str, train_file: str, vocab_size: int) -> bool:
    if not os.path.isfile(model_file):
        return False
    if os.stat(model_file).st_mtime_ns < os.stat(train_file).st_mtime_ns:
        return False  # the data changed after the model was trained
    try:
        return SentencePieceTokenizer(model_file).vocab_size == vocab_size
    except DataError:
        return False


class TextCorpus:
    """Encodes text files (one sentence or paragraph a line) with a tokenizer.

    Blank lines are skipped. ``add_eos`` ends every line with the eos id
    (as PTB's newline), ``add_bos`` starts it with the bos id.

    Example::

        corpus = TextCorpus.subword("train.txt", vocab_size=8000)
        stream = corpus.encode_stream("train.txt")          # for bptt_arrays
        lines = corpus.encode_lines("train.txt")            # for sentence_dataset
    """

    def __init__(self, tokenizer: Tokenizer, *, add_bos: bool = False, add_eos: bool = True) -> None:
        """Args:
          tokenizer: a :class:`WordTokenizer` or :class:`SentencePieceTokenizer`.
          add_bos: start every line with the tokenizer's ``bos_id``.
          add_eos: end every line with the tokenizer's ``eos_id``.

        Raises:
          ValueError: ``add_bos``/``add_eos`` asked for but the tokenizer has
            no such id.
        """
        if add_bos and tokenizer.bos_id is None:
            raise ValueError("add_bos = True but the tokenizer has no bos token; "
                             "set add_bos = False or build the vocabulary with bos_token")
        if add_eos and tokenizer.eos_id is None:
            raise ValueError("add_eos = True but the tokenizer has no eos token; "
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
        return cls(WordTokenizer(vocab), add_bos=add_bos, add_eos=add_eos)

    @classmethod
    def subword(cls, train_file: str, vocab_size: int, *, model_type: str = "unigram",
                model_prefix: Optional[str] = None, add_bos: bool = False,
                add_eos: bool = True) -> "TextCorpus":
        """A corpus of SentencePiece pieces trained (or cached) on ``train_file``."""
        model = train_sentencepiece(train_file, vocab_size, model_prefix, model_type)
        return cls(SentencePieceTokenizer(model), add_bos=add_bos, add_eos=add_eos)

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


def sentence_dataset(ids_per_line: Sequence[Sequence[int]], batch_size: int, rank: int = 0,
                     size: int = 1, shuffle: bool = True, seed: int = 0,
                     bucket_boundaries: Optional[Sequence[int]] = None, pad_id: int = 0, *,
                     epoch: int = 0, max_length: Optional[int] = None,
                     drop_remainder: bool = True, prefetch: int = 2) -> tf.data.Dataset:
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
      shuffle: shuffle the lines (a new order for every ``epoch``).
      seed: shuffle seed; the same on every rank.
      bucket_boundaries: increasing lengths; lines are batched with others
        of their length bucket (``[b_{i-1}, b_i)``) to waste less padding.
        None batches lines in (shuffled) order.
      pad_id: the id that fills rows up to the longest line of the batch.
      epoch: the epoch number, which selects the shuffle order.
      max_length: cut longer lines to this many ids; None keeps them whole.
      drop_remainder: drop a last global batch (per bucket) with fewer than
        ``batch_size`` lines; must be True when ``size > 1``, so that all
        ranks get equal batches.
      prefetch: batches to prepare ahead.

    Returns:
      A dataset of ``(ids [batch_size // size, max_len] int32,
      lengths [batch_size // size] int32)``.

    Raises:
      DataError: a bad shard, an empty or non-integer line list, bad bucket
        boundaries, or ``drop_remainder=False`` with several workers.
    """
    per_rank = check_shard(batch_size, rank, size)
    if size > 1 and not drop_remainder:
        raise DataError(f"drop_remainder = False with {size} workers would give the ranks "
                        "unequal last batches; use drop_remainder = True")
    if max_length is not None and max_length < 1:
        raise DataError(f"max_length = {max_length} must be >= 1 or None")
    lines = []
    for i, line in enumerate(ids_per_line):
        array = np.asarray(line)
        if array.ndim != 1 or not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
            raise DataError(f"ids_per_line[{i}] must be a 1-D integer sequence, got shape "
                            f"{array.shape} dtype {array.dtype}")
        lines.append(array[:max_length] if max_length is not None else array)
    if not lines:
        raise DataError("ids_per_line is empty; give at least one line")
    if drop_remainder and bucket_boundaries is None and len(lines) < batch_size:
        raise DataError(f"{len(lines)} lines are too few for one batch of batch_size "
                        f"{batch_size}; use a smaller batch_size")
    if bucket_boundaries is not None:
        bounds = [int(b) for b in bucket_boundaries]
        if not bounds or any(b < 1 for b in bounds) or any(a >= b for a, b in zip(bounds, bounds[1:])):
            raise DataError(f"bucket_boundaries = {list(bucket_boundaries)} must be a non-empty, "
                            "strictly increasing list of positive lengths")

    order = np.arange(len(lines))
    if shuffle:
        order = np.random.default_rng([int(seed), int(epoch)]).permutation(len(lines))
    lengths = np.array([lines[i].size for i in order], dtype=np.int64)
    values = np.concatenate([lines[i] for i in order]).astype(np.int32)
    splits = np.concatenate([[0], np.cumsum(lengths)])
    ragged = tf.RaggedTensor.from_row_splits(values, splits)
    dataset = tf.data.Dataset.from_tensor_slices(ragged)
    # Each element is a 1-D tensor; pair it with its length for padding/bucketing.
    dataset = dataset.map(lambda ids: (tf.ensure_shape(ids, [None]), tf.size(ids, out_type=tf.int32)))
    padding = (tf.constant(pad_id, tf.int32), tf.constant(0, tf.int32))
    if bucket_boundaries is None:
        dataset = dataset.padded_batch(batch_size, padded_shapes=([None], []), padding_values=padding,
                                       drop_remainder=drop_remainder)
    else:
        dataset = dataset.bucket_by_sequence_length(
            element_length_func=lambda ids, length: length, bucket_boundaries=bounds,
            bucket_batch_sizes=[batch_size] * (len(bounds) + 1), padded_shapes=([None], []),
            padding_values=padding, drop_remainder=drop_remainder)
    if size > 1:
        start, stop = rank * per_rank, (rank + 1) * per_rank
        dataset = dataset.map(lambda ids, length: (ids[start:stop], length[start:stop]))  # [B/N, T]
    return dataset.prefetch(prefetch)
