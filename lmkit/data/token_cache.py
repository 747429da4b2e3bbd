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
lines end with an eos id, and each source's absolute path, size and
modification time: a run with the same text and tokenizer, in any model
folder, finds the folder; a changed source or another tokenizer gives another
key, so a cache is never stale. A folder is written under a temporary name
and renamed into place when complete, so a killed or failed encoding (a full
disk, a source that changed while being read) leaves nothing that a later run
could take for a cache.

Encoding (:func:`encode_to_cache`) reads each file in blocks of whole lines
(memory does not grow with the file) and encodes the blocks in worker
processes, one per core, in order; the ids are those of
:meth:`lmkit.data.text.TextCorpus.encode_text_lines` (blank lines skipped,
eos after each line) whatever the number of workers.
"""

from __future__ import annotations

import collections
import contextlib
import concurrent.futures
import concurrent.futures.process
import dataclasses
import errno
import functools
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from lmkit.data.errors import DataError
from lmkit.fileio import atomic_write_text, fsync_dir
from lmkit.progress import rate_progress

__all__ = ["CACHE_ENV", "LineIds", "TokenStream", "cache_root", "cache_key", "open_cached", "encode_to_cache",
           "cached_stream", "encoding_workers", "open_cached_lines", "encode_lines_to_cache", "cached_lines"]

CACHE_ENV = "LMKIT_DATA_CACHE"
WORKERS_ENV = "LMKIT_ENCODING_WORKERS"
FORMAT = 1
IDS_FILE = "ids.bin"
MANIFEST_FILE = "manifest.json"
LINES_FILE = "lines.bin"
BLANK_FILE = "blank.bin"
TOKENIZER_DIR = "tokenizer"
#: Raw bytes per block handed to a worker (whole lines; a longer line makes a longer block).
BLOCK_BYTES = 4 << 20
#: Below this many bytes of text one process encodes (starting workers costs more).
PARALLEL_MIN_BYTES = 16 << 20
_OFF = ("none", "off")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # what read_lines (universal newlines) splits on


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
    st = os.stat(path)
    return {"path": os.path.abspath(path), "size": int(st.st_size), "mtime_ns": int(st.st_mtime_ns)}


def _tokenizer_record(tokenizer) -> Dict[str, object]:
    return {"name": tokenizer.name, "options": tokenizer.options, "vocab_size": int(tokenizer.vocab_size),
            "fingerprint": tokenizer.fingerprint()}


def cache_key(tokenizer, files: Sequence[str], add_eos: bool, layout: str = "stream") -> str:
    """The folder name of ``files`` encoded by ``tokenizer`` (see the module's docstring).

    ``layout`` is ``"stream"`` (:func:`encode_to_cache`) or ``"lines"`` (:func:`encode_lines_to_cache`).

    Raises:
      DataError: a file does not exist.
    """
    try:
        sources = [_identity(f) for f in files]
    except FileNotFoundError as exc:
        raise DataError(f"text file {exc.filename!r} does not exist; check the path") from None
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
    _WORKER["tokenizer"] = load_tokenizer(tokenizer_dir)
    _WORKER["add_eos"] = add_eos


def _encode_block(text: str) -> Tuple[np.ndarray, int, int]:
    """``(ids, non-blank lines, words)`` of whole lines of text, as TextCorpus encodes them."""
    tokenizer = _WORKER["tokenizer"]
    add_eos = bool(_WORKER["add_eos"])
    lines = [line for line in _LINE_BREAK.split(text) if line.strip()]
    words = 0
    for line in lines:
        count = len(line.split())
        words += count + (1 if add_eos and count else 0)
    dtype = _dtype(tokenizer.vocab_size)
    fast = tokenizer.encode_lines_flat(lines, add_eos)
    if fast is not None:
        return fast.astype(dtype, copy=False), len(lines), words
    eos = [tokenizer.eos_id] if add_eos else []
    flat: List[int] = []
    for ids in tokenizer.encode_batch(lines):
        flat.extend(ids)
        flat.extend(eos)
    return np.asarray(flat, dtype=dtype), len(lines), words


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
    return np.asarray(flat, dtype=_dtype(tokenizer.vocab_size)), lengths, blank


class _Blocks:
    """Whole-line blocks of a file, decoded, hashed as read, and checked for changes."""

    def __init__(self, path: str, what: str) -> None:
        self.path, self.what = path, what
        self.identity = _identity(path)
        self.sha256 = hashlib.sha256()
        self.read = 0
        self.lines_before = 0

    def _decode(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = self.lines_before + raw.count(b"\n", 0, exc.start) + 1
            raise DataError(f"{self.what} {self.path!r} is not UTF-8: line {line} has the byte "
                            f"0x{raw[exc.start]:02x} ({exc.reason}); convert the file with e.g. "
                            f"`iconv -f LATIN1 -t UTF-8 {self.path} > fixed.txt`") from None

    def __iter__(self):
        carry = b""
        with open(self.path, "rb") as f:
            while True:
                chunk = f.read(BLOCK_BYTES)
                if not chunk:
                    break
                self.read += len(chunk)
                self.sha256.update(chunk)
                nul = chunk.find(b"\0")
                if nul >= 0:
                    raise DataError(f"{self.what} {self.path!r} is a binary file (a NUL byte at "
                                    f"offset {self.read - len(chunk) + nul}), not "
                                    "text; give UTF-8 text files, one sentence or paragraph a line")
                data = carry + chunk
                cut = data.rfind(b"\n") + 1
                if cut == 0:  # no line end yet: a longer block
                    carry = data
                    continue
                block, carry = data[:cut], data[cut:]
                yield self._decode(block)
                self.lines_before += block.count(b"\n")
        if carry:
            yield self._decode(carry)
        self.check_unchanged()

    def check_unchanged(self) -> None:
        now = _identity(self.path)
        if now != self.identity or self.read != self.identity["size"]:
            raise DataError(f"{self.what} {self.path!r} changed while it was being encoded (size "
                            f"{self.identity['size']} -> {now['size']} bytes); run again once nothing "
                            "writes to it")


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
    total = sum(os.path.getsize(f) for f in files)

    def fill(temp: str, workers: int) -> Dict[str, object]:
        return _encode_files(temp, tokenizer, files, add_eos, what, workers, total, log)

    return _build_folder(root, cache_key(tokenizer, files, add_eos), tokenizer, what, total, workers,
                         dict(add_eos=bool(add_eos)), fill,
                         functools.partial(open_cached, root, tokenizer, files, add_eos))


def _build_folder(root: str, key: str, tokenizer, what: str, total: int, workers: Optional[int],
                  record: Dict[str, object], fill: Callable[[str, int], Dict[str, object]],
                  reopen: Callable[[], Any]) -> Any:
    """Writes the cache folder ``root/key`` and returns ``reopen()`` of it (``reused`` False):
    ``fill(temp folder, workers)`` writes the token files and returns the manifest's counts; the
    folder is renamed into place only when complete."""
    final = os.path.join(root, key)
    if workers is None:
        workers = encoding_workers() if total >= PARALLEL_MIN_BYTES else 1
    workers = max(1, int(workers))
    try:
        os.makedirs(root, exist_ok=True)
        temp = tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=root)
    except OSError as exc:
        raise DataError(f"cannot create the data cache folder {root} ({exc.strerror}); set "
                        "--data_cache to a writable folder, or --data_cache none") from None
    try:
        start = time.perf_counter()
        tokenizer.save(os.path.join(temp, TOKENIZER_DIR))
        manifest = fill(temp, workers)
        manifest.update(format=FORMAT, key=key, tokenizer=_tokenizer_record(tokenizer), **record,
                        seconds=round(time.perf_counter() - start, 3))
        atomic_write_text(os.path.join(temp, MANIFEST_FILE), json.dumps(manifest, indent=1) + "\n")
        try:
            os.rename(temp, final)
        except OSError:  # another process put the same folder in place first
            if not os.path.isfile(os.path.join(final, MANIFEST_FILE)):
                raise
            shutil.rmtree(temp, ignore_errors=True)
        fsync_dir(root)
    except OSError as exc:
        shutil.rmtree(temp, ignore_errors=True)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DataError(f"the disk of the data cache {root} is full: encoding {what} needs about "
                            f"{total * 2 / 1e6:.0f} MB there; free space, or set --data_cache to a "
                            "folder on another disk (or none: no cache)") from None
        raise DataError(f"cannot write the data cache {root} ({exc.strerror or exc}); set "
                        "--data_cache to a writable folder, or --data_cache none") from None
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    found = reopen()
    if found is None:
        raise DataError(f"{what} changed while it was being encoded; run again once nothing writes to it")
    found.reused = False
    return found


@contextlib.contextmanager
def _encoders(workers: int, tokenizer_dir: str, add_eos: bool):
    """A pool of ``workers`` encoding processes (None: encode in this process), each with the tokenizer."""
    pool = None
    if workers > 1 and _can_spawn():
        pool = concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker,
            initargs=(tokenizer_dir, add_eos))
    else:
        _init_worker(tokenizer_dir, add_eos)
    try:
        yield pool
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _map_blocks(blocks: "_Blocks", encode: Callable[[str], object], pool, workers: int, what: str,
                take: Callable[[object], None]) -> None:
    """``take(encode(block))`` for every block in order, ``2 x workers`` blocks in flight in ``pool``."""
    pending: Deque = collections.deque()

    def next_result() -> None:
        try:
            result = pending.popleft().result() if pool else pending.popleft()
        except concurrent.futures.process.BrokenProcessPool:
            raise DataError(f"an encoding process died while encoding {what} (out of "
                            "memory?); run again, with fewer processes "
                            "(LMKIT_ENCODING_WORKERS=1) if it happens again") from None
        take(result)

    for text in blocks:
        pending.append(pool.submit(encode, text) if pool else encode(text))
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
        blocks = _Blocks(path, what)
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
                         functools.partial(open_cached_lines, root, tokenizer, path))


def cached_lines(root: str, tokenizer, path: str, *, what: str, workers: Optional[int] = None,
                 log: Callable[[str], None] = lambda line: None) -> LineIds:
    """:func:`open_cached_lines`, else :func:`encode_lines_to_cache` after checking the file."""
    found = open_cached_lines(root, tokenizer, path)
    if found is not None:
        return found
    from lmkit.data.textfile import check_text_file
    check_text_file(path, what)
    return encode_lines_to_cache(root, tokenizer, path, what=what, workers=workers, log=log)
