"""Text files a user gives: one check for all of them, and their word counts.

:func:`check_text_file` turns every way a text file can be unusable (missing,
a folder, empty, binary, not UTF-8) into one
:class:`~lmkit.data.errors.DataError` that names the file, what is wrong
with it and the fix, before a tokenizer is trained or a stream encoded.

:func:`count_words` gives the denominator of perplexity per word (see
``docs/data.md``): the whitespace-separated words of a text, plus one per
non-blank line when the id stream ends every line with an end-of-sentence id.
"""

from __future__ import annotations

import os
from typing import Iterable, Union

from lmkit.data.errors import DataError
from lmkit.data.vocab import read_lines
from lmkit.fileio import PathLike

__all__ = ["check_text_file", "count_words", "BINARY_PROBE_BYTES"]

# A NUL byte in this much of the head marks a binary file (UTF-8 text has none).
BINARY_PROBE_BYTES = 1 << 20


def check_text_file(path: PathLike, what: str = "text file") -> str:
    """Checks that ``path`` is a non-empty UTF-8 text file.

    The whole file is read once (line by line), so a bad byte anywhere is
    found here rather than half-way through training.

    Args:
      path: the file.
      what: how error messages call it, e.g. ``"train_file"``.

    Returns:
      ``path`` as a ``str``.

    Raises:
      DataError: the file is missing, a folder, unreadable, empty (or only
        blank lines), binary (a NUL byte in its first MiB), or not UTF-8
        (naming the line and the byte).
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise DataError(f"{what} {path!r} does not exist; check the path")
    if os.path.isdir(path):
        raise DataError(f"{what} {path!r} is a folder; give the path of a UTF-8 text file")
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise DataError(f"{what} {path!r} cannot be read ({exc.strerror}); "
                        "check its permissions") from None
    lines = 0
    blank = True
    with handle:
        nul = handle.read(BINARY_PROBE_BYTES).find(b"\0")
        if nul >= 0:
            raise DataError(f"{what} {path!r} is a binary file (a NUL byte at offset {nul}), "
                            "not text; give a UTF-8 text file, one sentence or paragraph a line")
        handle.seek(0)
        # A UTF-8 multi-byte character never contains b"\n", so splitting the
        # raw bytes on it before decoding is safe.
        for lines, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{what} {path!r} is not UTF-8: line {lines} has the byte "
                                f"0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line "
                                f"({exc.reason}); convert the file with e.g. "
                                f"`iconv -f LATIN1 -t UTF-8 {path} > fixed.txt`") from None
            blank = blank and not text.strip()
    if lines == 0:
        raise DataError(f"{what} {path!r} is empty; give a file with text, one sentence or "
                        "paragraph a line")
    if blank:
        raise DataError(f"{what} {path!r} has only blank lines ({lines}); give a file with text, "
                        "one sentence or paragraph a line")
    return path


def count_words(source: Union[PathLike, Iterable[str]], *, line_ends: bool = False) -> int:
    """The number of whitespace-separated words of a text.

    Args:
      source: a UTF-8 file (a ``str`` is always a path) or an iterable of
        lines.
      line_ends: also count one word per non-blank line, for streams that end
        every line with an end-of-sentence id (as PTB counts ``<eos>``).

    Returns:
      The count.

    Raises:
      DataError: the file is missing or not UTF-8.
    """
    lines = read_lines(source) if isinstance(source, (str, os.PathLike)) else source
    words = 0
    for line in lines:
        count = len(line.split())
        words += count + (1 if line_ends and count else 0)
    return words
