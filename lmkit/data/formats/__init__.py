"""The formats a text source may have, read through the libraries that own them.

``--train_file`` (``--valid_file``, ``--test_file``) names, besides plain
UTF-8 text (one document a line):

==========================  ==============================================  ===============
source                      its documents                                   read with
==========================  ==============================================  ===============
``a.txt`` (any other name)  its lines                                       (itself)
``a.jsonl``                 each line's JSON object, its ``--text_field``   :mod:`json`
``a.parquet``               each row's ``--text_column``                    pyarrow
a ``save_to_disk`` folder   each row's ``--text_column`` (a DatasetDict:    datasets
                            the split of the flag)
``a.txt.gz``, ``.bz2``,     a plain text or JSON Lines file, compressed     gzip, bz2,
``.zst`` (``a.jsonl.zst``)                                                  zstandard
==========================  ==============================================  ===============

pyarrow, datasets and zstandard are optional (``pip install "lmkit[data]"``)
and imported only for a source that needs them. :func:`open_text` gives
any source's text as the bytes of a plain text file, a document's text then
a line break, so every reader of text (the token cache, the tokenizers'
training, the word counts) reads every format alike and a document ends with
the end-of-text id as a line of a plain file does. A pretrained tokenizer's
documents end with its own separator instead (GPT-2's ``<|endoftext|>``:
:func:`documents_for`), a line break inside a document staying its newline.

Adding a format is one :class:`~lmkit.data.formats.base.StreamFormat` or
:class:`~lmkit.data.formats.base.TableFormat` in its own module and one entry
in :data:`FORMATS`.
"""

from __future__ import annotations

import io
import os
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Sequence, Tuple

from lmkit.data.errors import DataError
from lmkit.data.formats.base import Format, Source, StreamFormat, TableFormat, source_of
from lmkit.data.formats.compressed import COMPRESSIONS, decompressed
from lmkit.data.formats.datasets_folder import SavedDataset, is_dataset_folder
from lmkit.data.formats.jsonl import JsonLines
from lmkit.data.formats.parquet import Parquet
from lmkit.data.formats.plain import PlainText

__all__ = ["FORMATS", "COMPRESSIONS", "DATASET_SPLITS", "Source", "source_of", "TextStream", "format_of",
           "open_text", "is_plain", "holds_records", "documents_for", "is_dataset_folder", "read_options",
           "source_files", "source_size", "text_lines"]

PLAIN = PlainText()
#: name -> format; a file is of the first whose suffix ends its name (less a compression's), else plain text.
FORMATS: Dict[str, Format] = {f.name: f for f in (PLAIN, JsonLines(), Parquet(), SavedDataset())}
#: A DatasetDict folder gives each split of a run its split of the same name: train, valid(ation), test.
DATASET_SPLITS = {"train": "train", "valid": "validation", "test": "test"}


def format_of(path: Any) -> Tuple[Format, str]:
    """``(the format of path, its compression suffix or "")``, by its name (a folder: by its files)."""
    path = os.fspath(path)
    if os.path.isdir(path) and is_dataset_folder(path):
        return FORMATS["datasets"], ""
    name = os.path.basename(path).lower()
    compression = next((suffix for suffix in COMPRESSIONS if name.endswith(suffix)), "")
    inner = name[:len(name) - len(compression)]
    for fmt in FORMATS.values():
        if fmt.suffixes and inner.endswith(fmt.suffixes):
            return fmt, compression
    return PLAIN, compression


def is_plain(path: Any) -> bool:
    """Whether ``path`` is read as it is: plain text, not compressed."""
    return format_of(path) == (PLAIN, "")


def holds_records(path: Any) -> bool:
    """Whether ``path`` holds records (JSON Lines, Parquet, a ``datasets`` folder), one document each."""
    return format_of(path)[0] is not PLAIN


def read_options(path: Any) -> Dict[str, str]:
    """What the caches key a source on besides its files: its format and the options it reads
    (``{}`` for plain text, compressed or not, so that its keys are those of before formats)."""
    source = source_of(path)
    fmt, _ = format_of(source)
    if fmt is PLAIN:
        return {}
    ended = {"record_end": source.record_end} if source.record_end else {}
    return {"format": fmt.name, **fmt.options(source), **ended}


def documents_for(tokenizer: Any, sources: Sequence[Any]) -> List[Any]:
    """``sources`` as ``tokenizer`` separates their documents: each source of records (JSON Lines, Parquet,
    a ``datasets`` folder) ends each record with the tokenizer's ``document_end`` text (a pretrained
    tokenizer's ``<|endoftext|>``, one id) instead of a line break; the others unchanged.

    lmkit's own tokenizers have no ``document_end``: their end-of-line id ends a document as it ends a
    line of a plain file. A line break inside a record stays a line break.
    """
    end = getattr(tokenizer, "document_end", None)
    if not end:
        return list(sources)
    out = []
    for path in sources:
        source = source_of(path)
        out.append(Source(source, **{**source.options(), "record_end": end}) if holds_records(source) else path)
    return out


def source_files(path: Any) -> List[str]:
    """The files that hold a source's data: a file itself, a ``datasets`` folder's files."""
    source = source_of(path)
    return format_of(source)[0].files(source)


def source_size(path: Any) -> int:
    """A source's bytes on disk (compressed as they are; a folder's files together)."""
    return sum(os.path.getsize(f) for f in source_files(path))


class TextStream:
    """A source's text as the bytes of a plain UTF-8 text file (:func:`open_text`); a context manager.

    Attributes:
      reader: the buffered bytes (``read(n)``, lines).
    """

    def __init__(self, reader: BinaryIO, consumed: Callable[[], int], closers: Sequence[Any]) -> None:
        self.reader = reader
        self._consumed = consumed
        self._closers = closers
        self._final: Any = None  # bytes consumed when closed

    def read(self, n: int = -1) -> bytes:
        """At most ``n`` bytes of text (b"" at the end)."""
        return self.reader.read(n)

    @property
    def consumed(self) -> int:
        """Bytes of the source on disk read so far (progress: a compressed file's compressed bytes)."""
        return int(self._consumed()) if self._final is None else self._final

    def close(self) -> None:
        if self._final is None:
            self._final = self.consumed
            for closable in self._closers:
                closable.close()

    def __enter__(self) -> "TextStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_text(path: Any, what: str = "text file") -> TextStream:
    """The text of a source (a path or :class:`Source`) as plain-text bytes: each document, then a line break.

    Args:
      path: the file or ``datasets`` folder.
      what: how messages call it, e.g. ``"train_file"``.

    Raises:
      DataError: a library that is missing (``pip install "lmkit[data]"``),
        a file that is not of its format, a record without its text
        (naming the file, the record and the fields present).
      OSError: a plain file cannot be opened (missing, a folder).
    """
    source = source_of(path)
    fmt, compression = format_of(source)
    if isinstance(fmt, TableFormat):
        if compression:
            raise DataError(f"{what} {os.fspath(source)!r} is {fmt.kind} compressed as a whole, which is not read; "
                            f"{fmt.name} compresses its own data: give the {fmt.name} file itself")
        size = source_size(source)
        reader, share = fmt.open(source, what)
        return TextStream(reader, lambda: round(size * share()), [reader])
    assert isinstance(fmt, StreamFormat)
    raw = open(os.fspath(source), "rb")
    try:
        stream = decompressed(raw, compression, source, what) if compression else raw
        reader = fmt.read(stream, source, what)
    except BaseException:
        raw.close()
        raise
    return TextStream(reader, raw.tell, [reader, stream, raw])


def text_lines(path: Any, what: str = "text file") -> Iterator[str]:
    """The lines of a source's text without their line ends (a ``"\\r"`` ends one too), for text read whole.

    Raises:
      DataError: as :func:`open_text`; plain text that is missing or not UTF-8.
    """
    if is_plain(path):
        from lmkit.data.vocab import read_lines
        yield from read_lines(path)
        return
    with open_text(path, what) as stream:
        for line in io.TextIOWrapper(stream.reader, encoding="utf-8", newline=""):
            yield line.rstrip("\n").rstrip("\r")
