"""JSON Lines (``.jsonl``): one JSON object a line, its text under ``--text_field`` (default ``text``).

Read with the standard library's :mod:`json`, a line at a time; blank lines
are skipped. A record's text is one document, as a line of a plain text file
is (its own line breaks end lines too, as they would in a plain file).
"""

from __future__ import annotations

import json
import os
from typing import Any, BinaryIO, Dict, Iterator, List, Tuple

from lmkit.data.errors import DataError
from lmkit.data.formats.base import (
    READ_BYTES,
    RecordText,
    Source,
    StreamFormat,
    buffered,
    lines_of,
    missing_name,
    record_bytes,
)

__all__ = ["JsonLines"]

_BOM = b"\xef\xbb\xbf"


class JsonLines(StreamFormat):
    """``.jsonl`` files (compressed too: ``.jsonl.gz``, ``.jsonl.zst``, ``.jsonl.bz2``)."""

    name = "jsonl"
    suffixes = (".jsonl",)
    kind = "a JSON Lines file"

    def options(self, source: Source) -> Dict[str, str]:
        return {"text_field": source.text_field}

    def read(self, stream: BinaryIO, source: Source, what: str) -> BinaryIO:
        return buffered(RecordText(lines_of(self._texts(stream, source, what), source)))

    def _texts(self, stream: BinaryIO, source: Source, what: str) -> Iterator[Tuple[bytes, ...]]:
        """The records' texts in groups of about :data:`READ_BYTES`."""
        field = source.text_field
        group: List[bytes] = []
        size = records = 0
        for number, line in enumerate(stream, 1):
            if number == 1 and line.startswith(_BOM):  # json.loads refuses it; editors on Windows write it
                line = line[len(_BOM):]
            if not line.strip():
                continue
            records += 1
            where = f"record {records} (line {number})"
            record = _parsed(line, source, what, where)
            if field not in record:
                raise DataError(f"{what} {os.fspath(source)!r}: {where} has no field {field!r}; "
                                f"{missing_name(field, record, '--text_field')}")
            text = record_bytes(record[field], source, what, where, field, "--text_field")
            group.append(text)
            size += len(text)
            if size >= READ_BYTES:
                yield tuple(group)
                group, size = [], 0
        yield tuple(group)


def _parsed(line: bytes, source: Source, what: str, where: str) -> Dict[str, Any]:
    """The JSON object of one line; a DataError for anything else."""
    head = f"{what} {os.fspath(source)!r}: {where}"
    try:
        record = json.loads(line)
    except UnicodeDecodeError as exc:
        raise DataError(f"{head} is not UTF-8 (the byte 0x{line[exc.start]:02x} at byte {exc.start + 1}); "
                        "convert the file to UTF-8") from None
    except ValueError as exc:
        raise DataError(f"{head} is not JSON ({exc}); a .jsonl file holds one JSON object a line, "
                        'e.g. {"text": "..."}') from None
    if not isinstance(record, dict):
        raise DataError(f"{head} is a JSON {type(record).__name__}, not an object; a .jsonl file holds one "
                        'JSON object a line, e.g. {"text": "..."}')
    return record
