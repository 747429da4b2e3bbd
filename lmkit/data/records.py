"""Whole records of a source, as dicts: what a conversation or a prompt/completion pair is read from.

The formats of :mod:`lmkit.data.formats` give a source's *text* (one field
or column of each record). A chat example needs the whole record instead
(``messages``, or ``prompt`` and ``completion``), so :func:`read_records`
reads the same sources record by record:

==========================  ==========================================
source                      its records
==========================  ==========================================
``a.jsonl`` (``.gz``,       each line's JSON object (blank lines
``.bz2``, ``.zst``)         skipped)
``a.parquet``               each row, as a dict of its columns
a ``save_to_disk`` folder   each row of the split the source names
plain text (compressed or   each line, as ``{"text": line}`` (blank
not)                        lines skipped)
==========================  ==========================================

Each record comes with how messages name it (``record 3 (line 4)``), so a
bad record is reported at its place in the file.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator, Tuple

from lmkit.data.errors import DataError
from lmkit.data.formats import format_of, source_of
from lmkit.data.formats.base import import_library
from lmkit.data.formats.compressed import decompressed
from lmkit.data.formats.datasets_folder import is_dataset_dict
from lmkit.data.formats.jsonl import _parsed

__all__ = ["read_records", "Record"]

#: ``(where, record)``: how messages name the record (``record 3 (line 4)``) and its fields.
Record = Tuple[str, Dict[str, Any]]
_BOM = b"\xef\xbb\xbf"
_BATCH_ROWS = 1024


def read_records(path: Any, what: str = "train_file") -> Iterator[Record]:
    """The records of a source (a path or :class:`~lmkit.data.formats.Source`), one at a time.

    Args:
      path: a JSON Lines, Parquet or plain text file (compressed or not), or a ``datasets`` folder.
      what: how messages call the source (``train_file``).

    Yields:
      ``(where, record)`` (:data:`Record`).

    Raises:
      DataError: a line that is not a JSON object, a file that is not of its format, a missing
        library (naming the install command), a split a ``DatasetDict`` folder lacks.
      OSError: a file that cannot be opened.
    """
    source = source_of(path)
    fmt, compression = format_of(source)
    if compression and fmt.name in ("parquet", "datasets"):
        raise DataError(f"{what} {os.fspath(source)!r} is {fmt.kind} compressed as a whole, which is not read; "
                        f"{fmt.name} compresses its own data: give the {fmt.name} file itself")
    if fmt.name == "parquet":
        yield from _numbered(_parquet_rows(source, what))
    elif fmt.name == "datasets":
        yield from _numbered(_dataset_rows(source, what))
    else:
        with open(os.fspath(source), "rb") as raw:
            stream = decompressed(raw, compression, source, what) if compression else raw
            yield from _lines(stream, source, what, fmt.name == "jsonl")


def _numbered(rows: Iterator[Dict[str, Any]]) -> Iterator[Record]:
    for number, row in enumerate(rows, 1):
        yield f"record {number}", row


def _lines(stream: Any, source: str, what: str, jsonl: bool) -> Iterator[Record]:
    """The records of a line-based file: JSON objects (``jsonl``) or lines of text as ``{"text": line}``."""
    records = 0
    for number, line in enumerate(stream, 1):
        if number == 1 and line.startswith(_BOM):
            line = line[len(_BOM):]
        if not line.strip():
            continue
        records += 1
        where = f"record {records} (line {number})"
        if jsonl:
            yield where, _parsed(line, source, what, where)
            continue
        try:
            yield where, {"text": line.decode("utf-8").rstrip("\n").rstrip("\r")}
        except UnicodeDecodeError as exc:
            raise DataError(f"{what} {os.fspath(source)!r}: {where} is not UTF-8 (at byte {exc.start + 1}); "
                            "convert the file to UTF-8") from None


def _parquet_rows(source: str, what: str) -> Iterator[Dict[str, Any]]:
    pq = import_library("pyarrow.parquet", "pyarrow", source, what, "a Parquet file")
    import pyarrow as pa

    try:
        table = pq.ParquetFile(os.fspath(source))
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{what} {os.fspath(source)!r} is not a Parquet file ({exc}); give a .parquet file "
                        "(pyarrow.parquet.write_table writes one)") from None
    with table:
        for batch in table.iter_batches(batch_size=_BATCH_ROWS, use_threads=False):
            yield from batch.to_pylist()


def _dataset_rows(source: Any, what: str) -> Iterator[Dict[str, Any]]:
    datasets = import_library("datasets", "datasets", source, what, "a datasets folder (save_to_disk)")
    try:
        loaded = datasets.load_from_disk(os.fspath(source))
    except (OSError, ValueError, KeyError) as exc:
        raise DataError(f"{what} {os.fspath(source)!r} looks like a datasets folder but datasets.load_from_disk "
                        f"cannot read it ({exc}); write it again with save_to_disk") from None
    if is_dataset_dict(os.fspath(source)):
        split = source.dataset_split
        if split not in loaded:
            raise DataError(f"{what} {os.fspath(source)!r} is a DatasetDict folder with the splits "
                            f"{', '.join(sorted(loaded)) or 'none'} and no {split!r} split, which {what} reads; "
                            "name a split's own folder instead")
        loaded = loaded[split]
    for batch in loaded.with_format("arrow").iter(batch_size=_BATCH_ROWS):
        yield from batch.to_pylist()

