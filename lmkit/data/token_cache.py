"""Text encoded once into token files that every later run memory-maps.

A split of a corpus (its source files) encoded by a tokenizer is kept in a
folder of the data cache (:func:`cache_root`: ``--data_cache``, else
``$LMKIT_DATA_CACHE``, else ``$XDG_CACHE_HOME/lmkit/tokens`` or
``~/.cache/lmkit/tokens``)::

    <cache>/<key>/ids.bin          the token ids, uint16 (vocabularies up to 65,536) or uint32
    <cache>/<key>/manifest.json    the sources (path, size, mtime, sha256) with their token
                                   offsets, line and word counts; the tokenizer
    <cache>/<key>/tokenizer/       the tokenizer that made the ids

An encoder-decoder's source or target file is kept line by line instead
(:func:`cached_lines`: every line in its own ids, blank ones included, no eos,
so that line ``i`` of one side still goes with line ``i`` of the other)::

    <cache>/<key>/ids.bin          the lines' ids, one after the other
    <cache>/<key>/lines.bin        uint64 offsets: line i is ids[offsets[i]:offsets[i + 1]]
    <cache>/<key>/blank.bin        uint8, 1 for a line of only white space

``key`` is a hash of the tokenizer (kind, options, fingerprint), whether
lines end with an eos id, and each source's absolute path, size,
modification time and a sample of its content (the sha256 of its first and
last MB, :func:`lmkit.data.textfile.content_sample`, so that a file edited
and copied back with ``cp -p`` or ``rsync -t`` is seen to change), and for
JSON Lines, Parquet and ``datasets`` folders the field or column (and split)
that holds the text (:func:`lmkit.data.textfile.source_identity`): a run with
the same text and tokenizer, in any model folder, finds the folder; a changed
source or another tokenizer gives another key. A folder is written under a
temporary name (``<cache>/.tmp-<key>-*``, locked by its writer with
``flock`` on its ``.lock`` file) and renamed into place when complete, so a
killed or failed encoding (a full disk, a source that changed while being
read) leaves nothing that a later run could take for a cache; each encoding
first removes the temporary folders whose writer is gone (killed by the OOM
killer or SIGKILL), never one that a live process, here or on another host
sharing the folder, still writes.

Encoding (:func:`encode_to_cache`) reads each file in blocks
(:class:`lmkit.data.textfile.TextBlocks`: memory does not grow with the file
nor with its lines; a bare CR ends a line; a source of another format,
:mod:`lmkit.data.formats`, gives its records' texts as lines, and the
progress counts its bytes on disk) and encodes the blocks in worker
processes, one per core, in order; the ids are those of
:meth:`lmkit.data.text.TextCorpus.encode_text_lines` (blank lines skipped,
eos after each line) whatever the number of workers. A line longer than
:data:`BLOCK_BYTES` is encoded in pieces cut before a space (no eos between
them): the ids are those of the whole line for the word, char and byte
tokenizers, GPT-2-style byte-level BPE and SentencePiece (which starts a
word at a space either way); a piece without a space in :data:`BLOCK_BYTES`
is cut between two characters, and white space that starts a line for more
than :data:`BLOCK_BYTES` is dropped. The line layout
keeps each line whole (an example) and splits at "\n" only: a line longer than
:data:`MAX_LINE_BYTES` is a DataError there.
"""

from __future__ import annotations

import collections
import concurrent.futures
import concurrent.futures.process
import contextlib
import dataclasses
import errno
import functools
import hashlib
import json
import multiprocessing
import os
import sys
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from lmkit.core.fileio import TempFolder, atomic_write_text, fsync_dir
from lmkit.core.progress import rate_progress
from lmkit.data import formats, textfile
from lmkit.data.cache_folders import TEMP_PREFIX, sweep_temp_folders
from lmkit.data.errors import DataError

__all__ = ["CACHE_ENV", "LineIds", "TokenStream", "cache_root", "cache_key", "open_cached", "encode_to_cache",
           "cached_stream", "encoding_workers", "open_cached_lines", "encode_lines_to_cache", "cached_lines",
           "sweep_temp_folders"]

CACHE_ENV = "LMKIT_DATA_CACHE"
WORKERS_ENV = "LMKIT_ENCODING_WORKERS"
FORMAT = 1
IDS_FILE = "ids.bin"
MANIFEST_FILE = "manifest.json"
LINES_FILE = "lines.bin"
BLANK_FILE = "blank.bin"
TOKENIZER_DIR = "tokenizer"
#: Raw bytes read at a time; a block handed to a worker holds at most twice as many (a longer line is
#: cut into pieces, see the module's docstring).
BLOCK_BYTES = textfile.BLOCK_BYTES
#: The longest line the line layout keeps whole (an example); a longer one is a DataError.
MAX_LINE_BYTES = 16 << 20
#: Below this many bytes of text one process encodes (starting workers costs more).
PARALLEL_MIN_BYTES = 16 << 20
_OFF = ("none", "off")
#: The names of temporary folders in the cache (``.tmp-<key>-<random>``) and their lock file.


@dataclasses.dataclass
class TokenStream:
    """A split's id stream and its counts.

    Attributes:
      ids: 1-D unsigned ids, a read-only ``numpy.memmap`` of the cache file.
      words: words of the text (as :func:`~lmkit.data.textfile.count_words`).
      lines: non-blank lines encoded.
      folder: the cache folder.
      reused: True when the folder existed before this call.
    """

    ids: np.ndarray
    words: int
    lines: int
    folder: str
    reused: bool

    def in_memory(self) -> "TokenStream":
        """A copy whose ids are in memory (to send to a rank that cannot map the file)."""
        return dataclasses.replace(self, ids=np.array(self.ids), reused=True)


@dataclasses.dataclass
class LineIds:
    """A file encoded line by line (:func:`cached_lines`): line ``i`` is ``ids[offsets[i]:offsets[i + 1]]``.

    Attributes:
      ids: 1-D unsigned ids of every line, one after the other (no eos).
      offsets: uint64 [lines + 1].
      blank: uint8 [lines], 1 for a line of only white space (its ids are empty).
      folder: the cache folder.
      reused: True when the folder existed before this call.
    """

    ids: np.ndarray
    offsets: np.ndarray
    blank: np.ndarray
    folder: str
    reused: bool

    @property
    def lines(self) -> int:
        return int(self.blank.size)

    def lengths(self) -> np.ndarray:
        """int64 [lines]: each line's number of ids."""
        return np.diff(self.offsets).astype(np.int64)

    def line(self, i: int) -> np.ndarray:
        """Line ``i``'s ids as int32."""
        return np.asarray(self.ids[int(self.offsets[i]):int(self.offsets[i + 1])], np.int32)

    def in_memory(self) -> "LineIds":
        """A copy held in memory (to send to a rank that cannot map the files)."""
        return LineIds(np.array(self.ids), np.array(self.offsets), np.array(self.blank), self.folder, True)


def cache_root(setting: str = "") -> Optional[str]:
    """The data cache folder of a config's ``data_cache`` value, or None when it is off.

    ``""`` is ``$LMKIT_DATA_CACHE``, else ``$XDG_CACHE_HOME/lmkit/tokens``,
    else ``~/.cache/lmkit/tokens``; ``"none"`` (or ``"off"``) keeps the ids in
    memory, encoded at every start.
    """
    setting = (setting or os.environ.get(CACHE_ENV, "")).strip()
    if setting.lower() in _OFF:
        return None
    if setting:
        return os.path.abspath(os.path.expanduser(setting))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "lmkit", "tokens")


def encoding_workers() -> int:
    """Processes for encoding: ``$LMKIT_ENCODING_WORKERS``, else the cores this process may use."""
    setting = os.environ.get(WORKERS_ENV, "").strip()
    if setting:
        if not setting.isdigit() or int(setting) < 1:
            raise DataError(f"{WORKERS_ENV} = {setting!r} must be a positive integer (processes "
                            "that encode text)")
        return int(setting)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _identity(path: str) -> Dict[str, object]:
    """What the cache key holds of a source: path, size, modification time, a sample of its content, and
    for JSON Lines, Parquet and datasets folders where the text is (:func:`lmkit.data.textfile.source_identity`)."""
    return textfile.source_identity(path)


def _tokenizer_record(tokenizer) -> Dict[str, object]:
    return {"name": tokenizer.name, "options": tokenizer.options, "vocab_size": int(tokenizer.vocab_size),
            "fingerprint": tokenizer.fingerprint()}


def cache_key(tokenizer, files: Sequence[str], add_eos: bool, layout: str = "stream") -> str:
    """The folder name of ``files`` encoded by ``tokenizer`` (see the module's docstring).

    ``layout`` is ``"stream"`` (:func:`encode_to_cache`) or ``"lines"`` (:func:`encode_lines_to_cache`).

    Raises:
      DataError: a file does not exist or cannot be read.
    """
    try:
        sources = [_identity(f) for f in files]
    except FileNotFoundError as exc:
        raise DataError(f"text file {exc.filename!r} does not exist; check the path") from None
    except OSError as exc:
        raise DataError(f"text file {exc.filename!r} cannot be read ({exc.strerror}); check its "
                        "permissions") from None
    record = {"format": FORMAT, "tokenizer": _tokenizer_record(tokenizer), "add_eos": bool(add_eos),
              "files": sources}
    if layout != "stream":  # the streams' keys stay those of the caches written before layouts
        record["layout"] = layout
    digest = hashlib.sha256(json.dumps(record, sort_keys=True).encode("utf-8")).hexdigest()
    return f"{tokenizer.name}-{digest[:24]}"


def _dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= (1 << 16) else np.uint32)


def _open_folder(folder: str, tokenizer) -> Optional[Tuple[Dict[str, object], np.ndarray]]:
    """The manifest of the cache ``folder``, checked against ``tokenizer``, and its ids mapped; None when
    there is no manifest."""
    manifest_path = os.path.join(folder, MANIFEST_FILE)
    if not os.path.isfile(manifest_path):
        return None
    fix = f"delete the folder {folder} (it is a cache) and run again"
    try:
        with open(manifest_path, "r", encoding="utf-8") as f:
            manifest = json.load(f)
        made_by = manifest["tokenizer"]
        count, dtype = int(manifest["num_tokens"]), np.dtype(manifest["dtype"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"the token cache {manifest_path} is not readable ({exc}); {fix}") from None
    wanted = _tokenizer_record(tokenizer)
    if made_by != wanted:
        raise DataError(f"the token cache {folder} was made by the {made_by.get('name')} tokenizer "
                        f"with fingerprint {made_by.get('fingerprint')}, not by this run's "
                        f"{wanted['name']} tokenizer with fingerprint {wanted['fingerprint']}; {fix}")
    return manifest, _map(folder, IDS_FILE, dtype, count)


def _map(folder: str, name: str, dtype: np.dtype, count: int) -> np.ndarray:
    """``folder/name`` as a read-only array of ``count`` ``dtype`` values; DataError when its size differs."""
    path = os.path.join(folder, name)
    size = os.path.getsize(path) if os.path.isfile(path) else -1
    if size != count * dtype.itemsize:
        raise DataError(f"the token cache {path} holds {max(size, 0)} bytes, but its manifest "
                        f"says {count} {dtype.name} values ({count * dtype.itemsize} bytes); delete the "
                        f"folder {folder} (it is a cache) and run again")
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,)) if count else np.zeros(0, dtype)


def open_cached(root: str, tokenizer, files: Sequence[str], add_eos: bool) -> Optional[TokenStream]:
    """The cached ids of ``files`` by ``tokenizer``, memory-mapped, or None when not cached.

    Raises:
      DataError: the folder exists but is broken or was made by another
        tokenizer (naming it, with the fix: delete it).
    """
    folder = os.path.join(root, cache_key(tokenizer, files, add_eos))
    opened = _open_folder(folder, tokenizer)
    if opened is None:
        return None
    manifest, ids = opened
    return TokenStream(ids=ids, words=int(manifest["words"]), lines=int(manifest["lines"]),
                       folder=folder, reused=True)


def open_cached_lines(root: str, tokenizer, path: str) -> Optional[LineIds]:
    """The cached line-by-line ids of ``path`` by ``tokenizer``, memory-mapped, or None when not cached.

    Raises:
      DataError: as :func:`open_cached`.
    """
    folder = os.path.join(root, cache_key(tokenizer, [path], False, layout="lines"))
    opened = _open_folder(folder, tokenizer)
    if opened is None:
        return None
    manifest, ids = opened
    try:
        lines = int(manifest["lines"])
    except (KeyError, TypeError, ValueError):
        raise DataError(f"the token cache {folder} has no line count; delete the folder (it is a cache) "
                        "and run again") from None
    offsets = _map(folder, LINES_FILE, np.dtype(np.uint64), lines + 1)
    return LineIds(ids, offsets, _map(folder, BLANK_FILE, np.dtype(np.uint8), lines), folder, True)


# -- encoding --------------------------------------------------------------------------------------
def _can_spawn() -> bool:
    """Whether new processes can start: they import the main script again, which must be a file.

    (``python - < script`` has none; such a caller encodes in one process.)
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return path is None or os.path.isfile(path)


_WORKER: Dict[str, object] = {}


def _init_worker(tokenizer_dir: str, add_eos: bool) -> None:
    from lmkit.data.tokenizers import load_tokenizer
    parent = multiprocessing.parent_process()
    if parent is not None and sys._getframe(1).f_code is concurrent.futures.process._process_worker.__code__:
        # The pool's initializer (not the call in the parent): a signal to the whole process group (Ctrl-C,
        # mpirun's SIGUSR1) is the parent's to act on; it shuts the pool down (lmkit.core.preemption).
        from lmkit.core.preemption import detach_worker
        detach_worker(parent.pid)
    _WORKER["tokenizer"] = load_tokenizer(tokenizer_dir)
    _WORKER["add_eos"] = add_eos


def _encode_block(text: str, continues: bool = False, ends_line: bool = True) -> Tuple[np.ndarray, int, int]:
    """``(ids, non-blank lines ended, words)`` of a block (:class:`lmkit.data.textfile.TextBlock`), as
    TextCorpus encodes whole lines: a piece of a long line that goes on in the next block gets no eos."""
    tokenizer = _WORKER["tokenizer"]
    add_eos = bool(_WORKER["add_eos"])
    if continues or not ends_line:  # a piece of a cut line is in it
        kept = [(piece, ends) for piece, has_text, ends in textfile.line_segments(text, continues, ends_line)
                if has_text]
        lines = [piece for piece, _ in kept]
        goes_on = bool(kept) and not kept[-1][1]  # only the last segment can go on
    else:  # whole lines, the usual block
        lines = [line for line in textfile.LINE_BREAK.split(text) if line.strip()]
        goes_on = False
    ended = len(lines) - goes_on
    words = ended if add_eos else 0
    end = getattr(tokenizer, "document_end", None)  # records' document separator (formats.documents_for)
    for line in lines:
        words += textfile.line_words(line, end)
    fast = tokenizer.encode_lines_flat(lines, add_eos)
    if fast is not None:
        return _fit(fast[:-1] if add_eos and goes_on else fast, tokenizer), ended, words
    eos = [tokenizer.eos_id] if add_eos else []
    flat: List[int] = []
    for ids in tokenizer.encode_batch(lines):
        flat.extend(ids)
        flat.extend(eos)
    if add_eos and goes_on:  # the line ends in a later block
        flat.pop()
    return _fit(np.asarray(flat, np.int64), tokenizer), ended, words


def _fit(ids: np.ndarray, tokenizer) -> np.ndarray:
    """``ids`` in the cache's dtype, once each is checked to be below the tokenizer's ``vocab_size`` (a
    uint16 file would turn an id above 65,535 into another token, silently)."""
    size = int(tokenizer.vocab_size)
    if ids.size:
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= size:
            raise DataError(f"the {tokenizer.name} tokenizer gave the id {high if high >= size else low}, "
                            f"outside its vocab_size {size} (ids 0..{size - 1}): its files disagree, and "
                            "the data cache stores no id it cannot keep exactly; repair or replace the "
                            "tokenizer")
    return ids.astype(_dtype(size), copy=False)


def _encode_block_lines(text: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids, ids per line, blank flags)`` of whole lines of text, each line as ``tokenizer.encode``
    reads it: split at "\n" only, a final "\r" dropped (as :func:`lmkit.data.paired.read_lines`)."""
    tokenizer = _WORKER["tokenizer"]
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    blank = np.array([not line.strip() for line in lines], np.uint8)
    encoded = iter(tokenizer.encode_batch([line for line, b in zip(lines, blank) if not b]))
    lengths = np.zeros(len(lines), np.int64)
    flat: List[int] = []
    for k, b in enumerate(blank):
        if not b:
            ids = next(encoded)
            lengths[k] = len(ids)
            flat.extend(ids)
    return _fit(np.asarray(flat, np.int64), tokenizer), lengths, blank


class _Blocks:
    """A file's blocks (:class:`lmkit.data.textfile.TextBlocks`) as the arguments of the encoder of
    ``layout`` (``"stream"``: ``(text, continues, ends_line)``; ``"lines"``: ``(text,)``), hashed as
    read, and checked for changes at the end."""

    def __init__(self, path: str, what: str, layout: str = "stream") -> None:
        self.path, self.what, self.layout = path, what, layout
        self.identity = _identity(path)
        self.sha256 = hashlib.sha256()
        stream = layout == "stream"
        self._blocks = textfile.TextBlocks(
            path, what, block_bytes=BLOCK_BYTES, cr_breaks=stream, plain=not stream,
            max_line_bytes=None if stream else MAX_LINE_BYTES,
            long_line_fix="each line of an encoder-decoder's file is one example, split at \\n only; "
                          "break the line into shorter examples or remove it")

    @property
    def read(self) -> int:
        """Bytes of the source read so far (a compressed file's compressed bytes)."""
        return self._blocks.consumed

    def __iter__(self):
        for block in self._blocks:
            self.sha256.update(block.raw)
            if self.layout == "stream":
                yield block.text, block.continues, block.ends_line
            else:
                yield (block.text,)
        self.check_unchanged()

    def check_unchanged(self) -> None:
        now = _identity(self.path)
        if now != self.identity or self.read != self.identity["size"]:
            change = f"size {self.identity['size']} -> {now['size']} bytes" \
                if now["size"] != self.identity["size"] else "its content or modification time"
            raise DataError(f"{self.what} {self.path!r} changed while it was being encoded ({change}); run "
                            "again once nothing writes to it")


def _progress(log: Callable[[str], None], what: str, total: int, every: float = 2.0):
    """A callback ``(bytes done) -> None`` that logs MB/s and the time left, at most every ``every`` s."""
    return rate_progress(log, f"encoding {what}", total, unit="MB", scale=1e6, digits=1, every=every)


def encode_to_cache(root: str, tokenizer, files: Sequence[str], add_eos: bool, *,
                    what: str = "train_file", workers: Optional[int] = None,
                    log: Callable[[str], None] = lambda line: None) -> TokenStream:
    """Encodes ``files`` with ``tokenizer`` into the cache at ``root`` (or finds them there).

    Args:
      root: the cache folder (:func:`cache_root`).
      tokenizer: any :class:`~lmkit.data.tokenizers.Tokenizer`.
      files: the split's files, in reading order (checked text files).
      add_eos: end every non-blank line with the tokenizer's eos id.
      what: how messages call the split, e.g. ``"train_file"``.
      workers: encoding processes; None: one per core for large texts, one
        for small ones (:data:`PARALLEL_MIN_BYTES`).
      log: where progress lines go (rank 0's log).

    Returns:
      The :class:`TokenStream`, memory-mapped from the cache.

    Raises:
      DataError: a file is not UTF-8 text or changed while being read, or
        the disk is full (nothing is left behind in either case).
    """
    found = open_cached(root, tokenizer, files, add_eos)
    if found is not None:
        return found
    total = sum(formats.source_size(f) for f in files)

    def fill(temp: str, workers: int) -> Dict[str, object]:
        return _encode_files(temp, tokenizer, files, add_eos, what, workers, total, log)

    return _build_folder(root, cache_key(tokenizer, files, add_eos), tokenizer, what, total, workers,
                         dict(add_eos=bool(add_eos)), fill,
                         functools.partial(open_cached, root, tokenizer, files, add_eos), log)


def _build_folder(root: str, key: str, tokenizer, what: str, total: int, workers: Optional[int],
                  record: Dict[str, object], fill: Callable[[str, int], Dict[str, object]],
                  reopen: Callable[[], Any], log: Callable[[str], None]) -> Any:
    """Writes the cache folder ``root/key`` and returns ``reopen()`` of it (``reused`` False):
    ``fill(temp folder, workers)`` writes the token files and returns the manifest's counts; the
    folder is renamed into place only when complete. The leftovers of killed encodings go first."""
    final = os.path.join(root, key)
    if workers is None:
        workers = encoding_workers() if total >= PARALLEL_MIN_BYTES else 1
    workers = max(1, int(workers))
    sweep_temp_folders(root, log)
    try:
        temp = TempFolder(root, f"{TEMP_PREFIX}{key}-")
    except OSError as exc:
        raise DataError(f"cannot create the data cache folder {root} ({exc.strerror}); set "
                        "--data_cache to a writable folder, or --data_cache none") from None
    try:
        start = time.perf_counter()
        tokenizer.save(os.path.join(temp.path, TOKENIZER_DIR))
        manifest = fill(temp.path, workers)
        manifest.update(format=FORMAT, key=key, tokenizer=_tokenizer_record(tokenizer), **record,
                        seconds=round(time.perf_counter() - start, 3))
        atomic_write_text(os.path.join(temp.path, MANIFEST_FILE), json.dumps(manifest, indent=1) + "\n")
        try:
            temp.publish(final)
        except OSError:  # another process put the same folder in place first
            if not os.path.isfile(os.path.join(final, MANIFEST_FILE)):
                raise
        fsync_dir(root)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DataError(f"the disk of the data cache {root} is full: encoding {what} needs about "
                            f"{total * 2 / 1e6:.0f} MB there; free space, or set --data_cache to a "
                            "folder on another disk (or none: no cache)") from None
        raise DataError(f"cannot write the data cache {root} ({exc.strerror or exc}); set "
                        "--data_cache to a writable folder, or --data_cache none") from None
    finally:
        temp.close()
    found = reopen()
    if found is None:
        raise DataError(f"{what} changed while it was being encoded; run again once nothing writes to it")
    found.reused = False
    return found


# -- temporary folders ---------------------------------------------------------------------------
@contextlib.contextmanager
def _encoders(workers: int, tokenizer_dir: str, add_eos: bool):
    """A pool of ``workers`` encoding processes (None: encode in this process), each with the tokenizer."""
    from lmkit.core.preemption import signals_held
    pool = None
    try:
        if workers > 1 and _can_spawn():
            # Started with the preemption signals held: a signal to the whole process group
            # (mpirun's SIGUSR1, Ctrl-C) then cannot end a worker, or multiprocessing's resource
            # tracker, before they are set up; submitting starts every worker at once.
            with signals_held():
                pool = concurrent.futures.ProcessPoolExecutor(
                    workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker,
                    initargs=(tokenizer_dir, add_eos))
                pool.submit(int)
        else:
            _init_worker(tokenizer_dir, add_eos)
        yield pool
    except BaseException:
        if pool is not None:  # stopping (a signal, an error): end the workers, do not wait on their queues
            _end_pool(pool)
            pool = None
        raise
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _end_pool(pool: concurrent.futures.ProcessPoolExecutor, grace: float = 10.0) -> None:
    """Ends a pool whose work is abandoned (a signal, an error): its queued blocks cancelled, the
    blocks in flight given ``grace`` seconds, then its workers terminated.

    ``shutdown(wait=True)`` would wait for good on Python 3.10 once a worker
    died of a signal (the pool's queue feeder stays blocked on a pipe nobody
    reads); a stop must not.
    """
    processes = list(getattr(pool, "_processes", None) or {})
    processes = [pool._processes[k] for k in processes] if processes else []
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    if manager is not None:
        manager.join(grace)
        if not manager.is_alive():
            return
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(2.0)
        if process.is_alive():
            process.kill()
            process.join(1.0)
    # The pool's stuck threads keep its queues, whose semaphores multiprocessing unlinks only in
    # finalizers that a stopping process (os._exit) never runs: the resource tracker would then
    # warn of leaked semaphores. Run those finalizers now.
    import multiprocessing.util
    with contextlib.suppress(Exception):
        multiprocessing.util._run_finalizers(0)


def _map_blocks(blocks: "_Blocks", encode: Callable[..., object], pool, workers: int, what: str,
                take: Callable[[object], None]) -> None:
    """``take(encode(*block))`` for every block in order, ``2 x workers`` blocks in flight in ``pool``."""
    pending: Deque = collections.deque()

    def next_result() -> None:
        try:
            result = pending.popleft().result() if pool else pending.popleft()
        except concurrent.futures.process.BrokenProcessPool:
            raise DataError(f"an encoding process died while encoding {what} (out of "
                            "memory?); run again, with fewer processes "
                            "(LMKIT_ENCODING_WORKERS=1) if it happens again") from None
        take(result)

    for args in blocks:
        pending.append(pool.submit(encode, *args) if pool else encode(*args))
        while len(pending) > (2 * workers if pool else 0):
            next_result()
    while pending:
        next_result()


def _encode_files(folder: str, tokenizer, files: Sequence[str], add_eos: bool, what: str,
                  workers: int, total: int, log: Callable[[str], None]) -> Dict[str, object]:
    """Writes ``folder/ids.bin``; returns the manifest's counts and sources."""
    dtype = _dtype(tokenizer.vocab_size)
    names = files[0] if len(files) == 1 else f"{len(files)} files"
    log(f"encoding {what} ({names}, {total / 1e6:.1f} MB) with the {tokenizer.name} tokenizer in "
        f"{workers} process(es) into the data cache {os.path.dirname(folder)}")
    update = _progress(log, what, total)
    sources: List[Dict[str, object]] = []
    counts = {"num_tokens": 0, "lines": 0, "words": 0}
    done_before = 0
    with _encoders(workers, os.path.join(folder, TOKENIZER_DIR), add_eos) as pool, \
            open(os.path.join(folder, IDS_FILE), "wb") as out:
        for path in files:
            blocks = _Blocks(path, what)
            file_counts = {"num_tokens": 0, "lines": 0, "words": 0}

            def take(result) -> None:
                ids, lines, words = result
                out.write(ids.astype(dtype, copy=False).tobytes())
                for k, v in (("num_tokens", ids.size), ("lines", lines), ("words", words)):
                    file_counts[k] += int(v)
                update(done_before + blocks.read)

            _map_blocks(blocks, _encode_block, pool, workers, what, take)
            done_before += blocks.read
            sources.append(dict(blocks.identity, sha256=blocks.sha256.hexdigest(),
                                token_offset=counts["num_tokens"], **file_counts))
            for k in counts:
                counts[k] += file_counts[k]
        out.flush()
        os.fsync(out.fileno())
    update(done_before, final=True)
    if counts["num_tokens"] == 0:
        raise DataError(f"{what} ({names}) has no text (only blank lines); give files with text, "
                        "one sentence or paragraph a line")
    return dict(counts, dtype=dtype.name, files=sources)


def cached_stream(root: str, tokenizer, files: Sequence[str], add_eos: bool, *, what: str,
                  workers: Optional[int] = None,
                  log: Callable[[str], None] = lambda line: None) -> TokenStream:
    """:func:`open_cached`, else :func:`encode_to_cache` after checking each file."""
    found = open_cached(root, tokenizer, files, add_eos)
    if found is not None:
        return found
    from lmkit.data.textfile import check_text_file
    for path in files:
        check_text_file(path, what)
    return encode_to_cache(root, tokenizer, files, add_eos, what=what, workers=workers, log=log)


def encode_lines_to_cache(root: str, tokenizer, path: str, *, what: str = "source_file",
                          workers: Optional[int] = None,
                          log: Callable[[str], None] = lambda line: None) -> LineIds:
    """Encodes the file ``path`` line by line into the cache at ``root`` (or finds it there).

    Every line (split as :func:`lmkit.data.paired.read_lines` splits) gets
    ``tokenizer.encode(line)``, a line of only white space none; no eos is added.
    The arguments, the encoding in ``workers`` processes and the errors are
    :func:`encode_to_cache`'s.
    """
    found = open_cached_lines(root, tokenizer, path)
    if found is not None:
        return found
    total = os.path.getsize(path)

    def fill(temp: str, workers: int) -> Dict[str, object]:
        dtype = _dtype(tokenizer.vocab_size)
        log(f"encoding {what} ({path}, {total / 1e6:.1f} MB) line by line with the {tokenizer.name} "
            f"tokenizer in {workers} process(es) into the data cache {root}")
        update = _progress(log, what, total)
        blocks = _Blocks(path, what, layout="lines")
        counts = {"num_tokens": 0, "lines": 0}
        with _encoders(workers, os.path.join(temp, TOKENIZER_DIR), False) as pool, \
                open(os.path.join(temp, IDS_FILE), "wb") as ids_out, \
                open(os.path.join(temp, LINES_FILE), "wb") as lines_out, \
                open(os.path.join(temp, BLANK_FILE), "wb") as blank_out:
            lines_out.write(np.zeros(1, np.uint64).tobytes())

            def take(result) -> None:
                ids, lengths, blank = result
                ids_out.write(ids.astype(dtype, copy=False).tobytes())
                ends = counts["num_tokens"] + np.cumsum(lengths, dtype=np.uint64)
                lines_out.write(ends.astype(np.uint64, copy=False).tobytes())
                blank_out.write(blank.astype(np.uint8).tobytes())
                counts["num_tokens"] += int(ids.size)
                counts["lines"] += int(blank.size)
                update(blocks.read)

            _map_blocks(blocks, _encode_block_lines, pool, workers, what, take)
            for out in (ids_out, lines_out, blank_out):
                out.flush()
                os.fsync(out.fileno())
        update(blocks.read, final=True)
        return dict(counts, dtype=dtype.name, files=[dict(blocks.identity, sha256=blocks.sha256.hexdigest())])

    return _build_folder(root, cache_key(tokenizer, [path], False, layout="lines"), tokenizer, what, total,
                         workers, dict(add_eos=False, layout="lines"), fill,
                         functools.partial(open_cached_lines, root, tokenizer, path), log)


def cached_lines(root: str, tokenizer, path: str, *, what: str, workers: Optional[int] = None,
                 log: Callable[[str], None] = lambda line: None) -> LineIds:
    """:func:`open_cached_lines`, else :func:`encode_lines_to_cache` after checking the file."""
    found = open_cached_lines(root, tokenizer, path)
    if found is not None:
        return found
    from lmkit.data.textfile import check_text_file
    check_text_file(path, what, plain=True)
    return encode_lines_to_cache(root, tokenizer, path, what=what, workers=workers, log=log)
