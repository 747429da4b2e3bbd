"""Files that readers never see half-written, and temporaries that never outlive their writer
(no TensorFlow import).

Every file lmkit writes for later runs to read (configs, vocabularies,
tokenizers, checkpoint metadata, ``results.json``) goes through
:func:`atomic_write_bytes` or :func:`atomic_write_text`: the content lands in
a temporary file in the same folder, is flushed to disk, and replaces the
target in one ``os.replace``. A process killed mid-write leaves the old file
(or none), never a torn one. Files and folders get the modes ``open()`` and
``mkdir`` would give them (the umask's), never ``tempfile``'s private ones.

Larger results (a token cache entry, an export, a download) are written into
a :class:`TempFolder` (or a file held by :func:`claimed`) and renamed into
place when whole. The writer holds an exclusive ``flock`` on it, which the
kernel lets go of however the process ends (SIGKILL, the OOM killer), so the
next writer in the same folder can tell a leftover from a live job's
temporary (:func:`sweep_temp_folders`, :func:`sweep_unclaimed`) and remove it,
on this host or, where the file system passes ``flock`` on (NFS does;
Lustre with ``-o flock``), on another.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
from typing import Callable, Iterator, List, Optional, Pattern, Tuple, Union

try:
    import fcntl
except ImportError:  # not POSIX: temporary folders go unlocked, and are swept once stale
    fcntl = None  # type: ignore[assignment]

__all__ = ["PathLike", "atomic_write_bytes", "atomic_write_text", "fsync_dir", "current_umask", "make_temp_dir",
           "make_temp_file",
           "TempFolder", "sweep_temp_folders", "work_folder", "claimed", "sweep_unclaimed",
           "LOCK_FILE", "UNLOCKED_STALE_SECONDS", "STALE_AFTER_SECONDS"]

#: The lock file of a :class:`TempFolder`, and its name before it is locked.
LOCK_FILE = ".lock"
_STAGED_LOCK = ".lock.new"
#: A temporary folder without a lock file (an older lmkit's, or one on a file system without locks) is a
#: leftover once nothing in it has changed for this long.
UNLOCKED_STALE_SECONDS = 24 * 3600
#: A temporary file untouched this long, whose writer holds no lock on it, is a leftover (the age
#: covers the moment between creating the file and locking it).
STALE_AFTER_SECONDS = 60.0

PathLike = Union[str, "os.PathLike[str]"]


def current_umask() -> int:
    """This process's umask (read without changing it where ``/proc`` tells it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and put back at once
    os.umask(mask)
    return mask


def make_temp_dir(prefix: str, dir: PathLike) -> str:
    """A new folder in ``dir`` with a unique name starting with ``prefix``, with the mode a plain
    ``os.mkdir`` gives (``0o777`` less the umask): ``tempfile.mkdtemp`` makes it ``0o700``, which a
    rename into place would keep, hiding the result from a team's other accounts."""
    path = tempfile.mkdtemp(prefix=prefix, dir=os.fspath(dir))
    os.chmod(path, 0o777 & ~current_umask())
    return path


def make_temp_file(prefix: str, suffix: str, dir: PathLike) -> str:
    """A new empty file in ``dir`` with a unique name, with the mode ``open()`` gives a new file
    (``0o666`` less the umask, not ``tempfile.mkstemp``'s ``0o600``)."""
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=os.fspath(dir))
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
    finally:
        os.close(fd)
    return path


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

    The folder is created when missing. The file gets the mode ``open()``
    would give it: an existing file's own, a new one ``0o666`` less the umask
    (not the temporary file's private ``0o600``). On any error the temporary
    file is removed and ``path`` keeps its old content.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except OSError:
            mode = 0o666 & ~current_umask()
        os.fchmod(fd, mode)
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



class TempFolder:
    """A new folder ``root/<prefix><random>`` locked by this process while it lives.

    :func:`sweep_temp_folders`, in this process or another, on this host or
    another sharing ``root``, never removes it; :meth:`publish` renames it into
    place, :meth:`close` removes it unless published. The lock is an exclusive
    ``flock`` on its :data:`LOCK_FILE`, made under another name and renamed
    once locked, so that a sweep never finds it unlocked while its writer lives
    (a file opened for writing: NFS grants an exclusive lock on no other).

    Raises:
      OSError: the folder cannot be made.
    """

    def __init__(self, root: PathLike, prefix: str) -> None:
        os.makedirs(root, exist_ok=True)
        self.path = make_temp_dir(prefix, root)
        self._owned = True  # the folder is still at self.path, for close() to remove
        try:
            self._fd = _lock_folder(self.path)
        except BaseException:
            shutil.rmtree(self.path, ignore_errors=True)
            raise

    def __enter__(self) -> "TempFolder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def publish(self, final: PathLike) -> None:
        """Renames the folder to ``final``, less its lock file (held until :meth:`close`).

        Raises:
          OSError: the rename failed (``final`` exists); the folder stays, for :meth:`close`.
        """
        for name in (LOCK_FILE, _STAGED_LOCK):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.path, name))
        os.rename(self.path, final)
        self._owned = False

    def close(self) -> None:
        """Removes the folder unless it was published, then lets go of the lock (again: nothing)."""
        if self._owned:
            shutil.rmtree(self.path, ignore_errors=True)
            self._owned = False
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _lock_folder(folder: str) -> Optional[int]:
    """Locks ``folder`` (see :class:`TempFolder`): the descriptor that holds the lock (None: no locks)."""
    if fcntl is None:
        return None
    staged = os.path.join(folder, _STAGED_LOCK)
    fd = os.open(staged, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # a file system without locks: no lock file, so the folder is swept only when stale
        return fd
    try:
        os.rename(staged, os.path.join(folder, LOCK_FILE))
    except BaseException:
        os.close(fd)
        raise
    return fd


def sweep_temp_folders(root: PathLike, match: Union[str, Callable[[str], bool]],
                       log: Callable[[str], None] = lambda line: None, what: str = "jobs",
                       where: str = "") -> Tuple[int, int]:
    """Removes the temporary folders in ``root`` that their writer left behind (killed by SIGKILL
    or the OOM killer), and logs one line when it removed any.

    A folder (its name starting with the prefix ``match``, or passing the test
    ``match``) is a leftover when this process can lock its :data:`LOCK_FILE`
    (its writer is gone), or, when it has none (an older lmkit's), when nothing
    in it changed for :data:`UNLOCKED_STALE_SECONDS`. A folder another process
    locks, or that this account cannot lock or remove, is kept. Never raises.

    Returns:
      ``(folders removed, bytes freed)``.
    """
    test = (lambda name: name.startswith(match)) if isinstance(match, str) else match
    try:
        names = os.listdir(root)
    except OSError:
        return 0, 0
    count = freed = 0
    for name in names:
        if test(name):
            size = _remove_if_left(os.path.join(os.fspath(root), name))
            if size is not None:
                count, freed = count + 1, freed + size
    if count:
        log(f"removed {count} temporary folder(s) of killed {what} from {where or root} "
            f"({freed / 1e6:.1f} MB)")
    return count, freed


def _remove_if_left(path: str) -> Optional[int]:
    """Removes the temporary folder ``path`` when its writer is gone: the bytes freed, or None (kept)."""
    if os.path.islink(path) or not os.path.isdir(path):
        return None
    try:
        fd: Optional[int] = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_NOFOLLOW)
    except FileNotFoundError:
        fd = None
    except OSError:  # another account's lock file
        return None
    try:
        if fd is not None:
            if fcntl is None:
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # its writer lives (or this file system has no locks)
                return None
        elif not _unchanged_for(path, UNLOCKED_STALE_SECONDS):
            return None
        size = _bytes_in(path)
        shutil.rmtree(path, ignore_errors=True)
        return None if os.path.lexists(path) else size
    finally:
        if fd is not None:
            os.close(fd)


def _unchanged_for(folder: str, seconds: float) -> bool:
    """Whether nothing in ``folder`` (its entries, its files' contents) changed for ``seconds``."""
    try:
        newest = os.stat(folder).st_mtime
        for parent, folders, files in os.walk(folder):
            for name in folders + files:
                newest = max(newest, os.lstat(os.path.join(parent, name)).st_mtime)
    except OSError:  # gone, or changing: not a leftover
        return False
    return time.time() - newest >= seconds


def _bytes_in(folder: str) -> int:
    total = 0
    for parent, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(parent, name)).st_size
    return total


@contextlib.contextmanager
def work_folder(parent: PathLike, prefix: str) -> Iterator[str]:
    """A :class:`TempFolder` ``parent/<prefix><random>`` for one job's unfinished files, removed on
    leaving, after the leftovers of killed jobs with the same ``prefix`` were swept. (To rename a
    whole folder into place, use :class:`TempFolder` and its :meth:`~TempFolder.publish`.)"""
    sweep_temp_folders(parent, prefix)
    with TempFolder(parent, prefix) as folder:
        yield folder.path


@contextlib.contextmanager
def claimed(path: PathLike) -> Iterator[None]:
    """Holds an exclusive ``flock`` on the temporary file ``path`` (opened for writing, as NFS
    requires) while it is written, so :func:`sweep_unclaimed` leaves it alone."""
    fd = os.open(os.fspath(path), os.O_RDWR)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def sweep_unclaimed(folder: PathLike, pattern: Union[str, Pattern[str]],
                    min_age: float = STALE_AFTER_SECONDS) -> List[str]:
    """Removes the temporary files in ``folder`` whose name matches ``pattern`` (the whole name),
    untouched for ``min_age`` seconds and not :func:`claimed` by a live process.

    Files that this account cannot open for writing or remove are left alone.

    Returns:
      The paths removed.
    """
    regex = re.compile(pattern) if isinstance(pattern, str) else pattern
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    removed = []
    now = time.time()
    for name in names:
        path = os.path.join(os.fspath(folder), name)
        if not regex.fullmatch(name) or not os.path.isfile(path) or os.path.islink(path):
            continue
        try:
            if now - os.stat(path).st_mtime < min_age:
                continue
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.remove(path)
            removed.append(path)
        except OSError:  # its writer lives, or it is not ours to remove
            pass
        finally:
            os.close(fd)
    return removed
