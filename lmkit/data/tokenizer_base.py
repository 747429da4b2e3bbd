"""The interface every tokenizer kind follows: :class:`Tokenizer` (text <-> ids, the special ids, the
fingerprint, saving into a folder with ``tokenizer.json`` written last).

The kinds are lmkit's own (:mod:`lmkit.data.basic_tokenizers`: word, char,
byte), SentencePiece (:mod:`lmkit.data.sentencepiece`) and a pretrained
model's (:mod:`lmkit.hub.tokenizer`); :mod:`lmkit.data.tokenizers` holds the
registry that names them, and trains, loads and reuses them.
"""

from __future__ import annotations

import abc
import hashlib
import json
import os
from typing import TYPE_CHECKING, Any, ClassVar, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from lmkit.core.fileio import PathLike, atomic_write_text, fsync_dir
from lmkit.data.errors import DataError
from lmkit.data.vocab import DEFAULT_SPECIALS

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

__all__ = ["Tokenizer", "TOKENIZER_FILE", "ROLES", "MIN_VOCAB", "short_hash", "check_size"]

TOKENIZER_FILE = "tokenizer.json"
#: The special symbols' roles, in the order of DEFAULT_SPECIALS.
ROLES = ("unk", "eos", "bos", "pad")
#: The smallest vocabulary worth having: the four specials and one symbol.
MIN_VOCAB = len(DEFAULT_SPECIALS) + 1


def short_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def check_size(name: str, value: Any, fix: str) -> int:
    """``value`` as an int >= 5 (the four specials and one more symbol)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_VOCAB:
        raise DataError(f"{name} = {value!r} must be an integer >= {MIN_VOCAB} (the 4 special "
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
