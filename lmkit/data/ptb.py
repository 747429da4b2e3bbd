"""The Penn Treebank language-modelling corpus (Mikolov's ``simple-examples``).

:func:`ensure_ptb` finds ``ptb.{train,valid,test}.txt`` or downloads
``simple-examples.tgz``, checks it and extracts only those three files;
:func:`load_ptb` reads them into id arrays with a vocabulary built from the
training text (a newline is the ``<eos>`` token, as in Zaremba et al. 2014).

In a distributed job only the chief downloads, and the trainer (not this
module, which never imports Horovod) arranges it::

    path = lmkit.dist.run_on_chief(lambda: ensure_ptb(data_path))
    data = load_ptb(path)
"""

from __future__ import annotations

import collections
import os
import posixpath
import tarfile
import zlib
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from lmkit.data.download import download
from lmkit.data.errors import DataError
from lmkit.data.vocab import Vocab, read_lines

__all__ = [
    "DEFAULT_URL", "URL_ENV", "ARCHIVE_NAME", "PTB_FILES", "PTB_VOCAB_SIZE", "PTBData",
    "find_ptb", "ensure_ptb", "load_ptb", "read_words", "ptb_url",
]

DEFAULT_URL = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"
URL_ENV = "LMKIT_PTB_URL"
ARCHIVE_NAME = "simple-examples.tgz"
SPLITS = ("train", "valid", "test")
PTB_FILES = tuple(f"ptb.{split}.txt" for split in SPLITS)
PTB_VOCAB_SIZE = 10000
EOS = "<eos>"
UNK = "<unk>"
# Where the files sit inside the archive, and where they are extracted to.
_SUBDIR = posixpath.join("simple-examples", "data")


@dataclass(eq=False)
class PTBData:
    """The three PTB splits as id arrays, and the vocabulary that made them.

    Attributes:
      train: int32 ids of the training text, ``<eos>`` after every line.
      valid: int32 ids of the validation text.
      test: int32 ids of the test text.
      vocab: built from ``train`` (10,000 entries for the real corpus).
    """

    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    vocab: Vocab


def ptb_url(url: Optional[str] = None) -> str:
    """The address to download from: ``url``, else ``$LMKIT_PTB_URL``, else :data:`DEFAULT_URL`."""
    return url or os.environ.get(URL_ENV) or DEFAULT_URL


def find_ptb(data_path: str) -> Optional[str]:
    """The folder holding all three PTB files, or None.

    Looks in ``data_path`` itself, then in ``data_path/simple-examples/data``
    (where :func:`ensure_ptb` extracts them).
    """
    data_path = os.fspath(data_path)
    for folder in (data_path, os.path.join(data_path, *_SUBDIR.split("/"))):
        if all(os.path.isfile(os.path.join(folder, name)) for name in PTB_FILES):
            return folder
    return None


def _manual_hint(data_path: str, capital: bool = True) -> str:
    """How to supply the files by hand, for error messages."""
    verb = "Download" if capital else "download"
    return (f"{verb} {ARCHIVE_NAME} yourself and put {', '.join(PTB_FILES)} in {data_path}, "
            f"or set {URL_ENV} / --data_url to a mirror")


def ensure_ptb(data_path: str, url: Optional[str] = None, progress: bool = True, retries: int = 3,
               *, expected_vocab_size: Optional[int] = PTB_VOCAB_SIZE, timeout: float = 60.0,
               backoff: float = 1.0) -> str:
    """Returns the folder with the PTB files, downloading them when missing.

    When :func:`find_ptb` finds nothing, ``simple-examples.tgz`` is
    downloaded into ``data_path`` (an archive already there is used as is),
    checked, and its three PTB files are extracted to
    ``data_path/simple-examples/data``. Run it on one process only (the chief).

    Args:
      data_path: the data folder (created when missing).
      url: where to download from; default ``$LMKIT_PTB_URL`` or
        :data:`DEFAULT_URL`. ``http(s)://`` and ``file://`` are supported.
      progress: show download progress on stderr.
      retries: retries of a broken transfer (resumed when possible).
      expected_vocab_size: the number of distinct training words (newline
        counted as ``<eos>``) the archive must give; None skips the check
        (tests with small generated archives).
      timeout: seconds to wait for the server.
      backoff: seconds before the first retry, doubled for each next one.

    Returns:
      The folder holding ``ptb.train.txt``, ``ptb.valid.txt``, ``ptb.test.txt``.

    Raises:
      DataError: the download failed (naming the address and how to supply
        the files by hand), the archive is unreadable or lacks a file, a
        member is unsafe (a link, a device, a path outside the folder), or the
        vocabulary size is wrong.
    """
    data_path = os.fspath(data_path)
    found = find_ptb(data_path)
    if found is not None:
        return found
    address = ptb_url(url)
    archive = os.path.join(data_path, ARCHIVE_NAME)
    fresh = not os.path.isfile(archive)
    if fresh:
        download(address, archive, retries=retries, progress=progress, timeout=timeout,
                 backoff=backoff, hint=_manual_hint(data_path))
    target = os.path.join(data_path, *_SUBDIR.split("/"))
    try:
        _extract_ptb(archive, target, expected_vocab_size)
    except DataError as exc:
        if fresh:
            # A bad download must not be reused by the next run.
            os.remove(archive)
            raise DataError(f"{exc} (downloaded from {address}; the file was removed). "
                            f"{_manual_hint(data_path)}") from None
        raise DataError(f"{exc}. Delete {archive} to download it again, or "
                        f"{_manual_hint(data_path, capital=False)}") from None
    return target


def _member_for(members: Sequence[tarfile.TarInfo], name: str, archive: str) -> tarfile.TarInfo:
    """The archive member for the PTB file ``name``.

    The expected path is ``simple-examples/data/<name>``; a repacked mirror
    may use another folder, so any member with that base name is accepted
    (the canonical path wins).
    """
    canonical = posixpath.join(_SUBDIR, name)
    candidates = [m for m in members if posixpath.basename(m.name.rstrip("/")) == name]
    for m in candidates:
        if _strip_dot(m.name) == canonical:
            return m
    if not candidates:
        raise DataError(f"{archive} has no member {canonical!r} (nor any {name!r}); "
                        "the archive may be corrupt or not the PTB simple-examples archive")
    return candidates[0]


def _strip_dot(name: str) -> str:
    """``./a/b`` -> ``a/b`` (GNU tar writes a leading ``./``)."""
    while name.startswith("./"):
        name = name[2:]
    return name


def _check_member(member: tarfile.TarInfo, archive: str) -> None:
    """Refuses members that could write outside the target folder."""
    name = member.name
    if member.issym() or member.islnk():
        raise DataError(f"{archive}: member {name!r} is a link (to {member.linkname!r}); "
                        "refusing to extract it, the archive is unsafe")
    if not member.isfile():
        raise DataError(f"{archive}: member {name!r} is not a regular file (a device, fifo or "
                        "folder); refusing to extract it, the archive is unsafe")
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":") or ".." in parts:
        raise DataError(f"{archive}: member {name!r} would land outside the target folder "
                        "(absolute path or '..'); refusing to extract it, the archive is unsafe")


def _extract_ptb(archive: str, target: str, expected_vocab_size: Optional[int]) -> None:
    """Checks ``archive`` and extracts the three PTB files into ``target``.

    Each file is written under a temporary name and renamed only after all
    three are written and checked, so no half-extracted file remains.
    """
    try:
        with tarfile.open(archive, "r:*") as tar:
            # Reading every header walks the whole (compressed) file, so a
            # truncated archive fails here rather than half-way through.
            members = tar.getmembers()
            chosen = {name: _member_for(members, name, archive) for name in PTB_FILES}
            for member in chosen.values():
                _check_member(member, archive)
            os.makedirs(target, exist_ok=True)
            temps: Dict[str, str] = {}
            try:
                for name, member in chosen.items():
                    temp = os.path.join(target, f".{name}.{os.getpid()}.tmp")
                    temps[name] = temp
                    source = tar.extractfile(member)
                    if source is None:
                        raise DataError(f"{archive}: member {member.name!r} has no data")
                    written = 0
                    with source, open(temp, "wb") as out:
                        while True:
                            chunk = source.read(1 << 20)
                            if not chunk:
                                break
                            out.write(chunk)
                            written += len(chunk)
                    if written != member.size:
                        raise DataError(f"{archive}: member {member.name!r} gave {written} of "
                                        f"{member.size} bytes; the archive is truncated or corrupt")
                if expected_vocab_size is not None:
                    _check_vocab_size(temps["ptb.train.txt"], archive, expected_vocab_size)
                for name, temp in temps.items():
                    os.replace(temp, os.path.join(target, name))
                temps.clear()
            finally:
                for temp in temps.values():
                    if os.path.exists(temp):
                        os.remove(temp)
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise DataError(f"{archive} is not a readable .tgz archive ({type(exc).__name__}: {exc}); "
                        "the file may be truncated or corrupt") from None


def _check_vocab_size(train_file: str, archive: str, expected: int) -> None:
    words = set()
    for line in read_lines(train_file):
        words.update(line.split())
    words.add(EOS)
    if len(words) != expected:
        raise DataError(f"{archive}: ptb.train.txt has {len(words)} distinct words (newline "
                        f"counted as {EOS}), expected {expected}; the file may be corrupt or "
                        "not the PTB corpus")


def read_words(path: str, newline_token: Optional[str] = EOS) -> List[str]:
    """The whitespace-separated words of a UTF-8 file, ``newline_token`` after each line.

    Raises:
      DataError: the file is missing, not UTF-8 or holds no words (naming it).
    """
    words: List[str] = []
    for line in read_lines(path):
        words.extend(line.split())
        if newline_token is not None:
            words.append(newline_token)
    if not any(w != newline_token for w in words):
        raise DataError(f"text file {path!r} is empty (no words); the file may be corrupt, "
                        "delete it and run ensure_ptb again")
    return words


def load_ptb(data_path: str) -> PTBData:
    """Reads the three PTB files into int32 id arrays.

    Args:
      data_path: a folder holding the files, or the ``data_path`` given to
        :func:`ensure_ptb` (which extracts to ``simple-examples/data`` below it).

    Returns:
      A :class:`PTBData`; the vocabulary has ``<unk>`` (id 0) and ``<eos>``
      (id 1) and no other specials, so PTB gives exactly 10,000 entries.

    Raises:
      DataError: a file is missing, empty or not UTF-8 (naming the file).
    """
    data_path = os.fspath(data_path)
    folder = find_ptb(data_path)
    if folder is None:
        nested = os.path.join(data_path, *_SUBDIR.split("/"))
        # Name the first missing file in whichever folder holds more of them.
        folder = max((data_path, nested), key=lambda d: sum(
            os.path.isfile(os.path.join(d, n)) for n in PTB_FILES))
        missing = [n for n in PTB_FILES if not os.path.isfile(os.path.join(folder, n))]
        raise DataError(f"PTB file {os.path.join(folder, missing[0])!r} does not exist; run "
                        f"ensure_ptb({data_path!r}) to download the corpus, or "
                        f"{_manual_hint(data_path, capital=False)}")
    words = {split: read_words(os.path.join(folder, f"ptb.{split}.txt")) for split in SPLITS}
    vocab = Vocab.from_counts(collections.Counter(words["train"]), unk_token=UNK, eos_token=EOS,
                              bos_token=None, pad_token=None)
    arrays = {split: np.asarray(vocab.encode(w), dtype=np.int32) for split, w in words.items()}
    return PTBData(train=arrays["train"], valid=arrays["valid"], test=arrays["test"], vocab=vocab)
