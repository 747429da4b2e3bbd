"""A word vocabulary: tokens <-> ids, built by frequency, saved as ``vocab.txt``.

The file format is plain text, one token a line, and a token's id is its line
number (0-based). Special tokens (``<unk>``, ``<eos>``, ``<bos>``, ``<pad>`` by
default) come first, then the corpus tokens by decreasing count, ties broken
by the token itself so that every process builds the same vocabulary.
"""

from __future__ import annotations

import collections
import hashlib
import os
from typing import Counter, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from lmkit.core.fileio import atomic_write_text
from lmkit.data.errors import DataError

__all__ = ["Vocab", "DEFAULT_SPECIALS", "read_lines", "atomic_write_text"]

# Role names looked up by default; a role whose token is absent has id None.
DEFAULT_SPECIALS: Tuple[str, str, str, str] = ("<unk>", "<eos>", "<bos>", "<pad>")

PathLike = Union[str, "os.PathLike[str]"]


def read_lines(path: PathLike) -> Iterator[str]:
    """Yields the lines of a UTF-8 text file without their line ends.

    Args:
      path: the file.

    Yields:
      Each line, ``"\\n"`` (and a ``"\\r"`` before it) removed.

    Raises:
      DataError: the file is missing or not UTF-8 (naming the file and the
        line of the first bad byte).
    """
    path = os.fspath(path)
    done = 0  # lines read so far, to say where a decoding error is
    try:
        with open(path, "r", encoding="utf-8", newline="") as f:
            for line in f:
                done += 1
                yield line.rstrip("\n").rstrip("\r")
    except FileNotFoundError:
        raise DataError(f"text file {path!r} does not exist; check the path") from None
    except IsADirectoryError:
        raise DataError(f"text file {path!r} is a folder; give the path of a file") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"text file {path!r} is not UTF-8 ({exc.reason} near line {done + 1}); "
                        "convert it with e.g. `iconv -t UTF-8`") from None


class Vocab:
    """A fixed list of tokens; a token's id is its position in the list.

    Special-token roles (unknown, end of sentence, begin of sentence, padding)
    are looked up by name: a role whose token is not in the list has id
    ``None``. :meth:`build` puts the role tokens first so they always exist.

    Example::

        vocab = Vocab.build("ptb.train.txt", bos_token=None, pad_token=None,
                            newline_token="<eos>")
        ids = vocab.encode("the cat".split())
        vocab.save("model_dir/vocab.txt")
    """

    def __init__(self, tokens: Sequence[str], *, unk_token: Optional[str] = "<unk>",
                 eos_token: Optional[str] = "<eos>", bos_token: Optional[str] = "<bos>",
                 pad_token: Optional[str] = "<pad>") -> None:
        """Wraps a token list.

        Args:
          tokens: the tokens in id order; non-empty strings without line
            breaks, no duplicates.
          unk_token: name of the unknown-word token (encode maps unseen
            tokens to it), or None for none.
          eos_token: name of the end-of-sentence token, or None.
          bos_token: name of the begin-of-sentence token, or None.
          pad_token: name of the padding token, or None.

        Raises:
          DataError: an empty list, an empty token, a token with a line
            break, or a duplicate (naming the token and its ids).
        """
        tokens = list(tokens)
        if not tokens:
            raise DataError("tokens is empty; a vocabulary needs at least one token")
        index: Dict[str, int] = {}
        for i, token in enumerate(tokens):
            if not isinstance(token, str) or not token:
                raise DataError(f"tokens[{i}] = {token!r} is not a non-empty string")
            if "\n" in token or "\r" in token:
                raise DataError(f"tokens[{i}] = {token!r} contains a line break; the vocab file "
                                 "holds one token a line, so remove it")
            if token in index:
                raise DataError(f"token {token!r} appears twice (ids {index[token]} and {i}); "
                                 "tokens must be unique")
            index[token] = i
        self._tokens: Tuple[str, ...] = tuple(tokens)
        self._index = index
        self._names = {"unk": unk_token, "eos": eos_token, "bos": bos_token, "pad": pad_token}

    # -- building ---------------------------------------------------------------
    @classmethod
    def build(cls, source: Union[PathLike, Iterable[str]], *, max_size: Optional[int] = None,
              min_count: int = 1, unk_token: Optional[str] = "<unk>",
              eos_token: Optional[str] = "<eos>", bos_token: Optional[str] = "<bos>",
              pad_token: Optional[str] = "<pad>", extra_specials: Sequence[str] = (),
              newline_token: Optional[str] = None) -> "Vocab":
        """Builds a vocabulary from a text file or an iterable of lines.

        Lines are split on whitespace. The special tokens come first (unk,
        eos, bos, pad, then ``extra_specials``, skipping None), then the other
        tokens by decreasing count with ties broken by the token.

        Args:
          source: a path (``str`` or ``os.PathLike``) of a UTF-8 file, or an
            iterable of lines. A ``str`` is always a path.
          max_size: keep at most this many entries in all (specials
            included); None keeps every token.
          min_count: drop tokens seen fewer times than this.
          unk_token: see :class:`Vocab`; always included when not None.
          eos_token: see :class:`Vocab`; always included when not None.
          bos_token: see :class:`Vocab`; always included when not None.
          pad_token: see :class:`Vocab`; always included when not None.
          extra_specials: more tokens to put right after the role tokens.
          newline_token: when set, every line also counts one of this token
            (PTB: a newline is ``<eos>``).

        Returns:
          The vocabulary.

        Raises:
          DataError: ``max_size`` smaller than the number of specials,
            ``min_count`` < 1, or the file is missing or not UTF-8.
        """
        if isinstance(source, (str, os.PathLike)):
            lines: Iterable[str] = read_lines(source)
        else:
            lines = source
        counts: Counter[str] = collections.Counter()
        for line in lines:
            counts.update(line.split())
            if newline_token is not None:
                counts[newline_token] += 1
        return cls.from_counts(counts, max_size=max_size, min_count=min_count, unk_token=unk_token,
                               eos_token=eos_token, bos_token=bos_token, pad_token=pad_token,
                               extra_specials=extra_specials)

    @classmethod
    def from_counts(cls, counts: Mapping[str, int], *, max_size: Optional[int] = None,
                    min_count: int = 1, unk_token: Optional[str] = "<unk>",
                    eos_token: Optional[str] = "<eos>", bos_token: Optional[str] = "<bos>",
                    pad_token: Optional[str] = "<pad>", extra_specials: Sequence[str] = ()) -> "Vocab":
        """Builds a vocabulary from token counts; arguments as in :meth:`build`."""
        specials: List[str] = []
        for token in (unk_token, eos_token, bos_token, pad_token, *extra_specials):
            if token is not None and token not in specials:
                specials.append(token)
        if max_size is not None and max_size < max(1, len(specials)):
            raise DataError(f"max_size = {max_size} is smaller than the {len(specials)} special "
                             f"tokens {specials}; use max_size >= {max(1, len(specials))} or None")
        if min_count < 1:
            raise DataError(f"min_count = {min_count} must be >= 1")
        taken = set(specials)
        # Sorting on (-count, token) makes the order independent of the input order.
        ranked = sorted((t for t, c in counts.items() if c >= min_count and t not in taken),
                        key=lambda t: (-counts[t], t))
        tokens = specials + ranked
        if max_size is not None:
            tokens = tokens[:max_size]
        if not tokens:
            raise DataError("the text has no tokens and no special tokens were asked for; "
                            "check the input file")
        return cls(tokens, unk_token=unk_token, eos_token=eos_token, bos_token=bos_token,
                   pad_token=pad_token)

    # -- files ------------------------------------------------------------------
    def save(self, path: PathLike) -> None:
        """Writes ``vocab.txt`` (one token a line) atomically.

        Args:
          path: the file to write; its folder is created when missing.
        """
        atomic_write_text(path, "\n".join(self._tokens) + "\n")

    @classmethod
    def load(cls, path: PathLike, *, unk_token: Optional[str] = "<unk>",
             eos_token: Optional[str] = "<eos>", bos_token: Optional[str] = "<bos>",
             pad_token: Optional[str] = "<pad>") -> "Vocab":
        """Reads a file written by :meth:`save`.

        Args:
          path: the vocabulary file.
          unk_token: role names to look up, as in :class:`Vocab`.
          eos_token: as above.
          bos_token: as above.
          pad_token: as above.

        Returns:
          The vocabulary.

        Raises:
          DataError: the file is missing, not UTF-8, empty, or has an empty
            line or a duplicate token (naming the line).
        """
        path = os.fspath(path)
        tokens = list(read_lines(path))
        if tokens and tokens[-1] == "" and len(tokens) > 1:
            tokens.pop()  # a final newline leaves an empty last field
        if not tokens or tokens == [""]:
            raise DataError(f"vocabulary file {path!r} is empty; write it with Vocab.save")
        seen: Dict[str, int] = {}
        for i, token in enumerate(tokens):
            if not token:
                raise DataError(f"vocabulary file {path!r} has an empty line {i + 1}; "
                                "every line must hold one token")
            if token in seen:
                raise DataError(f"vocabulary file {path!r} lists {token!r} twice (lines "
                                f"{seen[token] + 1} and {i + 1}); remove the duplicate")
            seen[token] = i
        return cls(tokens, unk_token=unk_token, eos_token=eos_token, bos_token=bos_token,
                   pad_token=pad_token)

    # -- mapping ----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def size(self) -> int:
        """Number of entries (the model's ``vocab_size``)."""
        return len(self._tokens)

    @property
    def tokens(self) -> Tuple[str, ...]:
        """All tokens in id order."""
        return self._tokens

    def __contains__(self, token: object) -> bool:
        return token in self._index

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Vocab):
            return NotImplemented
        # Roles compare by the ids they resolve to: a vocabulary built with
        # bos_token=None equals the same file loaded with the default names.
        return self._tokens == other._tokens and self._special_ids() == other._special_ids()

    def __hash__(self) -> int:
        return hash(self._tokens)

    def __repr__(self) -> str:
        head = ", ".join(repr(t) for t in self._tokens[:5])
        more = ", ..." if len(self) > 5 else ""
        return f"Vocab(size={len(self)}, tokens=[{head}{more}])"

    def _special_ids(self) -> Tuple[Optional[int], ...]:
        return tuple(self._role_id(role) for role in ("unk", "eos", "bos", "pad"))

    def _role_id(self, role: str) -> Optional[int]:
        name = self._names[role]
        return None if name is None else self._index.get(name)

    @property
    def unk_id(self) -> Optional[int]:
        """Id of the unknown-word token, or None when there is none."""
        return self._role_id("unk")

    @property
    def eos_id(self) -> Optional[int]:
        """Id of the end-of-sentence token, or None when there is none."""
        return self._role_id("eos")

    @property
    def bos_id(self) -> Optional[int]:
        """Id of the begin-of-sentence token, or None when there is none."""
        return self._role_id("bos")

    @property
    def pad_id(self) -> Optional[int]:
        """Id of the padding token, or None when there is none."""
        return self._role_id("pad")

    def token_to_id(self, token: str) -> int:
        """The id of ``token``; an unknown token maps to ``unk_id``.

        Raises:
          DataError: the token is unknown and there is no unk token.
        """
        found = self._index.get(token)
        if found is not None:
            return found
        unk = self.unk_id
        if unk is None:
            raise DataError(f"token {token!r} is not in the vocabulary ({len(self)} entries) and "
                            "the vocabulary has no unknown-word token; build it with unk_token set")
        return unk

    def id_to_token(self, token_id: int) -> str:
        """The token with id ``token_id``.

        Raises:
          DataError: the id is not in ``[0, size)``.
        """
        i = int(token_id)
        if not 0 <= i < len(self._tokens):
            raise DataError(f"id {i} is out of range for a vocabulary of {len(self)} entries "
                            f"(valid ids are 0..{len(self) - 1})")
        return self._tokens[i]

    def encode(self, tokens: Iterable[str]) -> List[int]:
        """Maps tokens to ids; unknown tokens become ``unk_id``.

        Raises:
          DataError: an unknown token and no unk token.
        """
        index, unk = self._index, self.unk_id
        if unk is not None:
            return [index.get(t, unk) for t in tokens]
        return [self.token_to_id(t) for t in tokens]

    def decode(self, ids: Iterable[int]) -> List[str]:
        """Maps ids back to tokens.

        Raises:
          DataError: an id outside ``[0, size)``.
        """
        ids = [int(i) for i in ids]
        tokens = self._tokens
        if ids:
            low, high = min(ids), max(ids)
            if low < 0 or high >= len(tokens):
                self.id_to_token(low if low < 0 else high)  # raises, naming the id
        return [tokens[i] for i in ids]

    def fingerprint(self) -> str:
        """A short hash of the token list, to check that all ranks agree."""
        digest = hashlib.sha256("\n".join(self._tokens).encode("utf-8")).hexdigest()
        return digest[:16]
