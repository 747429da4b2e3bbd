"""Compressed plain text and JSON Lines: ``.gz`` and ``.bz2`` (the standard library), ``.zst`` (zstandard).

Each opener turns the compressed bytes of a file into the bytes they hold,
read as a stream (memory does not grow with the file); a damaged or
truncated file is one :class:`~lmkit.data.errors.DataError` naming it.
"""

from __future__ import annotations

import bz2
import gzip
import io
import os
import zlib
from typing import Any, BinaryIO, Callable, Dict

from lmkit.data.errors import DataError
from lmkit.data.formats.base import READ_BYTES, Checked, buffered, import_library

__all__ = ["COMPRESSIONS", "decompressed"]

#: Compressed bytes fed to the zstd decoder at a time (its output for them is held whole).
ZSTD_FEED_BYTES = 1 << 16
# The command that tests a file of each compression (named in the message about a damaged one).
_TEST_COMMAND = {"gzip": "gzip -t", "bzip2": "bzip2 -t", "zstd": "zstd -t"}


def _failure(source: str, what: str, name: str) -> Callable[[BaseException], DataError]:
    def failure(exc: BaseException) -> DataError:
        return DataError(f"{what} {os.fspath(source)!r} is damaged or not {name} ({exc}); test it with "
                         f"`{_TEST_COMMAND[name]} {os.fspath(source)}`, or give it uncompressed")
    return failure


def _gzip(raw: BinaryIO, source: str, what: str) -> BinaryIO:
    reader = gzip.GzipFile(fileobj=raw, mode="rb")  # several members are one stream, as gzip -d gives
    return buffered(Checked(reader, (OSError, EOFError, zlib.error), _failure(source, what, "gzip")))


def _bzip2(raw: BinaryIO, source: str, what: str) -> BinaryIO:
    reader = bz2.BZ2File(raw, mode="rb")
    return buffered(Checked(reader, (OSError, EOFError), _failure(source, what, "bzip2")))


class _ZstdFrames(io.RawIOBase):
    """The frames of a zstd stream, one after the other, with an error for a truncated last frame.

    zstandard's ``stream_reader`` ends a truncated frame as if it were whole
    (0.25: no error, the text silently cut), so each frame is decoded by its
    own ``decompressobj``, which says when the frame ends.
    """

    def __init__(self, raw: BinaryIO, zstd: Any, failure: Callable[[BaseException], DataError]) -> None:
        super().__init__()
        self._raw, self._zstd, self._failure = raw, zstd, failure
        self._decoder: Any = None  # the frame being decoded
        self._input = b""  # compressed bytes read but not yet decoded
        self._output = memoryview(b"")
        self._at = 0

    def readable(self) -> bool:
        return True

    def _decode(self) -> bool:
        """Decodes the next piece of input into ``_output``; False at the end of the stream."""
        if not self._input:
            self._input = self._raw.read(ZSTD_FEED_BYTES)
            if not self._input:
                if self._decoder is not None:  # the file ends inside a frame
                    raise self._failure(EOFError("the last frame is cut short"))
                return False
        if self._decoder is None:
            self._decoder = self._zstd.ZstdDecompressor().decompressobj()
        piece, self._input = self._input[:ZSTD_FEED_BYTES], self._input[ZSTD_FEED_BYTES:]
        try:
            self._output, self._at = memoryview(self._decoder.decompress(piece)), 0
        except self._zstd.ZstdError as exc:
            raise self._failure(exc) from None
        if self._decoder.eof:  # the frame is complete: what follows it starts the next one
            self._input = self._decoder.unused_data + self._input
            self._decoder = None
        return True

    def readinto(self, buffer: Any) -> int:
        while self._at >= len(self._output):
            if not self._decode():
                return 0
        n = min(len(buffer), len(self._output) - self._at)
        buffer[:n] = self._output[self._at:self._at + n]
        self._at += n
        return n


def _zstd(raw: BinaryIO, source: str, what: str) -> BinaryIO:
    zstd = import_library("zstandard", "zstandard", source, what, "a zstd-compressed file")
    return buffered(_ZstdFrames(raw, zstd, _failure(source, what, "zstd")), READ_BYTES)


#: suffix -> the opener of its compressed bytes: ``opener(raw file, source, what) -> the bytes it holds``
COMPRESSIONS: Dict[str, Callable[[BinaryIO, str, str], BinaryIO]] = {".gz": _gzip, ".bz2": _bzip2, ".zst": _zstd}


def decompressed(raw: BinaryIO, suffix: str, source: str, what: str) -> BinaryIO:
    """The bytes that the compressed ``raw`` file (of the compression ``suffix``) holds, as a stream."""
    return COMPRESSIONS[suffix](raw, source, what)
