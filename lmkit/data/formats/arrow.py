"""The text column of Arrow data (Parquet files, ``datasets`` folders): checked, then read in batches."""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Iterator, List, Tuple

from lmkit.data.errors import DataError
from lmkit.data.formats.base import Source, missing_name, record_bytes

__all__ = ["BATCH_ROWS", "check_text_column", "column_texts"]

#: Records converted to Python strings at a time (a batch's texts are held, never a whole table's).
BATCH_ROWS = 1024


def _is_text(kind: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    string_view = getattr(pa.types, "is_string_view", lambda _: False)  # pyarrow >= 16
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or string_view(kind)


def check_text_column(schema: Any, source: Source, what: str) -> str:
    """The name of ``source``'s text column, checked to be in ``schema`` (a pyarrow Schema) and to hold strings.

    Raises:
      DataError: no such column, or one of another type (naming the columns present).
    """
    column = source.text_column
    names = list(schema.names)
    if column not in names:
        raise DataError(f"{what} {os.fspath(source)!r} has no column {column!r}; "
                        f"{missing_name(column, names, '--text_column')}")
    kind = schema.field(column).type
    if not _is_text(kind):
        listed = ", ".join(f"{name} ({schema.field(name).type})" for name in names)
        raise DataError(f"{what} {os.fspath(source)!r}: the column {column!r} holds {kind}, not strings (record 1 "
                        f"on); set --text_column to the column that holds the text (columns: {listed})")
    return column


def column_texts(batches: Iterable[Any], source: Source, what: str, errors: Tuple[type, ...],
                 done: Callable[[int], None]) -> Iterator[Tuple[bytes, ...]]:
    """The texts of the one column of each batch (pyarrow RecordBatch or Table), checked record by record.

    Args:
      batches: the batches, in order.
      source, what: the source and how messages call it.
      errors: the library's errors while reading (a damaged file): a DataError naming the source.
      done: called with the number of records read so far after each batch.
    """
    records = 0
    iterator = iter(batches)
    while True:
        try:
            batch = next(iterator, None)
        except errors as exc:
            raise DataError(f"{what} {os.fspath(source)!r} cannot be read after record {records} ({exc}); "
                            "check the file, or write it again") from None
        if batch is None:
            return
        values: List[Any] = batch.column(0).to_pylist()
        yield tuple(record_bytes(value, source, what, f"record {records + k + 1}", source.text_column,
                                 "--text_column", "column") for k, value in enumerate(values))
        records += len(values)
        done(records)
