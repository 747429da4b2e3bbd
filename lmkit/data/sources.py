"""Which files a ``--train_file`` (``--valid_file``, ``--test_file``) names.

A source is one of, or several of, separated by commas:

* a file (``train.txt``, ``train.jsonl``, ``train.parquet``, ``train.txt.zst``:
  its format by its name, :mod:`lmkit.data.formats`);
* a folder written by ``datasets``' ``save_to_disk``: one source;
* another folder: every regular file in it, recursively, hidden ones
  (``.name``) left out, a ``save_to_disk`` folder in it as one source;
* a glob pattern (``shards/*.txt``, ``data/**/*.parquet``).

:func:`resolve_sources` turns it into a sorted list of
:class:`~lmkit.data.formats.Source` without repeats, the order the text is
read in (so the token stream does not depend on the order a folder lists its
files), each with the options that say where a record holds its text. A path
that exists is never split or expanded, so a file with a comma or a ``*`` in
its name still works.
"""

from __future__ import annotations

import glob
import os
from typing import Dict, List, Sequence, Union

from lmkit.data.errors import DataError
from lmkit.data.formats import Source, is_dataset_folder

__all__ = ["resolve_sources", "SEPARATOR"]

#: Between several sources in one config value (``--train_file a.txt b.txt`` is stored so).
SEPARATOR = ","

_GLOB_CHARS = "*?["


def _folder_files(folder: str) -> List[str]:
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        if is_dataset_folder(root):  # its files are one source, read by datasets
            found.append(root)
            dirs[:] = []
            continue
        found.extend(os.path.join(root, f) for f in files if not f.startswith("."))
    return found


def _is_source(path: str) -> bool:
    return os.path.isfile(path) or (os.path.isdir(path) and is_dataset_folder(path))


def resolve_sources(spec: Union[str, Sequence[str]], what: str = "train_file", *, text_field: str = "text",
                    text_column: str = "text", dataset_split: str = "train") -> List[Source]:
    """The sources named by ``spec`` (see the module's docstring), sorted, each once.

    Args:
      spec: a config value (sources separated by commas) or a list of them;
        a :class:`~lmkit.data.formats.Source` among them keeps its own options
        for each file it names.
      what: how messages call it, e.g. ``"train_file"``.
      text_field: JSON Lines: the field that holds a record's text.
      text_column: Parquet and ``datasets`` folders: the column that holds the text.
      dataset_split: a ``DatasetDict`` folder's split to read.

    Returns:
      Sources (each a ``str``, the path as given, not made absolute), sorted by path.

    Raises:
      DataError: ``spec`` is empty, a pattern matches no file, a folder holds
        no file, or a path does not exist (naming which).
    """
    parts = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    if not any(os.fspath(p).strip() for p in parts):
        raise DataError(f"{what} is empty; give a text file, a folder or a glob pattern")
    default = Source("", text_field=text_field, text_column=text_column, dataset_split=dataset_split)
    found: Dict[str, Source] = {}
    for part in parts:
        like = part if isinstance(part, Source) else default
        part = os.fspath(part)
        pieces = [part] if os.path.exists(part) else [p.strip() for p in part.split(SEPARATOR)]
        for piece in pieces:
            for path in _expand(piece, what):
                found.setdefault(os.path.normpath(path), like.at(path))
    return [found[key] for key in sorted(found)]


def _expand(piece: str, what: str) -> List[str]:
    """The sources one piece of a spec names (none for an empty piece)."""
    if not piece:
        return []
    if os.path.isdir(piece):
        found = _folder_files(piece)
        if not found:
            raise DataError(f"{what} {piece!r} is a folder without files; put text files "
                            "in it or give the path of a file")
        return found
    if os.path.exists(piece):
        return [piece]
    if any(c in piece for c in _GLOB_CHARS):
        found = [f for f in glob.glob(piece, recursive=True) if _is_source(f)]
        if not found:
            raise DataError(f"{what} pattern {piece!r} matches no file; check the pattern "
                            "(quote it in the shell so that lmkit expands it)")
        return found
    raise DataError(f"{what} {piece!r} does not exist; check the path")
