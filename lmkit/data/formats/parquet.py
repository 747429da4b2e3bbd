"""Parquet files (``.parquet``): the text in the column ``--text_column`` (default ``text``), one record a document.

Read with pyarrow (optional: ``pip install "lmkit[data]"``), a row group at
a time, in batches of :data:`~lmkit.data.formats.arrow.BATCH_ROWS` rows of
that column only, so memory holds about a row group, never the table.
"""

from __future__ import annotations

import os
from typing import BinaryIO, Callable, Dict, Iterator, Tuple

from lmkit.data.errors import DataError
from lmkit.data.formats.arrow import BATCH_ROWS, check_text_column, column_texts
from lmkit.data.formats.base import RecordText, Source, TableFormat, buffered, import_library, lines_of

__all__ = ["Parquet"]


class Parquet(TableFormat):
    """``.parquet`` files (their compression is their own: a ``.parquet.gz`` is refused)."""

    name = "parquet"
    suffixes = (".parquet",)
    kind = "a Parquet file"

    def options(self, source: Source) -> Dict[str, str]:
        return {"text_column": source.text_column}

    def open(self, source: Source, what: str) -> Tuple[BinaryIO, Callable[[], float]]:
        pq = import_library("pyarrow.parquet", "pyarrow", source, what, self.kind)
        import pyarrow as pa

        try:
            table = pq.ParquetFile(os.fspath(source))
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{what} {os.fspath(source)!r} is not a Parquet file ({exc}); give a .parquet file "
                            "(pyarrow.parquet.write_table writes one), or rename a file of another kind") from None
        try:
            column = check_text_column(table.schema_arrow, source, what)
        except DataError:
            table.close()
            raise
        rows = max(1, table.metadata.num_rows)
        read = [0]

        def batches() -> Iterator[object]:
            # A row group at a time: one iter_batches over the whole file held about the file's size in
            # Arrow memory (pyarrow 26: 208 MB for a 221 MB file of 80 row groups), a row group's iter_batches
            # holds about one row group (10 MB).
            for group in range(table.num_row_groups):
                yield from table.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=[column],
                                              use_threads=False)

        def texts() -> Iterator[Tuple[bytes, ...]]:
            with table:
                yield from column_texts(batches(), source, what, (pa.ArrowException, OSError),
                                        lambda n: read.__setitem__(0, n))

        return buffered(RecordText(lines_of(texts(), source))), lambda: read[0] / rows
