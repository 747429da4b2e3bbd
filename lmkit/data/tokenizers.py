"""Tokenizers: text <-> ids, four kinds in one registry, saved in the model folder.

Every tokenizer is a :class:`Tokenizer`: ``encode(text) -> ids``,
``decode(ids) -> text``, ``vocab_size``, the special ids (``unk_id``,
``eos_id``, ``bos_id``, ``pad_id``, each None when absent), ``fingerprint()``
and ``save(folder)``. The kinds, by registry name (:data:`TOKENIZERS`):

* ``word``: whitespace-separated words through a :class:`Vocab`
  (options ``max_vocab``, ``min_count``), file ``vocab.txt``;
* ``sentencepiece`` (:mod:`lmkit.data.sentencepiece`): a SentencePiece
  model, ``model_type`` unigram or BPE, ``vocab_size`` pieces, files
  ``spm.model`` and ``spm.vocab``;
* ``char``: the Unicode characters of the training text, file ``chars.txt``;
* ``byte``: the 256 byte values of UTF-8, no training and no file;
* ``hf`` (:mod:`lmkit.hub.tokenizer`): the tokenizer of a pretrained
  Hugging Face model (GPT-2's byte-level BPE), read with the ``tokenizers``
  package from the folder ``--init_from`` names, file ``hf_tokenizer.json``;
  ``hf:<folder or Hub name>`` (:data:`PRETRAINED_PREFIX`) reads it from that
  folder or downloads it, for a model trained from scratch.

The first four have the special symbols unknown, end and start of sentence, and
padding (``<unk> <eos> <bos> <pad>``; SentencePiece calls the middle two
``</s>`` and ``<s>``). A line break in the text is the end-of-sentence id,
both ways: ``encode`` turns ``"\\n"`` into ``eos_id``, ``decode`` turns
``eos_id`` back into ``"\\n"`` and drops ``bos_id`` and ``pad_id``, so
``decode(encode(text))`` gives readable text.

:func:`train_tokenizer` trains one into a folder (the model folder, never
next to the user's data) or reuses the one saved there;
:func:`load_tokenizer` reads it back. ``folder/tokenizer.json`` names the
kind, its options, its size and its fingerprint, and is written last: a
folder without it holds no tokenizer, whatever else a killed save left.

Adding a kind is one :class:`Tokenizer` subclass plus one line in
:data:`TOKENIZERS`.
"""

from __future__ import annotations

import abc
import collections
import hashlib
import json
import os
import shutil
from typing import TYPE_CHECKING, Any, ClassVar, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Type, Union

from lmkit.core.checks import check_choice, check_known_keys
from lmkit.core.errors import UsageError
from lmkit.core.fileio import PathLike, atomic_write_text, fsync_dir
from lmkit.core.registry import import_object
from lmkit.data.errors import DataError
from lmkit.data.textfile import check_text_file, source_identity, text_pieces
from lmkit.data.vocab import DEFAULT_SPECIALS, Vocab

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

__all__ = [
    "Tokenizer", "WordTokenizer", "CharTokenizer", "ByteTokenizer", "TOKENIZERS", "TOKENIZER_FILE",
    "tokenizer_class", "train_tokenizer", "load_tokenizer", "tokenizer_of_run", "check_vocabulary",
    "PRETRAINED_PREFIX", "split_tokenizer",
]

TOKENIZER_FILE = "tokenizer.json"
# The special symbols' roles, in the order of DEFAULT_SPECIALS.
_ROLES = ("unk", "eos", "bos", "pad")
# The smallest vocabulary worth having: the four specials and one symbol.
_MIN_VOCAB = len(DEFAULT_SPECIALS) + 1


def _short_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _check_size(name: str, value: Any, fix: str) -> int:
    """``value`` as an int >= 5 (the four specials and one more symbol)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < _MIN_VOCAB:
        raise DataError(f"{name} = {value!r} must be an integer >= {_MIN_VOCAB} (the 4 special "
                        f"tokens plus at least one more); {fix}")
    return value


class Tokenizer(abc.ABC):
    """Text <-> ids; the one interface every tokenizer kind follows.

    Subclasses implement the per-line mapping (:meth:`_encode_line`,
    :meth:`_decode_line`), the special ids (:meth:`_special_id`),
    :meth:`fingerprint`, their ``options``, their files (:meth:`_write_files`)
    and the class methods :meth:`train` and :meth:`load`. Line breaks, the id
    range check and the ``tokenizer.json`` bookkeeping live here, once.
    """

    #: The registry key (``tokenizer.json`` stores it).
    name: ClassVar[str] = ""
    #: The training options of this kind and their defaults.
    OPTIONS: ClassVar[Mapping[str, Any]] = {}
    #: Options read from what the tokenizer is made from (a pretrained folder), never asked for: a
    #: tokenizer saved in a run's folder is reused whatever they hold.
    DERIVED: ClassVar[Tuple[str, ...]] = ()
    #: Raised when training with the same options starts giving another tokenizer, so that the data cache
    #: trains a new one instead of reusing what an older lmkit trained.
    VERSION: ClassVar[int] = 0
    #: Whether :meth:`train` reads the training text (checked before training).
    READS_TEXT: ClassVar[bool] = True

    # -- the vocabulary ---------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of ids (the model's output size)."""

    @abc.abstractmethod
    def _special_id(self, role: str) -> Optional[int]:
        """The id of the special symbol ``role`` (``unk``, ``eos``, ``bos``, ``pad``), or None."""

    @property
    def unk_id(self) -> Optional[int]:
        """Id of the unknown symbol, or None."""
        return self._special_id("unk")

    @property
    def eos_id(self) -> Optional[int]:
        """Id of the end of a sentence (a line break), or None."""
        return self._special_id("eos")

    @property
    def bos_id(self) -> Optional[int]:
        """Id of the start of a sentence, or None."""
        return self._special_id("bos")

    @property
    def pad_id(self) -> Optional[int]:
        """Id of the padding symbol, or None."""
        return self._special_id("pad")

    @property
    def document_end(self) -> Optional[str]:
        """The text (one id) that ends each document of a source of records (JSON Lines, Parquet,
        ``datasets``) instead of a line break, or None: lmkit's own kinds end a document with
        ``eos_id`` as a line (:func:`lmkit.data.formats.documents_for`)."""
        return None

    @property
    @abc.abstractmethod
    def options(self) -> Dict[str, Any]:
        """The training options this tokenizer was made with (keys of ``OPTIONS``)."""

    @abc.abstractmethod
    def fingerprint(self) -> str:
        """A short hash of everything that decides the ids, to check that ranks and runs agree."""

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, options={self.options})"

    # -- text <-> ids -----------------------------------------------------------------------------
    @abc.abstractmethod
    def _encode_line(self, line: str) -> List[int]:
        """Ids of one line of text (no line break in it)."""

    @abc.abstractmethod
    def _decode_line(self, ids: List[int]) -> str:
        """Text of the ids of one line (no eos, bos or pad among them)."""

    def encode(self, text: str) -> List[int]:
        """Ids of ``text``; a line break (``\\n`` or ``\\r\\n``) becomes ``eos_id``.

        No eos is added at the end and no bos at the start.

        Raises:
          DataError: ``text`` is not a string.
        """
        if not isinstance(text, str):
            raise DataError(f"encode takes a str, got {type(text).__name__}; "
                            "decode bytes with .decode('utf-8') first")
        eos = self.eos_id
        if eos is None:
            return self._encode_line(text)
        ids: List[int] = []
        for k, line in enumerate(text.split("\n")):
            if k:
                ids.append(eos)
            ids.extend(self._encode_line(line[:-1] if line.endswith("\r") else line))
        return ids

    def save_hf(self, folder: str, model_max_length: int) -> None:
        """Writes the tokenizer as ``transformers.AutoTokenizer`` reads it (``tokenizer.json`` and its
        config; :mod:`lmkit.data.hf_form`): every text gets the ids :meth:`encode` gives it.

        Raises:
          DataError: a kind that has no such form (BPE SentencePiece), naming those that have.
        """
        from lmkit.data.hf_form import save_form
        save_form(self, folder, model_max_length)

    def model_token_ids(self) -> Dict[str, Any]:
        """The start, end and padding ids (``bos_token_id``, ``eos_token_id``, ``pad_token_id``) that an export
        writes into ``config.json`` and ``generation_config.json`` for a model trained with this tokenizer
        (:func:`lmkit.data.hf_form.model_token_ids`).

        Raises:
          DataError: a kind that has no Hugging Face form, before anything is written.
        """
        from lmkit.data.hf_form import model_token_ids
        return model_token_ids(self)

    def source_side(self) -> "Tokenizer":
        """The tokenizer an encoder-decoder's sources are encoded with when both sides share it: itself,
        unless a kind frames sources apart (a BART folder's, see
        :meth:`lmkit.hub.tokenizer.HFTokenizer.source_side`)."""
        return self

    def encode_batch(self, texts: Sequence[str]) -> List[List[int]]:
        """``[encode(t) for t in texts]`` (a kind may do it faster)."""
        return [self.encode(t) for t in texts]

    def encode_lines_flat(self, lines: Sequence[str], add_eos: bool) -> Optional["np.ndarray"]:
        """All ``lines`` (none with a line break) as one id array, ``eos_id`` after each when
        ``add_eos``; None when this kind has no faster way than :meth:`encode_batch` (the data
        cache's encoder then uses that)."""
        return None

    def decode(self, ids: Iterable[int]) -> str:
        """Readable text of ``ids``: ``eos_id`` is a line break, ``bos_id`` and ``pad_id`` vanish.

        Raises:
          DataError: an id outside ``[0, vocab_size)``.
        """
        ids = [int(i) for i in ids]
        size = self.vocab_size
        bad = next((i for i in ids if not 0 <= i < size), None)
        if bad is not None:
            raise DataError(f"id {bad} is out of range for the {self.name} tokenizer of "
                            f"{size} ids (valid ids are 0..{size - 1}); the ids come from "
                            "another tokenizer or model")
        eos = self.eos_id
        dropped = {self.bos_id, self.pad_id} - {None}
        lines: List[List[int]] = [[]]
        for i in ids:
            if i == eos:
                lines.append([])
            elif i not in dropped:
                lines[-1].append(i)
        return "\n".join(self._decode_line(line) for line in lines)

    # -- files ------------------------------------------------------------------------------------
    @abc.abstractmethod
    def _write_files(self, folder: str) -> None:
        """Writes this kind's own files into ``folder``, each atomically."""

    def save(self, folder: PathLike) -> None:
        """Writes this tokenizer into ``folder`` (created when missing).

        An old ``tokenizer.json`` is removed first and the new one written
        last, each file atomically, so a save that is killed half-way leaves
        a folder without a tokenizer, never a ``tokenizer.json`` that
        describes other files.

        Args:
          folder: the model folder.
        """
        folder = os.fspath(folder)
        os.makedirs(folder, exist_ok=True)
        meta = os.path.join(folder, TOKENIZER_FILE)
        if os.path.exists(meta):
            os.remove(meta)
            fsync_dir(folder)
        self._write_files(folder)
        record = {"name": self.name, "options": self.options, "vocab_size": self.vocab_size,
                  "fingerprint": self.fingerprint()}
        atomic_write_text(meta, json.dumps(record, indent=2, sort_keys=True) + "\n")
        fsync_dir(folder)

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> Dict[str, Any]:
        """Returns the options of this kind, defaults filled in, after checking them.

        Options a kind does not take are ignored, so one call can pass every
        flag to any kind.

        Raises:
          DataError: a bad option value (naming it and the fix).
        """
        return {key: options.get(key, default) for key, default in cls.OPTIONS.items()}

    @classmethod
    @abc.abstractmethod
    def train(cls, train_file: Sequence[str], folder: str, **options: Any) -> "Tokenizer":
        """Trains on the files ``train_file`` (checked beforehand); may write into ``folder``, never elsewhere."""

    @classmethod
    @abc.abstractmethod
    def load(cls, folder: str, options: Mapping[str, Any]) -> "Tokenizer":
        """Reads the files :meth:`_write_files` wrote (``options`` from ``tokenizer.json``).

        Raises:
          DataError: a file is missing or broken.
        """


# -- vocabulary-backed kinds: word, char -----------------------------------------------------------
class _VocabTokenizer(Tokenizer):
    """A tokenizer whose symbols are the entries of a :class:`Vocab`, saved as one file."""

    #: The vocabulary file in the folder.
    FILE: ClassVar[str] = ""

    def __init__(self, vocab: Vocab) -> None:
        if not isinstance(vocab, Vocab):
            raise DataError(f"vocab must be a Vocab, got {type(vocab).__name__}; "
                            "build one with Vocab.build or Vocab.load")
        self.vocab = vocab

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def _special_id(self, role: str) -> Optional[int]:
        return getattr(self.vocab, f"{role}_id")

    def fingerprint(self) -> str:
        return self.vocab.fingerprint()

    def _write_files(self, folder: str) -> None:
        self.vocab.save(os.path.join(folder, self.FILE))

    @classmethod
    def _read_vocab(cls, folder: str) -> Vocab:
        return Vocab.load(os.path.join(folder, cls.FILE))


class WordTokenizer(_VocabTokenizer):
    """Whitespace-separated words mapped through a :class:`Vocab`; unknown words become ``<unk>``."""

    name = "word"
    OPTIONS = {"max_vocab": None, "min_count": 1}
    FILE = "vocab.txt"

    def __init__(self, vocab: Vocab, *, max_vocab: Optional[int] = None, min_count: int = 1) -> None:
        """Args:
          vocab: the vocabulary; unknown words map to its ``unk_id``.
          max_vocab: the size limit ``vocab`` was built with (None: none).
          min_count: the minimum count ``vocab`` was built with.

        Raises:
          DataError: ``vocab`` is not a :class:`Vocab`.
        """
        super().__init__(vocab)
        self._options = {"max_vocab": max_vocab, "min_count": min_count}

    @property
    def options(self) -> Dict[str, Any]:
        return dict(self._options)

    def _encode_line(self, line: str) -> List[int]:
        return self.vocab.encode(line.split())

    def _decode_line(self, ids: List[int]) -> str:
        return " ".join(self.vocab.decode(ids))

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> Dict[str, Any]:
        options = super().check_options(options)
        if options["max_vocab"] is not None:
            _check_size("max_vocab", options["max_vocab"],
                        "give the largest word vocabulary (specials included), or None for all words")
        min_count = options["min_count"]
        if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
            raise DataError(f"min_count = {min_count!r} must be an integer >= 1 "
                            "(1 keeps every word)")
        return options

    @classmethod
    def train(cls, train_file: Sequence[str], folder: str, **options: Any) -> "WordTokenizer":
        """The words of the files ``train_file`` by decreasing count (``folder`` is not used)."""
        options = cls.check_options(options)
        vocab = Vocab.build(_pieces(train_file), max_size=options["max_vocab"],
                            min_count=options["min_count"])
        return cls(vocab, **options)

    @classmethod
    def load(cls, folder: str, options: Mapping[str, Any]) -> "WordTokenizer":
        return cls(cls._read_vocab(folder), **cls.check_options(options))


class CharTokenizer(_VocabTokenizer):
    """The Unicode characters of the training text; unseen characters become ``<unk>``.

    A carriage return is never a symbol (``chars.txt`` holds one character a
    line), and a line break is ``eos_id``.
    """

    name = "char"
    FILE = "chars.txt"

    @property
    def options(self) -> Dict[str, Any]:
        return {}

    def _encode_line(self, line: str) -> List[int]:
        return self.vocab.encode(line)

    def _decode_line(self, ids: List[int]) -> str:
        return "".join(self.vocab.decode(ids))

    @classmethod
    def train(cls, train_file: Sequence[str], folder: str, **options: Any) -> "CharTokenizer":
        """The characters of the files ``train_file`` by decreasing count (``folder`` is not used)."""
        counts: collections.Counter = collections.Counter()
        for piece in _pieces(train_file):
            counts.update(piece)
        return cls(Vocab.from_counts(counts))

    @classmethod
    def load(cls, folder: str, options: Mapping[str, Any]) -> "CharTokenizer":
        return cls(cls._read_vocab(folder))


def _pieces(files: Sequence[str]) -> Iterable[str]:
    """The lines of ``files`` without their line ends (a bare CR ends one too), a long line in pieces cut
    before a space (:func:`lmkit.data.textfile.text_pieces`: memory bounded, the words and characters of
    the whole line)."""
    for path in files:
        for piece, _, _ in text_pieces(path, "train_file"):
            yield piece


# -- byte ------------------------------------------------------------------------------------------
class ByteTokenizer(Tokenizer):
    """The UTF-8 bytes of the text: ids 0-3 are ``<unk> <eos> <bos> <pad>``, byte ``b`` is ``b + 4``.

    Every text is covered, so it needs no training and writes no file; bytes
    that do not form valid UTF-8 decode to U+FFFD.
    """

    name = "byte"
    READS_TEXT = False
    _OFFSET = len(DEFAULT_SPECIALS)

    @property
    def vocab_size(self) -> int:
        return 256 + self._OFFSET

    def _special_id(self, role: str) -> Optional[int]:
        return _ROLES.index(role)  # in the order of DEFAULT_SPECIALS

    @property
    def options(self) -> Dict[str, Any]:
        return {}

    def fingerprint(self) -> str:
        return _short_hash(f"byte:{','.join(DEFAULT_SPECIALS)}:utf-8".encode())

    def _encode_line(self, line: str) -> List[int]:
        return [b + self._OFFSET for b in line.encode("utf-8")]

    def encode_lines_flat(self, lines: Sequence[str], add_eos: bool) -> "np.ndarray":
        import numpy as np

        if not add_eos:
            return np.frombuffer("".join(lines).encode("utf-8"), np.uint8).astype(np.uint16) + self._OFFSET
        # Each line's end is a "\n" byte (lines hold none), which becomes eos.
        ids = np.frombuffer(("\n".join(lines) + "\n").encode("utf-8"), np.uint8).astype(np.uint16)
        ends = ids == ord("\n")
        ids += self._OFFSET
        ids[ends] = self.eos_id
        return ids if lines else ids[:0]

    def _decode_line(self, ids: List[int]) -> str:
        # <unk> (never made by encode) shows as the replacement character.
        data = bytes(i - self._OFFSET if i >= self._OFFSET else 0xFF for i in ids)
        return data.decode("utf-8", errors="replace")

    def _write_files(self, folder: str) -> None:
        pass

    @classmethod
    def train(cls, train_file: Sequence[str], folder: str, **options: Any) -> "ByteTokenizer":
        """The byte table is fixed: the text is not read."""
        return cls()

    @classmethod
    def load(cls, folder: str, options: Mapping[str, Any]) -> "ByteTokenizer":
        return cls()


#: name -> "module:Class" (imported on use); adding a kind is one class and one line here.
TOKENIZERS: Dict[str, str] = {
    "word": "lmkit.data.tokenizers:WordTokenizer",
    "sentencepiece": "lmkit.data.sentencepiece:SentencePieceTokenizer",
    "char": "lmkit.data.tokenizers:CharTokenizer",
    "byte": "lmkit.data.tokenizers:ByteTokenizer",
    "hf": "lmkit.hub.tokenizer:HFTokenizer",  # a pretrained model's (GPT-2's byte-level BPE); not trained
}


#: ``tokenizer = "hf:<folder or Hub name>"``: the ``hf`` kind read from that folder (or downloaded), for a model
#: trained from scratch with a pretrained tokenizer (``hf`` alone is an ``--init_from`` model's own).
PRETRAINED_PREFIX = "hf:"


def split_tokenizer(spec: str) -> Tuple[str, str]:
    """``(kind, source)`` of a ``tokenizer`` setting: ``"hf:gpt2"`` -> ``("hf", "gpt2")``, ``"char"`` ->
    ``("char", "")``; ``"hf:"`` with nothing after it stays itself, an unknown kind."""
    if isinstance(spec, str) and spec.startswith(PRETRAINED_PREFIX) and spec[len(PRETRAINED_PREFIX):].strip():
        return "hf", spec[len(PRETRAINED_PREFIX):].strip()
    return spec, ""


def tokenizer_class(name: str) -> Type[Tokenizer]:
    """The class registered as ``name``.

    Raises:
      DataError: ``unknown tokenizer 'wrod'; did you mean 'word'?``.
    """
    check_choice("tokenizer", name, TOKENIZERS, DataError)
    return import_object(TOKENIZERS[name], "tokenizer")


def train_tokenizer(name: str, train_file: Union[PathLike, Sequence[PathLike]], folder: PathLike, *,
                    vocab_size: Optional[int] = None, max_vocab: Optional[int] = None,
                    min_count: int = 1, model_type: str = "unigram", source: str = "",
                    cache_dir: Optional[str] = None) -> Tokenizer:
    """Trains a tokenizer into ``folder``, or reuses the one saved there.

    When ``folder/tokenizer.json`` exists with the same kind and options it
    is loaded (nothing is trained); otherwise the tokenizer is trained on
    ``train_file`` and saved into ``folder``. In a distributed job run it on
    the chief, then :func:`load_tokenizer` on the other ranks.

    Args:
      name: a key of :data:`TOKENIZERS`: ``word``, ``sentencepiece``,
        ``char`` or ``byte``; or ``hf:<folder or Hub name>``, a pretrained
        tokenizer read from that folder or downloaded (not trained; the
        ``source`` below).
      train_file: UTF-8 text, one sentence or paragraph a line (checked with
        :func:`check_text_file`; not read by ``byte``): a file, a folder, a
        glob pattern, several separated by commas, or a list
        (:func:`~lmkit.data.sources.resolve_sources`).
      folder: the model folder; every file goes here, none beside the data.
      vocab_size: number of pieces (``sentencepiece``; required there).
      max_vocab: largest word vocabulary, specials included (``word``).
      min_count: drop words seen fewer times (``word``).
      model_type: ``"unigram"`` or ``"bpe"`` (``sentencepiece``).
      source: the pretrained model folder the ``hf`` kind is read from
        (``name`` ``hf:<source>`` gives it too).
      cache_dir: a data cache folder (:func:`lmkit.data.token_cache.cache_root`):
        a tokenizer trained there before on the same files (path, size,
        modification time and a sample of the content,
        :func:`~lmkit.data.textfile.content_sample`) with the same kind and
        options is copied instead of trained again, and a newly trained one
        is kept there.

    Options a kind does not take are ignored.

    Returns:
      The tokenizer, saved in ``folder``.

    Raises:
      DataError: an unknown ``name``, a bad option, a bad training file, a
        corpus too small for ``vocab_size`` (naming the largest that works),
        or a tokenizer already in ``folder`` that differs from the one asked
        for (naming both).
    """
    name, named_source = split_tokenizer(name)
    if named_source and source and named_source != source:
        raise DataError(f"tokenizer hf:{named_source} and source {source!r} name two tokenizers; give one")
    source = named_source or source
    kind = tokenizer_class(name)
    options = kind.check_options({"vocab_size": vocab_size, "max_vocab": max_vocab, "source": source,
                                  "min_count": min_count, "model_type": model_type})
    folder = os.fspath(folder)
    if os.path.isfile(os.path.join(folder, TOKENIZER_FILE)):
        return _saved_tokenizer(folder, kind, options)
    files: List[str] = []
    if kind.READS_TEXT:
        from lmkit.data.sources import resolve_sources
        files = resolve_sources(train_file, "train_file")
    cached = _cached_tokenizer_dir(cache_dir, kind, options, files) if files else None
    if cached is not None and os.path.isfile(os.path.join(cached, TOKENIZER_FILE)):
        tokenizer = load_tokenizer(cached)
        tokenizer.save(folder)
        return tokenizer
    for path in files:
        check_text_file(path, "train_file")
    made = not os.path.isdir(folder)
    try:
        tokenizer = kind.train(files, folder, **options)
        tokenizer.save(folder)
    except BaseException:
        if made:  # everything in it is this call's: leave no half-made model folder
            shutil.rmtree(folder, ignore_errors=True)
        raise
    if cached is not None:
        _keep_in_cache(tokenizer, cached)
    return tokenizer


def _saved_tokenizer(folder: str, kind: Type[Tokenizer], options: Mapping[str, Any]) -> Tokenizer:
    """The tokenizer saved in ``folder`` when it is the ``kind`` with the ``options`` asked for (those read from a
    source aside).

    Raises:
      DataError: another kind or other options, naming both.
    """
    saved = load_tokenizer(folder)

    def asked(opts: Mapping[str, Any]) -> Dict[str, Any]:  # the options that are chosen, not read from a source
        return {k: v for k, v in opts.items() if k not in kind.DERIVED}

    if saved.name == kind.name and asked(saved.options) == asked(options):
        return saved
    raise DataError(f"{os.path.join(folder, TOKENIZER_FILE)} holds a {saved.name} tokenizer "
                    f"with options {saved.options}, but a {kind.name} tokenizer with options "
                    f"{options} was asked for; ask for the saved one (the settings of the run "
                    "that wrote this folder) or use another folder")


def _cached_tokenizer_dir(cache_dir: Optional[str], kind: Type[Tokenizer], options: Mapping[str, Any],
                          files: Sequence[str]) -> Optional[str]:
    """Where the data cache keeps ``kind`` trained with ``options`` on ``files`` (None: no cache).

    The name holds each file's path, size, modification time and a sample of its content: a file edited
    and copied back with ``cp -p`` or ``rsync -t`` (same size and time) gets another folder.
    """
    if not cache_dir:
        return None
    sources = []
    try:
        for path in files:
            found = source_identity(path)
            # Where a JSON Lines, Parquet or datasets source holds its text, after the values plain text had.
            sources.append([found["path"], found["size"], found["mtime_ns"], found["sample"],
                            *([found["read"]] if "read" in found else [])])
    except OSError:  # unreadable: no cache (check_text_file says what is wrong)
        return None
    record = json.dumps({"kind": kind.name, "options": dict(options), "files": sources,
                         **({"version": kind.VERSION} if kind.VERSION else {})}, sort_keys=True)
    return os.path.join(cache_dir, f"tokenizer-{kind.name}-{_short_hash(record.encode('utf-8'))}")


def _keep_in_cache(tokenizer: Tokenizer, cached: str) -> None:
    """Saves a trained tokenizer into the data cache (best effort: a cache that cannot be written is skipped),
    through a locked temporary folder (:class:`lmkit.core.fileio.TempFolder`); the leftovers of killed
    saves and encodings there go first."""
    from lmkit.core.fileio import TempFolder
    from lmkit.data.cache_folders import TEMP_PREFIX, sweep_temp_folders

    root, temp = os.path.dirname(cached), None
    try:
        sweep_temp_folders(root)
        temp = TempFolder(root, f"{TEMP_PREFIX}{os.path.basename(cached)}-")
        tokenizer.save(temp.path)
        temp.publish(cached)
    except OSError:
        pass
    finally:
        if temp is not None:
            temp.close()


def load_tokenizer(folder: PathLike) -> Tokenizer:
    """Reads the tokenizer that :meth:`Tokenizer.save` wrote into ``folder``.

    Args:
      folder: the model folder.

    Returns:
      The tokenizer, checked against the size and fingerprint in
      ``tokenizer.json``.

    Raises:
      DataError: ``folder`` holds no ``tokenizer.json``, or it or the files
        it names are broken (naming the file and the fix).
    """
    folder = os.fspath(folder)
    meta = os.path.join(folder, TOKENIZER_FILE)
    if not os.path.isfile(meta):
        raise DataError(f"{folder!r} holds no tokenizer ({TOKENIZER_FILE} is missing); give the "
                        "model folder of a run trained on text, or train one there with "
                        "train_tokenizer(name, train_file, folder)")
    fix = f"delete {meta} and train the tokenizer again"
    try:
        with open(meta, "r", encoding="utf-8") as f:
            record = json.load(f)
    except (ValueError, OSError) as exc:
        raise DataError(f"{meta} is not readable JSON ({exc}); {fix}") from None
    if not isinstance(record, dict) or not {"name", "options", "vocab_size",
                                            "fingerprint"} <= set(record):
        raise DataError(f"{meta} lacks some of the keys name, options, vocab_size, fingerprint; "
                        f"{fix}")
    kind = _kind_named_in(meta, record["name"], fix)
    options = record["options"]
    if not isinstance(options, dict):
        raise DataError(f"{meta}: options must be a JSON object, got {options!r}; {fix}")
    try:
        check_known_keys(meta, options, kind.OPTIONS, DataError)
    except DataError as exc:
        raise DataError(f"{exc} for a {kind.name} tokenizer; {fix}") from None
    try:
        tokenizer = kind.load(folder, options)
    except DataError as exc:
        raise DataError(f"{meta} names a {kind.name} tokenizer that cannot be read: {exc}; "
                        f"{fix}") from None
    found = (tokenizer.vocab_size, tokenizer.fingerprint())
    expected = (record["vocab_size"], record["fingerprint"])
    if found != expected:
        raise DataError(f"{meta} describes a {kind.name} tokenizer of {expected[0]} ids with "
                        f"fingerprint {expected[1]}, but the files in {folder!r} give "
                        f"{found[0]} ids with fingerprint {found[1]} (changed after saving); "
                        f"{fix}")
    return tokenizer


def _kind_named_in(meta: str, name: Any, fix: str) -> Type[Tokenizer]:
    """The class named in ``tokenizer.json``; an unknown name is a broken file."""
    try:
        return tokenizer_class(name)
    except DataError as exc:
        raise DataError(f"{meta}: {exc}; {fix}") from None


def tokenizer_of_run(model_dir: PathLike) -> Tokenizer:
    """The tokenizer a training run left in ``model_dir``.

    A run on text data saved its tokenizer (``tokenizer.json``); a PTB run
    saved its vocabulary (``vocab.txt``), read here as word tokens.

    Raises:
      DataError: the folder holds neither, or they are broken.
    """
    from lmkit.core.layout import VOCAB_FILE

    model_dir = os.fspath(model_dir)
    if os.path.isfile(os.path.join(model_dir, TOKENIZER_FILE)):
        return load_tokenizer(model_dir)
    vocab_path = os.path.join(model_dir, VOCAB_FILE)
    if os.path.isfile(vocab_path):
        return WordTokenizer(Vocab.load(vocab_path))
    raise DataError(f"{model_dir} holds no {TOKENIZER_FILE} or {VOCAB_FILE}, so no training run "
                    "wrote it; pass the --model_dir of a training run")


def check_vocabulary(tokenizer: Any, vocab_size: int, folder: str) -> None:
    """A tokenizer with ids beyond a pretrained model's vocabulary is refused (naming the tokenizer file).

    Args:
      tokenizer: the run's tokenizer.
      vocab_size: the model's vocabulary (its Hugging Face ``config.json``).
      folder: the Hugging Face folder the model and the tokenizer come from.

    Raises:
      UsageError: the tokenizer has more ids than the model.
    """
    if tokenizer.vocab_size > vocab_size:
        name = "tokenizer.json" if os.path.isfile(os.path.join(folder, "tokenizer.json")) else "vocab.json"
        raise UsageError(f"{os.path.join(folder, name)} has ids up to {tokenizer.vocab_size - 1} but the model's "
                         f"vocab_size is {vocab_size} ({os.path.join(folder, 'config.json')}); the tokenizer "
                         "belongs to another model")
