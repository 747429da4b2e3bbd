"""Which files a ``--train_file`` (``--valid_file``, ``--test_file``) names.

A source is one of, or several of, separated by commas:

* a file (``train.txt``);
* a folder: every regular file in it, recursively, hidden ones (``.name``) left
  out;
* a glob pattern (``shards/*.txt``, ``data/**/*.txt``).

:func:`resolve_sources` turns it into a sorted list of files without
repeats, the order the text is read in (so the token stream does not depend
on the order a folder lists its files). A path that exists is never split or
expanded, so a file with a comma or a ``*`` in its name still works.
"""

from __future__ import annotations

import glob
import os
from typing import List, Sequence, Union

from lmkit.data.errors import DataError

__all__ = ["resolve_sources", "SEPARATOR"]

#: Between several sources in one config value (``--train_file a.txt b.txt`` is stored so).
SEPARATOR = ","

_GLOB_CHARS = "*?["


def _folder_files(folder: str) -> List[str]:
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found.extend(os.path.join(root, f) for f in files if not f.startswith("."))
    return found


def resolve_sources(spec: Union[str, Sequence[str]], what: str = "train_file") -> List[str]:
    """The files named by ``spec`` (see the module's docstring), sorted, each once.

    Args:
      spec: a config value (sources separated by commas) or a list of them.
      what: how messages call it, e.g. ``"train_file"``.

    Returns:
      Paths as given (not made absolute), sorted by path.

    Raises:
      DataError: ``spec`` is empty, a pattern matches no file, a folder holds
        no file, or a path does not exist (naming which).
    """
    parts = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    if not any(os.fspath(p).strip() for p in parts):
        raise DataError(f"{what} is empty; give a text file, a folder or a glob pattern")
    files: List[str] = []
    for part in parts:
        part = os.fspath(part)
        pieces = [part] if os.path.exists(part) else [p.strip() for p in part.split(SEPARATOR)]
        for piece in pieces:
            if not piece:
                continue
            if os.path.isdir(piece):
                found = _folder_files(piece)
                if not found:
                    raise DataError(f"{what} {piece!r} is a folder without files; put text files "
                                    "in it or give the path of a file")
                files.extend(found)
            elif os.path.exists(piece):
                files.append(piece)
            elif any(c in piece for c in _GLOB_CHARS):
                found = [f for f in glob.glob(piece, recursive=True) if os.path.isfile(f)]
                if not found:
                    raise DataError(f"{what} pattern {piece!r} matches no file; check the pattern "
                                    "(quote it in the shell so that lmkit expands it)")
                files.extend(found)
            else:
                raise DataError(f"{what} {piece!r} does not exist; check the path")
    unique = {os.path.normpath(f): f for f in files}
    return [unique[k] for k in sorted(unique)]
