"""Download one file over http(s) or ``file://`` with progress, retries and resume.

Only the standard library (``urllib``) is used. The bytes go to a file of
this download's own, ``<dest>.<random>.part``, which replaces ``dest`` only
once complete, so ``dest`` is never a half file and two jobs that download
the same file into one folder do not write into each other's bytes. The
``.part`` file is claimed (:func:`lmkit.core.fileio.claimed`) while it is written:
one left by a killed job is removed by the next download of that file.
A download stops as soon as it passes ``max_bytes``, so a wrong mirror
cannot fill the disk before the hash is checked. A broken transfer is retried after a back-off and resumed
with an HTTP ``Range`` request; a server that answers the range with a full
``200`` response makes the download start over. A wrong address (404,
connection refused, unknown host, missing file) fails at once with one
:class:`~lmkit.data.errors.DataError` and leaves nothing behind.

:func:`git_blob_sha1` and :func:`file_blob_sha1` give the id git gives a
file, to check a download against a file of a public repository.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Optional, TextIO, Tuple

from lmkit.core.fileio import claimed, make_temp_file, sweep_unclaimed
from lmkit.data.errors import DataError

__all__ = ["download", "SUPPORTED_SCHEMES", "blob_hasher", "git_blob_sha1", "file_blob_sha1"]

SUPPORTED_SCHEMES = ("http", "https", "file")
_CHUNK = 1 << 16
#: The size cap of a download unless the caller gives one (every lmkit caller gives its own).
DEFAULT_MAX_BYTES = 1 << 30
_MAX_BACKOFF = 30.0


class _Permanent(Exception):
    """A failure that a retry will not fix (wrong address, local disk error)."""


class _Incomplete(Exception):
    """The transfer ended before all bytes arrived; a retry may resume it."""


class _Progress:
    """Reports bytes, percent and speed on stderr.

    On a terminal one line is rewritten in place (``\\r``); otherwise (logs of
    batch jobs) a full line is written every ``interval`` seconds.
    """

    def __init__(self, label: str, enabled: bool, stream: Optional[TextIO] = None,
                 interval: Optional[float] = None) -> None:
        self.label = label
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty and isatty())
        self.interval = interval if interval is not None else (0.25 if self.tty else 5.0)
        self.start = time.monotonic()
        self.last = self.start
        self.width = 0  # length of the line now on a terminal

    def _line(self, done: int, total: Optional[int]) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-6)
        speed = done / elapsed  # every byte of dest arrived during this call
        if total:
            return (f"{self.label}: {100.0 * done / total:5.1f}% {_mb(done)}/{_mb(total)} MB "
                    f"{_mb(speed)} MB/s")
        return f"{self.label}: {_mb(done)} MB {_mb(speed)} MB/s"

    def update(self, done: int, total: Optional[int]) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.last < self.interval:
            return
        self.last = now
        self._write(self._line(done, total), final=False)

    def note(self, message: str) -> None:
        if self.enabled:
            self._write(f"{self.label}: {message}", final=True)

    def finish(self, done: int, total: Optional[int]) -> None:
        if self.enabled:
            self._write(self._line(done, total) + " done", final=True)

    def _write(self, text: str, final: bool) -> None:
        if self.tty:
            # Pad to the previous width so a shorter line leaves no stale characters.
            padded = text.ljust(self.width)
            self.width = 0 if final else len(text)
            self.stream.write("\r" + padded + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def blob_hasher(size: int) -> "hashlib._Hash":
    """A SHA-1 primed with git's blob header for ``size`` bytes; feed it the bytes.

    ``hexdigest()`` is then the id ``git hash-object`` gives the file, so a
    file can be checked against the blob id of a public repository.
    """
    return hashlib.sha1(b"blob %d\0" % size)


def git_blob_sha1(data: bytes) -> str:
    """Git's blob id of ``data``: ``sha1(b"blob %d\\0" % len(data) + data)``."""
    digest = blob_hasher(len(data))
    digest.update(data)
    return digest.hexdigest()


def file_blob_sha1(path: str) -> str:
    """Git's blob id of the file at ``path``, read in chunks."""
    digest = blob_hasher(os.path.getsize(path))
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f}"


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _parse_content_range(value: Optional[str]) -> Optional[tuple]:
    """``bytes 100-199/200`` -> (100, 199, 200); ``bytes */200`` -> (None, None, 200)."""
    if not value:
        return None
    match = re.match(r"\s*bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)\s*$", value)
    if not match:
        return None
    start, end, total = match.groups()
    return (None if start is None else int(start), None if end is None else int(end),
            None if total == "*" else int(total))


def _is_permanent_url_error(exc: urllib.error.URLError) -> bool:
    """Connection refused, unknown host or a missing local file: retrying will not help."""
    reason = exc.reason
    return isinstance(reason, (ConnectionRefusedError, socket.gaierror, FileNotFoundError,
                               PermissionError, IsADirectoryError, NotADirectoryError))


def _too_large(size: int, max_bytes: int) -> _Permanent:
    return _Permanent(f"it is larger than the {max_bytes / 1e6:.1f} MB expected of it (at least "
                      f"{size / 1e6:.1f} MB), so it is not the file asked for; stopped before it "
                      "filled the disk")


def _truncate(path: str) -> None:
    """Empties ``path`` in place (it stays the claimed file)."""
    with open(path, "wb"):
        pass


def _fetch(url: str, part: str, timeout: float, progress: _Progress, max_bytes: int) -> int:
    """One attempt: fetches (the rest of) ``url`` into ``part``; returns its size.

    Raises:
      _Permanent: a failure that a retry will not fix.
      _Incomplete, OSError, http.client.HTTPException: a broken transfer.
    """
    have = os.path.getsize(part) if os.path.exists(part) else 0
    response = _open(url, part, have, timeout)
    if response is None:  # every byte is here already
        return have
    with response:
        have, total, mode = _resume_point(response, part, have)
        if total is not None and total > max_bytes:
            raise _too_large(total, max_bytes)
        have = _copy(response, part, mode, have, total, max_bytes, progress)
    # http.client returns b"" (no error) when the server closes the connection
    # early, so the length check is what detects a cut transfer.
    if total is not None and have != total:
        raise _Incomplete(f"the transfer stopped after {have} of {total} bytes")
    progress.finish(have, total)
    return have


def _open(url: str, part: str, have: int, timeout: float) -> Optional[Any]:
    """The response to a request for ``url`` from byte ``have`` on (a ``Range`` request over HTTP), or None when
    the server says ``part`` holds every byte already."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    request = urllib.request.Request(url, headers={"User-Agent": "lmkit-download/1"})
    if have and scheme in ("http", "https"):
        request.add_header("Range", f"bytes={have}-")
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 416 and have:
            # The range starts at or after the end: we may hold every byte already.
            parsed = _parse_content_range(exc.headers.get("Content-Range"))
            if parsed and parsed[2] == have:
                return None
            _truncate(part)
            raise _Incomplete(f"the server refused to resume at byte {have} (HTTP 416)") from None
        if 400 <= exc.code < 500 and exc.code not in (408, 429):
            raise _Permanent(f"HTTP {exc.code} {exc.reason}") from None
        raise  # 5xx, 408, 429: the server may recover
    except urllib.error.URLError as exc:
        if _is_permanent_url_error(exc):
            raise _Permanent(str(exc.reason)) from None
        raise


def _resume_point(response: Any, part: str, have: int) -> Tuple[int, Optional[int], str]:
    """``(bytes kept, total size or None, file mode)``: a 206 answer resumes after the ``have`` bytes of
    ``part`` (checked to start there); any other answer is the whole file again."""
    status = getattr(response, "status", None)  # None for file:// URLs
    length = response.headers.get("Content-Length")
    length = int(length) if length and length.strip().isdigit() else None
    if not (have and status == 206):
        return 0, length, "wb"  # a 200 answer to a Range request is the whole file again: start over
    start, _, total = _parse_content_range(response.headers.get("Content-Range")) or (None, None, None)
    if start != have:
        _truncate(part)
        raise _Incomplete(f"the server resumed at byte {start}, not at {have}; starting over")
    if total is None and length is not None:
        total = have + length
    return have, total, "ab"


def _copy(response: Any, part: str, mode: str, have: int, total: Optional[int], max_bytes: int,
          progress: _Progress) -> int:
    """Writes the response's body into ``part`` (opened with ``mode``); returns the bytes it then holds."""
    try:
        out = open(part, mode)
    except OSError as exc:
        raise _Permanent(f"cannot write {part!r}: {exc}") from None
    with out:
        while True:
            chunk = response.read(_CHUNK)
            if not chunk:
                return have
            try:
                out.write(chunk)
            except OSError as exc:  # disk full, quota: a retry will not help
                raise _Permanent(f"cannot write {part!r}: {exc}") from None
            have += len(chunk)
            if have > max_bytes:
                raise _too_large(have, max_bytes)
            progress.update(have, total)


def download(url: str, dest: str, retries: int = 3, progress: bool = True, *,
             timeout: float = 60.0, backoff: float = 1.0, hint: str = "",
             label: Optional[str] = None, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """Downloads ``url`` to ``dest``.

    Args:
      url: an ``http://``, ``https://`` or ``file://`` address.
      dest: the file to write; its folder is created when missing. The bytes
        arrive in ``<dest>.<random>.part``, renamed to ``dest`` once complete.
      retries: how many times a broken transfer is retried (so at most
        ``retries + 1`` attempts), each resuming where the last stopped when
        the server supports ``Range`` requests.
      progress: report progress on stderr.
      timeout: seconds to wait for the connection or the next bytes.
      backoff: seconds before the first retry, doubled for each next one.
      hint: text appended to error messages (how to get the file by hand).
      label: the name progress lines show; default the file name of ``dest``.
      max_bytes: the most bytes the file may have; a larger one fails at
        once (its announced length) or as soon as it passes the cap.

    Returns:
      ``dest``.

    Raises:
      DataError: a negative ``retries``, a ``timeout``/``backoff`` < 0, an
        unsupported scheme, a wrong address (HTTP 4xx, connection refused,
        unknown host, missing file), a file larger than ``max_bytes``, a
        local write error, or every attempt failed. The ``.part`` file is
        removed first.
    """
    if retries < 0:
        raise DataError(f"retries = {retries} must be >= 0")
    if timeout <= 0 or backoff < 0:
        raise DataError(f"timeout = {timeout} must be > 0 and backoff = {backoff} >= 0")
    hint = f". {hint}" if hint else ""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in SUPPORTED_SCHEMES:
        raise DataError(f"cannot download {url!r}: the scheme {scheme or '(none)'!r} is not one of "
                        f"{', '.join(SUPPORTED_SCHEMES)}{hint}")
    dest = os.fspath(dest)
    folder = os.path.dirname(os.path.abspath(dest))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create the folder {folder!r} for {dest!r}: {exc}") from None
    # .part files of this dest left by killed runs; those of live downloads are claimed.
    # (``<dest>.part``: the one name of every download before these names.)
    sweep_unclaimed(folder, re.escape(os.path.basename(dest)) + r"(\.[^.]+)?\.part")
    try:
        part = make_temp_file(os.path.basename(dest) + ".", ".part", folder)
    except OSError as exc:
        raise DataError(f"cannot write into the folder {folder!r} for {dest!r}: {exc}") from None
    try:
        with claimed(part):
            return _attempts(url, dest, part, retries, timeout, backoff, hint,
                             _Progress(label or os.path.basename(dest), progress), max_bytes)
    finally:
        _remove(part)


def _attempts(url: str, dest: str, part: str, retries: int, timeout: float, backoff: float, hint: str,
              reporter: _Progress, max_bytes: int) -> str:
    """Up to ``retries + 1`` tries of :func:`_fetch` into ``part``, which replaces ``dest`` once whole."""
    last_error: Optional[BaseException] = None
    for attempt in range(retries + 1):
        if attempt:
            delay = min(backoff * 2 ** (attempt - 1), _MAX_BACKOFF)
            resume = os.path.getsize(part)
            reporter.note(f"{last_error}; retry {attempt}/{retries} in {delay:.1f} s"
                          + (f", resuming at byte {resume}" if resume else ""))
            time.sleep(delay)
        try:
            _fetch(url, part, timeout, reporter, max_bytes)
            os.replace(part, dest)
            return dest
        except _Permanent as exc:
            raise DataError(f"cannot download {url}: {exc}{hint}") from None
        except (_Incomplete, OSError, http.client.HTTPException) as exc:
            last_error = exc
    raise DataError(f"cannot download {url}: {retries + 1} attempt(s) failed, the last with "
                    f"{type(last_error).__name__}: {last_error}{hint}")
