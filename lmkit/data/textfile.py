"""Text files a user gives: one check for all of them, a reader in bounded blocks, word counts.

:func:`check_text_file` turns every way a text file can be unusable (missing,
a folder, empty, binary, not UTF-8) into one
:class:`~lmkit.data.errors.DataError` that names the file, what is wrong
with it and the fix, before a tokenizer is trained or a stream encoded.

:class:`TextBlocks` reads a file in blocks of at most about
``2 x block_bytes`` bytes whatever its line lengths: a line break is
``"\\n"``, ``"\\r\\n"`` or a bare ``"\\r"`` (old Mac line ends; as
:func:`lmkit.data.vocab.read_lines` splits), and a line longer than
``block_bytes`` is cut into pieces just before a space or tab, so that the
words, characters and bytes of the pieces are those of the whole line (and
GPT-2-style pre-tokenizers, which put a space at the start of a word, see the
same words); a piece without a space or tab in ``block_bytes`` is cut
between two characters. :func:`line_segments` splits a block into its lines
and says which end their line; :func:`text_pieces` gives a file's lines so,
to every reader of training text (the data cache, the word and char
tokenizers' training, :func:`count_words`).

Every reader here takes any source :mod:`lmkit.data.formats` reads (JSON
Lines, Parquet, a ``datasets`` folder, compressed text): its text comes as a
plain file's would, one document a line.

:func:`count_words` gives the denominator of perplexity per word (see
``docs/data.md``): the whitespace-separated words of a text, plus one per
non-blank line when the id stream ends every line with an end-of-sentence id.

:func:`content_sample` hashes a file's head and tail: the caches key a
source on it besides its size and modification time, which ``cp -p`` and
``rsync -t`` keep across an edit (:func:`source_identity`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from typing import Dict, Iterable, Iterator, List, Optional, Tuple, Union

from lmkit.core.fileio import PathLike
from lmkit.data import formats
from lmkit.data.errors import DataError

__all__ = ["check_text_file", "count_words", "BINARY_PROBE_BYTES", "BLOCK_BYTES", "LINE_BREAK",
           "TextBlock", "TextBlocks", "line_segments", "text_pieces", "content_sample", "source_identity"]

# A NUL byte in this much of the head marks a binary file (UTF-8 text has none).
BINARY_PROBE_BYTES = 1 << 20
#: Bytes read at a time, and the longest piece of a line held before it is cut.
BLOCK_BYTES = 4 << 20
#: What splits lines: "\r\n", "\r" or "\n" (Python's universal newlines, as read_lines reads).
LINE_BREAK = re.compile(r"\r\n|\r|\n")
# A long line is cut just before one of these (ASCII, so never inside a UTF-8 character).
_CUT_BEFORE = (b" ", b"\t")
# White space as str.split() sees it, among ASCII bytes: a cut keeps a space off the end of a piece.
_WHITE = frozenset(b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f")
#: Bytes of a file's head and of its tail that :func:`content_sample` hashes.
SAMPLE_BYTES = 1 << 20


@dataclasses.dataclass
class TextBlock:
    """A run of a text file that :class:`TextBlocks` yields.

    Attributes:
      raw: its bytes (the blocks of a file, in order, are the file).
      text: ``raw`` decoded.
      continues: it starts inside a line whose part before it has text (not only white space).
      ends_line: it ends at a line end (or the end of the file); False: inside a long line.
    """

    raw: bytes
    text: str
    continues: bool
    ends_line: bool


class TextBlocks:
    """The blocks of a UTF-8 text file, memory bounded whatever its line lengths (module docstring).

    A source of another format (JSON Lines, Parquet, a ``datasets`` folder,
    compressed text: :mod:`lmkit.data.formats`) gives the blocks of its text
    as a plain file would hold it, each document on its own line.

    Args:
      path: the file (a path or a :class:`~lmkit.data.formats.Source`).
      what: how messages call it, e.g. ``"train_file"``.
      block_bytes: bytes read at a time (None: :data:`BLOCK_BYTES`); a block holds at most twice as many.
      cr_breaks: a bare ``"\\r"`` ends a line (False: only ``"\\n"`` does, as an
        encoder-decoder's source and target files are read).
      max_line_bytes: None: a line longer than ``block_bytes`` is cut into
        pieces; a number: lines are kept whole, and one longer than this is a
        :class:`DataError` (naming it, with ``long_line_fix``).
      long_line_fix: what to do about a line too long to keep whole.
      nul_limit: look for NUL bytes (a binary file) in this many bytes of the
        head; None: everywhere.
      plain: read the file's bytes as they are, whatever its name (an
        encoder-decoder's line-aligned files).

    Attributes:
      read: bytes of text read so far.
      consumed: bytes of the source read so far (a compressed file's
        compressed bytes; the whole source once read to the end).

    Raises (while iterating):
      DataError: a NUL byte, a byte that is not UTF-8 (naming the line and
        the byte), a line too long to keep whole, or a source of another
        format that its library cannot read (:func:`lmkit.data.formats.open_text`).
    """

    def __init__(self, path: PathLike, what: str = "text file", *, block_bytes: Optional[int] = None,
                 cr_breaks: bool = True, max_line_bytes: Optional[int] = None, long_line_fix: str = "",
                 nul_limit: Optional[int] = None, plain: bool = False) -> None:
        self.source, self.path, self.what = path, os.fspath(path), what
        self.plain = plain
        self.block_bytes = max(8, int(block_bytes or BLOCK_BYTES))
        self.cr_breaks, self.max_line_bytes = cr_breaks, max_line_bytes
        self.long_line_fix, self.nul_limit = long_line_fix, nul_limit
        self.read = 0
        self.consumed = 0
        self._line = 1  # the line the next block starts in
        self._line_start = 0  # the offset of that line's first byte
        self._offset = 0  # the offset of the next block's first byte
        self._has_text = False  # the line the next block starts in has text before it
        self._ends_with_break = False

    @property
    def lines(self) -> int:
        """Lines read so far (once read to the end: the file's lines, a last one without a line end too)."""
        return self._line - 1 if self._ends_with_break or self._offset == 0 else self._line

    def __iter__(self) -> Iterator[TextBlock]:
        carry = b""
        with self._open() as f:
            while True:
                chunk = f.read(self.block_bytes)
                self._check_nul(chunk)
                self.read += len(chunk)
                self.consumed = f.consumed
                data = carry + chunk
                end = self._last_line_end(data, eof=not chunk)
                if end:
                    yield self._block(data[:end], ends_line=True)
                    data = data[end:]
                # What is left is the start of a line.
                if self.max_line_bytes is not None:  # kept whole, up to a bound
                    if len(data) > self.max_line_bytes:
                        raise self._too_long(data)
                else:
                    while len(data) > self.block_bytes:  # a long line: cut it
                        cut = self._mid_line_cut(data)
                        yield self._block(data[:cut], ends_line=False)
                        data = data[cut:]
                if not chunk:
                    if data:  # the end of the file ends the last line
                        yield self._block(data, ends_line=True)
                    return
                carry = data

    def _open(self) -> formats.TextStream:
        if self.plain:  # the bytes as they are, whatever the name
            raw = open(self.path, "rb")
            return formats.TextStream(raw, raw.tell, [raw])
        return formats.open_text(self.source, self.what)

    # -- where blocks end ---------------------------------------------------------------------------
    def _breaks(self, raw: bytes) -> int:
        """The line ends in ``raw`` (a "\\r\\n" is one)."""
        if not self.cr_breaks:
            return raw.count(b"\n")
        return raw.count(b"\n") + raw.count(b"\r") - raw.count(b"\r\n")

    def _last_break(self, raw: bytes) -> int:
        """The offset of the last byte of the last line end in ``raw``, or -1."""
        return max(raw.rfind(b"\n"), raw.rfind(b"\r") if self.cr_breaks else -1)

    def _last_line_end(self, data: bytes, eof: bool) -> int:
        """The offset just after the last line end in ``data`` (0: none); a "\\r" that ends ``data``
        waits for the next read, which may start with the "\\n" of its "\\r\\n"."""
        end = data.rfind(b"\n")
        if self.cr_breaks:
            stop = len(data) if eof else len(data) - 1
            end = max(end, data.rfind(b"\r", 0, stop))
        return end + 1

    def _mid_line_cut(self, data: bytes) -> int:
        """Where to cut ``data`` (a line's next bytes, more than ``block_bytes``): before the last space or
        tab in ``block_bytes`` that comes before a word, else between two UTF-8 characters."""
        at = self.block_bytes
        while at > 0:
            at = max(data.rfind(sep, 1, at) for sep in _CUT_BEFORE)
            if at > 0 and data[at + 1] not in _WHITE:
                return at
        cut = self.block_bytes
        while cut > self.block_bytes - 3 and data[cut] & 0xC0 == 0x80:  # inside a character
            cut -= 1
        return cut if data[cut] & 0xC0 != 0x80 else self.block_bytes

    # -- blocks ---------------------------------------------------------------------------------
    def _block(self, raw: bytes, ends_line: bool) -> TextBlock:
        text = self._decode(raw)
        block = TextBlock(raw, text, self._has_text, ends_line)
        breaks = self._breaks(raw)
        if breaks:
            self._line_start = self._offset + self._last_break(raw) + 1
        self._line += breaks
        self._offset += len(raw)
        self._ends_with_break = self._last_break(raw[-1:]) == 0
        # A cut long line goes on in the next block: does the part read so far have text?
        self._has_text = not ends_line and (self._has_text or bool(text.strip()))
        return block

    def _decode(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            head = raw[:exc.start]
            line = self._line + self._breaks(head)
            last = self._last_break(head)
            start = self._offset + last + 1 if last >= 0 else self._line_start
            column = self._offset + exc.start - start + 1
            raise DataError(f"{self.what} {self.path!r} is not UTF-8: line {line} has the byte "
                            f"0x{raw[exc.start]:02x} at byte {column} of the line ({exc.reason}); "
                            f"convert the file with e.g. `iconv -f LATIN1 -t UTF-8 {self.path} > "
                            "fixed.txt`") from None

    def _check_nul(self, chunk: bytes) -> None:
        probe = chunk if self.nul_limit is None else chunk[:max(0, self.nul_limit - self.read)]
        nul = probe.find(b"\0")
        if nul >= 0:
            raise DataError(f"{self.what} {self.path!r} is a binary file (a NUL byte at offset "
                            f"{self.read + nul}), not text; give a UTF-8 text file, one sentence or "
                            "paragraph a line")

    def _too_long(self, data: bytes) -> DataError:
        cr = ""
        if not self.cr_breaks and b"\r" in data:
            cr = (" (its lines end with a bare CR, old Mac line ends, which do not end a line here: "
                  f"convert them with `tr '\\r' '\\n' < {self.path} > fixed.txt`)")
        return DataError(f"{self.what} {self.path!r}: line {self._line} is longer than "
                         f"{self.max_line_bytes} bytes{cr}; {self.long_line_fix or 'break it into lines'}")


def line_segments(text: str, continues: bool, ends_line: bool) -> List[Tuple[str, bool, bool]]:
    """The lines of a block (:class:`TextBlock`) as ``(text, has text, ends its line)``.

    A cut long line's pieces are segments of consecutive blocks: the first
    segment of a block that ``continues`` a line with text has text even if
    it is white space (a space there is part of that line); the last segment
    of a block that does not ``ends_line`` goes on in the next block. A line
    is blank when none of its segments has text.
    """
    segments = LINE_BREAK.split(text)
    if ends_line and segments[-1] == "":  # the line end that ends the block starts no line
        segments.pop()
    last = len(segments) - 1
    return [(segment, (k == 0 and continues) or bool(segment.strip()), k < last or ends_line)
            for k, segment in enumerate(segments)]


def text_pieces(path: PathLike, what: str = "text file", *,
                block_bytes: Optional[int] = None) -> Iterator[Tuple[str, bool, bool]]:
    """Each line of a UTF-8 file as :func:`line_segments` gives it, a long line in pieces (memory bounded).

    Raises:
      DataError: the file is missing or not UTF-8.
    """
    try:
        for block in TextBlocks(path, what, block_bytes=block_bytes, nul_limit=0):
            yield from line_segments(block.text, block.continues, block.ends_line)
    except FileNotFoundError:
        raise DataError(f"{what} {os.fspath(path)!r} does not exist; check the path") from None
    except IsADirectoryError:
        raise DataError(f"{what} {os.fspath(path)!r} is a folder; give the path of a file") from None


def check_text_file(path: PathLike, what: str = "text file", *, plain: bool = False) -> str:
    """Checks that ``path`` is a non-empty UTF-8 text file, or a source of another format with text.

    The whole file is read once (in blocks of bounded size, whatever its
    line lengths), so a bad byte anywhere is found here rather than half-way
    through training. A source of another format
    (:mod:`lmkit.data.formats`) is read through its library, each record
    checked for its text.

    Args:
      path: the file, or a ``datasets`` folder (a path or a :class:`~lmkit.data.formats.Source`).
      what: how error messages call it, e.g. ``"train_file"``.
      plain: read the file's bytes as they are, whatever its name (an encoder-decoder's files).

    Returns:
      ``path`` as a ``str``.

    Raises:
      DataError: the file is missing, a folder, unreadable, empty (or only
        blank lines), binary (a NUL byte in its first MiB), or not UTF-8
        (naming the line and the byte); a record without its text (naming
        the record and the fields present); a library its format needs that
        is not installed.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise DataError(f"{what} {path!r} does not exist; check the path")
    if os.path.isdir(path) and (plain or not formats.is_dataset_folder(path)):
        raise DataError(f"{what} {path!r} is a folder; give the path of a UTF-8 text file" +
                        ("" if plain else " (or of a datasets folder, written by save_to_disk)"))
    blocks = TextBlocks(path, what, nul_limit=BINARY_PROBE_BYTES, plain=plain)
    blank = True
    try:
        for block in blocks:
            blank = blank and not block.text.strip()
    except OSError as exc:
        raise DataError(f"{what} {path!r} cannot be read ({exc.strerror}); "
                        "check its permissions") from None
    if not plain and formats.holds_records(path) and blank:
        raise DataError(f"{what} {path!r} has no text (no record, or only empty ones); give a file whose "
                        "records hold text")
    if blocks.lines == 0:
        raise DataError(f"{what} {path!r} is empty; give a file with text, one sentence or "
                        "paragraph a line")
    if blank:
        raise DataError(f"{what} {path!r} has only blank lines ({blocks.lines}); give a file with text, "
                        "one sentence or paragraph a line")
    return path


def line_words(text: str, document_end: Optional[str] = None) -> int:
    """The whitespace-separated words of ``text``, each ``document_end`` in it one word of its own (it is
    one id, counted as an end-of-line id is: :attr:`lmkit.data.tokenizers.Tokenizer.document_end`)."""
    return len((text.replace(document_end, f" {document_end} ") if document_end else text).split())


def count_words(source: Union[PathLike, Iterable[str]], *, line_ends: bool = False,
                document_end: Optional[str] = None) -> int:
    """The number of whitespace-separated words of a text.

    Args:
      source: a UTF-8 file (a ``str`` is always a path; read in bounded
        pieces) or an iterable of lines.
      line_ends: also count one word per non-blank line, for streams that end
        every line with an end-of-sentence id (as PTB counts ``<eos>``).
      document_end: a text that counts as a word wherever it stands (:func:`line_words`).

    Returns:
      The count.

    Raises:
      DataError: the file is missing or not UTF-8.
    """
    if isinstance(source, (str, os.PathLike)):
        pieces: Iterable[Tuple[str, bool, bool]] = text_pieces(source)
    else:
        pieces = ((line, bool(line.strip()), True) for line in source)
    words = 0
    for text, has_text, ends in pieces:
        words += line_words(text, document_end) + (1 if line_ends and ends and has_text else 0)
    return words


def content_sample(path: PathLike, size: int, sample_bytes: int = SAMPLE_BYTES) -> str:
    """The sha256 (hex) of a file's first and last ``sample_bytes`` and its ``size``: a cheap check that a
    file with the same path, size and modification time (``cp -p``, ``rsync -t``) has the same text.

    Raises:
      OSError: the file cannot be read.
    """
    digest = hashlib.sha256(str(int(size)).encode("ascii") + b":")
    with open(os.fspath(path), "rb") as f:
        digest.update(f.read(sample_bytes))
        if size > sample_bytes:
            f.seek(max(sample_bytes, size - sample_bytes))
            digest.update(f.read(sample_bytes))
    return digest.hexdigest()


def source_identity(path: PathLike) -> Dict[str, object]:
    """What the caches key a source on: its absolute path, size, modification time and a sample of its
    content (:func:`content_sample`; a ``datasets`` folder: of each of its files), and for JSON Lines,
    Parquet and ``datasets`` folders their format and where the text is (``read``).

    A plain text file, compressed or not, has no ``read``: its keys are those lmkit gave it before formats.

    Raises:
      OSError: a file of the source cannot be read (FileNotFoundError: it does not exist).
    """
    name = os.fspath(path)
    files = formats.source_files(path)
    if files == [name]:
        st = os.stat(name)
        identity: Dict[str, object] = {"path": os.path.abspath(name), "size": int(st.st_size),
                                       "mtime_ns": int(st.st_mtime_ns), "sample": content_sample(name, st.st_size)}
    else:  # a folder: its files together
        digest, size, mtime = hashlib.sha256(), 0, 0
        for file in files:
            st = os.stat(file)
            size, mtime = size + st.st_size, max(mtime, st.st_mtime_ns)
            record = [os.path.relpath(file, name), st.st_size, st.st_mtime_ns, content_sample(file, st.st_size)]
            digest.update(json.dumps(record).encode("utf-8"))
        identity = {"path": os.path.abspath(name), "size": int(size), "mtime_ns": int(mtime),
                    "sample": digest.hexdigest()}
    read = formats.read_options(path)
    if read:
        identity["read"] = read
    return identity
