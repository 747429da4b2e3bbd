"""Text encoded once into token files that every later run memory-maps.

A split of a corpus (its source files) encoded by a tokenizer is kept in a
folder of the data cache (:func:`cache_root`: ``--data_cache``, else
``$LMKIT_DATA_CACHE``, else ``$XDG_CACHE_HOME/lmkit/tokens`` or
``~/.cache/lmkit/tokens``)::

    <cache>/<key>/ids.bin          the token ids, uint16 (vocabularies up to 65,536) or uint32
    <cache>/<key>/manifest.json    the sources (path, size, mtime, sha256) with their token
                                   offsets, line and word counts; the tokenizer
    <cache>/<key>/tokenizer/       the tokenizer that made the ids

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
import concurrent.futures
import concurrent.futures.process
import dataclasses
import errno
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import sys
import tempfile
import time
from typing import Callable, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from lmkit.data.errors import DataError
from lmkit.fileio import atomic_write_text, fsync_dir

__all__ = ["CACHE_ENV", "TokenStream", "cache_root", "cache_key", "open_cached", "encode_to_cache",
           "cached_stream", "encoding_workers"]

CACHE_ENV = "LMKIT_DATA_CACHE"
WORKERS_ENV = "LMKIT_ENCODING_WORKERS"
FORMAT = 1
IDS_FILE = "ids.bin"
MANIFEST_FILE = "manifest.json"
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


def cache_key(tokenizer, files: Sequence[str], add_eos: bool) -> str:
    """The folder name of ``files`` encoded by ``tokenizer`` (see the module's docstring).

    Raises:
      DataError: a file does not exist.
    """
    try:
        sources = [_identity(f) for f in files]
    except FileNotFoundError as exc:
        raise DataError(f"text file {exc.filename!r} does not exist; check the path") from None
    record = {"format": FORMAT, "tokenizer": _tokenizer_record(tokenizer), "add_eos": bool(add_eos),
              "files": sources}
    digest = hashlib.sha256(json.dumps(record, sort_keys=True).encode("utf-8")).hexdigest()
    return f"{tokenizer.name}-{digest[:24]}"


def _dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= (1 << 16) else np.uint32)


def open_cached(root: str, tokenizer, files: Sequence[str], add_eos: bool) -> Optional[TokenStream]:
    """The cached ids of ``files`` by ``tokenizer``, memory-mapped, or None when not cached.

    Raises:
      DataError: the folder exists but is broken or was made by another
        tokenizer (naming it, with the fix: delete it).
    """
    folder = os.path.join(root, cache_key(tokenizer, files, add_eos))
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
    ids_path = os.path.join(folder, IDS_FILE)
    size = os.path.getsize(ids_path) if os.path.isfile(ids_path) else -1
    if size != count * dtype.itemsize:
        raise DataError(f"the token cache {ids_path} holds {max(size, 0)} bytes, but its manifest "
                        f"says {count} {dtype.name} ids ({count * dtype.itemsize} bytes); {fix}")
    ids = np.memmap(ids_path, dtype=dtype, mode="r", shape=(count,)) if count else np.zeros(0, dtype)
    return TokenStream(ids=ids, words=int(manifest["words"]), lines=int(manifest["lines"]),
                       folder=folder, reused=True)


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
    start = last = time.perf_counter()

    def update(done: int, final: bool = False) -> None:
        nonlocal last
        now = time.perf_counter()
        if not final and now - last < every:
            return
        last = now
        rate = done / max(now - start, 1e-9)
        eta = (total - done) / rate if rate > 0 else float("inf")
        log(f"encoding {what}: {done / 1e6:.1f}/{total / 1e6:.1f} MB, {rate / 1e6:.1f} MB/s"
            + ("" if final else f", about {eta:.0f} s left"))
    return update


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
    key = cache_key(tokenizer, files, add_eos)
    final = os.path.join(root, key)
    total = sum(os.path.getsize(f) for f in files)
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
        manifest = _encode_files(temp, tokenizer, files, add_eos, what, workers, total, log)
        manifest.update(format=FORMAT, key=key, tokenizer=_tokenizer_record(tokenizer),
                        add_eos=bool(add_eos), seconds=round(time.perf_counter() - start, 3))
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
    stream = open_cached(root, tokenizer, files, add_eos)
    if stream is None:
        raise DataError(f"{what} changed while it was being encoded; run again once nothing writes to it")
    stream.reused = False
    return stream


def _encode_files(folder: str, tokenizer, files: Sequence[str], add_eos: bool, what: str,
                  workers: int, total: int, log: Callable[[str], None]) -> Dict[str, object]:
    """Writes ``folder/ids.bin``; returns the manifest's counts and sources."""
    dtype = _dtype(tokenizer.vocab_size)
    names = files[0] if len(files) == 1 else f"{len(files)} files"
    log(f"encoding {what} ({names}, {total / 1e6:.1f} MB) with the {tokenizer.name} tokenizer in "
        f"{workers} process(es) into the data cache {os.path.dirname(folder)}")
    update = _progress(log, what, total)
    pool = None
    tokenizer_dir = os.path.join(folder, TOKENIZER_DIR)
    if workers > 1 and _can_spawn():
        pool = concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker,
            initargs=(tokenizer_dir, add_eos))
    else:
        _init_worker(tokenizer_dir, add_eos)
    sources: List[Dict[str, object]] = []
    counts = {"num_tokens": 0, "lines": 0, "words": 0}
    done_before = 0
    try:
        with open(os.path.join(folder, IDS_FILE), "wb") as out:
            for path in files:
                blocks = _Blocks(path, what)
                file_counts = {"num_tokens": 0, "lines": 0, "words": 0}
                pending: Deque = collections.deque()

                def take() -> None:
                    try:
                        ids, lines, words = pending.popleft().result() if pool else pending.popleft()
                    except concurrent.futures.process.BrokenProcessPool:
                        raise DataError(f"an encoding process died while encoding {what} (out of "
                                        "memory?); run again, with fewer processes "
                                        "(LMKIT_ENCODING_WORKERS=1) if it happens again") from None
                    out.write(ids.astype(dtype, copy=False).tobytes())
                    for k, v in (("num_tokens", ids.size), ("lines", lines), ("words", words)):
                        file_counts[k] += int(v)
                    update(done_before + blocks.read)

                for text in blocks:
                    pending.append(pool.submit(_encode_block, text) if pool else _encode_block(text))
                    while len(pending) > (2 * workers if pool else 0):
                        take()
                while pending:
                    take()
                done_before += blocks.read
                sources.append(dict(blocks.identity, sha256=blocks.sha256.hexdigest(),
                                    token_offset=counts["num_tokens"], **file_counts))
                for k in counts:
                    counts[k] += file_counts[k]
            out.flush()
            os.fsync(out.fileno())
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
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
