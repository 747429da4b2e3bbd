"""Files that readers never see half-written (no TensorFlow import).

Every file lmkit writes for later runs to read (configs, vocabularies,
tokenizers, checkpoint metadata, ``results.json``) goes through
:func:`atomic_write_bytes` or :func:`atomic_write_text`: the content lands in
a temporary file in the same folder, is flushed to disk, and replaces the
target in one ``os.replace``. A process killed mid-write leaves the old file
(or none), never a torn one.
"""

from __future__ import annotations

import os
import tempfile
from typing import Union

__all__ = ["PathLike", "atomic_write_bytes", "atomic_write_text", "fsync_dir"]

PathLike = Union[str, "os.PathLike[str]"]


def fsync_dir(path: PathLike) -> None:
    """Flushes a folder's entries (a rename into it) to disk; best effort."""
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Writes ``data`` to ``path`` through a temporary file and one rename.

    The folder is created when missing. On any error the temporary file is
    removed and ``path`` keeps its old content.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_write_text(path: PathLike, text: str) -> None:
    """Writes ``text`` as UTF-8 (line ends kept as given); see :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode("utf-8"))
