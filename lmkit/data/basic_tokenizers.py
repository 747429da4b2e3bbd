"""lmkit's own tokenizers, which need no library: ``word`` (whitespace-separated words through a
:class:`~lmkit.data.vocab.Vocab`), ``char`` (the Unicode characters of the training text) and ``byte`` (the 256
byte values of UTF-8, no training). Each is a :class:`~lmkit.data.tokenizer_base.Tokenizer`; the registry in
:mod:`lmkit.data.tokenizers` names them.
"""

from __future__ import annotations

import collections
import os
from typing import TYPE_CHECKING, Any, ClassVar, Dict, Iterable, List, Mapping, Optional, Sequence

from lmkit.data.errors import DataError
from lmkit.data.textfile import text_pieces
from lmkit.data.tokenizer_base import ROLES, Tokenizer, check_size, short_hash
from lmkit.data.vocab import DEFAULT_SPECIALS, Vocab

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

__all__ = ["WordTokenizer", "CharTokenizer", "ByteTokenizer"]


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
            check_size("max_vocab", options["max_vocab"],
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
        return ROLES.index(role)  # in the order of DEFAULT_SPECIALS

    @property
    def options(self) -> Dict[str, Any]:
        return {}

    def fingerprint(self) -> str:
        return short_hash(f"byte:{','.join(DEFAULT_SPECIALS)}:utf-8".encode())

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
