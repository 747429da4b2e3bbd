"""What the source formats share: a :class:`Source`, the stream a format reads into, the checks of a record.

Every format gives the text of a source as the bytes of a plain UTF-8 text
file: a record's text, then a line break (:class:`RecordText`). So the
readers of plain text (the token cache's blocks, the tokenizers' training,
the word counts) read any format unchanged, and a record's text ends with the
end-of-text id as a line of a plain file does.
"""

from __future__ import annotations

import importlib
import io
import os
from typing import Any, BinaryIO, Callable, ClassVar, Dict, Iterator, List, Optional, Tuple

from lmkit.core.checks import did_you_mean
from lmkit.data.errors import DataError

__all__ = ["Source", "source_of", "Format", "StreamFormat", "TableFormat", "RecordText", "Checked",
           "import_library", "record_bytes", "missing_name", "lines_of", "buffered", "INSTALL", "READ_BYTES"]

#: The install command that brings pyarrow, datasets and zstandard.
INSTALL = 'pip install "lmkit[data]"'
#: Bytes a format reads or holds at a time (records are gathered into chunks about this large).
READ_BYTES = 1 << 20
# How messages call a value that is not a string (what json and pyarrow give).
_KINDS = {dict: "an object", list: "a list", bool: "a boolean", int: "a number", float: "a number",
          bytes: "bytes"}


class Source(str):
    """A path to read text from (the string itself) and where the text is in its records.

    A plain ``str`` path reads with the defaults. A ``Source`` is a ``str``
    so that it goes, unchanged, wherever a path went before formats
    (messages, ``open``, ``os.path``, the lists of files the tokenizers and
    the token cache take); it compares and hashes as its path. What
    ``os.path`` and ``str`` methods make of it is a plain ``str`` with the
    default options, so code that reads a source passes the ``Source`` on
    (:func:`lmkit.data.sources.resolve_sources` gives a folder's or a
    pattern's files their ``Source``'s options).

    Attributes:
      text_field: JSON Lines: the field of each record that holds its text.
      text_column: Parquet files and ``datasets`` folders: the column that holds the text.
      dataset_split: a ``DatasetDict`` folder: the split to read (``train``, ``validation`` or ``test``;
        not ``split``, which would hide ``str.split``).
      record_end: records (JSON Lines, Parquet, ``datasets``): the text that ends each record's text in
        place of a line break, e.g. ``"<|endoftext|>"``, the document separator of a pretrained
        tokenizer (:func:`lmkit.data.formats.documents_for`); ``""``: a line break.
    """

    text_field: str
    text_column: str
    dataset_split: str
    record_end: str

    def __new__(cls, path: Any, text_field: str = "text", text_column: str = "text",
                dataset_split: str = "train", record_end: str = "") -> "Source":
        self = super().__new__(cls, os.fspath(path))
        self.text_field, self.text_column = str(text_field), str(text_column)
        self.dataset_split, self.record_end = str(dataset_split), str(record_end)
        return self

    def __reduce__(self) -> Tuple[Any, Tuple[str, ...]]:  # ranks send sources to each other
        return Source, (str(self), self.text_field, self.text_column, self.dataset_split, self.record_end)

    def options(self) -> Dict[str, str]:
        """The reading options, as keywords of ``Source``."""
        return {"text_field": self.text_field, "text_column": self.text_column, "dataset_split": self.dataset_split,
                "record_end": self.record_end}

    def at(self, path: Any) -> "Source":
        """Another path read with these options."""
        return Source(path, **self.options())


def source_of(path: Any) -> Source:
    """``path`` as a :class:`Source` (a plain path gets the default options)."""
    return path if isinstance(path, Source) else Source(path)


class Format:
    """One way a source holds its text; a subclass is :class:`StreamFormat` or :class:`TableFormat`.

    Attributes:
      name: what messages and the caches' keys call it.
      suffixes: the file names it reads (lower case); empty for a folder.
      kind: how messages describe a source of it (``"a Parquet file"``).
    """

    name: ClassVar[str] = ""
    suffixes: ClassVar[Tuple[str, ...]] = ()
    kind: ClassVar[str] = ""

    def options(self, source: Source) -> Dict[str, str]:
        """The options of ``source`` this format reads (they key the caches): none by default."""
        return {}

    def files(self, source: Source) -> List[str]:
        """The files that hold ``source``'s data (a file: itself)."""
        return [os.fspath(source)]


class StreamFormat(Format):
    """A format read from the bytes of its file (plain text, JSON Lines), decompressed on the way."""

    def read(self, stream: BinaryIO, source: Source, what: str) -> BinaryIO:
        """The text of the (decompressed) ``stream`` as plain-text bytes, buffered."""
        raise NotImplementedError


class TableFormat(Format):
    """A format that a library opens by its path (Parquet, a ``datasets`` folder)."""

    def open(self, source: Source, what: str) -> Tuple[BinaryIO, Callable[[], float]]:
        """``(the text as plain-text bytes, buffered; the share of the records read so far, 0..1)``."""
        raise NotImplementedError


class RecordText(io.RawIOBase):
    """The chunks of an iterator of ``bytes`` as one readable stream (records' texts, each line-ended)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        super().__init__()
        self._chunks = chunks
        self._chunk = memoryview(b"")
        self._at = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._at >= len(self._chunk):
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._chunk, self._at = memoryview(chunk), 0
        n = min(len(buffer), len(self._chunk) - self._at)
        buffer[:n] = self._chunk[self._at:self._at + n]
        self._at += n
        return n

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:  # a generator: its ``with`` blocks close the files it reads
            close()
        super().close()


class Checked(io.RawIOBase):
    """A readable whose library errors (``errors``) become the :class:`DataError` ``failure(exc)`` gives."""

    def __init__(self, inner: Any, errors: Tuple[type, ...], failure: Callable[[BaseException], DataError]) -> None:
        super().__init__()
        self._inner, self._errors, self._failure = inner, errors, failure

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            return self._inner.readinto(buffer)
        except DataError:
            raise
        except self._errors as exc:
            raise self._failure(exc) from None


def import_library(module: str, package: str, source: str, what: str, kind: str) -> Any:
    """The module ``module`` of the optional ``package``, or a DataError naming the file that needs it.

    Raises:
      DataError: ``train_file 'a.parquet' is a Parquet file, read with the pyarrow package, which is not
        installed; ...``.
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise DataError(f"{what} {os.fspath(source)!r} is {kind}, read with the {package} package, which is not "
                        f"installed; {INSTALL} (or pip install {package})") from None


def missing_name(name: str, present: Any, flag: str) -> str:
    """The end of a message about a field or column ``name`` that is not among ``present``."""
    listed = did_you_mean(name, [str(p) for p in present], listing="present")
    return f"{listed}; set {flag} to the one that holds the text"


def record_bytes(value: Any, source: str, what: str, record: str, name: str, flag: str,
                 unit: str = "field") -> bytes:
    """The UTF-8 bytes of a record's text ``value``, checked.

    Args:
      value: the value under the text field or column.
      source, what: the file and how messages call it (``train_file``).
      record: how messages name the record (``record 3 (line 4)``).
      name: the field or column.
      flag: the flag that names another (``--text_field``).
      unit: ``field`` or ``column``.

    Raises:
      DataError: the value is not a string (None included), holds a NUL
        character, or is not valid Unicode (a lone surrogate).
    """
    where = f"{what} {os.fspath(source)!r}: {record}"
    if not isinstance(value, str):
        got = "null" if value is None else _KINDS.get(type(value), f"a {type(value).__name__}")
        raise DataError(f"{where} has {got} in the {unit} {name!r}, not a string; give every record its text, "
                        f"or set {flag} to the {unit} that holds the text")
    if "\0" in value:
        raise DataError(f"{where} has a NUL character in its text (at character {value.index(chr(0))}); "
                        "remove it (text holds none)")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DataError(f"{where} has text that is not valid Unicode ({exc.reason} at character {exc.start}); "
                        "repair the record") from None


def lines_of(chunks: Iterator[Tuple[bytes, ...]], source: Source) -> Iterator[bytes]:
    """Groups of records' bytes as chunks of plain text: each record, then a line break, or the source's
    ``record_end`` (then a record of only white space is left out, as a blank line is)."""
    end = source_of(source).record_end.encode("utf-8")
    for texts in chunks:
        if end:
            chunk = b"".join(text + end for text in texts if text.strip())
            if chunk:
                yield chunk
        elif texts:
            yield b"\n".join(texts) + b"\n"


def buffered(raw: io.RawIOBase, size: Optional[int] = None) -> BinaryIO:
    """``raw`` behind a read buffer (so it also reads by lines)."""
    return io.BufferedReader(raw, size or READ_BYTES)  # type: ignore[return-value]
