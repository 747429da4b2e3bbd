"""Plain UTF-8 text: one document a line, read as it is (the other formats are turned into this)."""

from __future__ import annotations

from typing import BinaryIO

from lmkit.data.formats.base import Source, StreamFormat

__all__ = ["PlainText"]


class PlainText(StreamFormat):
    """Any file whose name ends in no other format's suffix (``.txt``, ``.md``, none): its bytes as they are."""

    name = "text"
    kind = "a text file"

    def read(self, stream: BinaryIO, source: Source, what: str) -> BinaryIO:
        return stream
