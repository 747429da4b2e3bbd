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
processes (:mod:`lmkit.data.encoding_pool`), one per core, in order; the ids
are those of :meth:`lmkit.data.text.TextCorpus.encode_text_lines` (blank
lines skipped, eos after each line) whatever the number of workers. A line
longer than ``BLOCK_BYTES`` is encoded in pieces cut before a space (no eos
between them): the ids are those of the whole line for the word, char and
byte tokenizers, GPT-2-style byte-level BPE and SentencePiece (which starts
a word at a space either way); a piece without a space in ``BLOCK_BYTES`` is
cut between two characters, and white space that starts a line for more
than ``BLOCK_BYTES`` is dropped. The line layout keeps each line whole (an
example) and splits at "\n" only: a line longer than ``MAX_LINE_BYTES`` is a
DataError there.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import hashlib
import json
import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from lmkit.core.fileio import TempFolder, atomic_write_text, fsync_dir
from lmkit.core.progress import rate_progress
from lmkit.data import formats, textfile
from lmkit.data.cache_folders import TEMP_PREFIX, sweep_temp_folders
from lmkit.data.encoding_pool import (
    SourceBlocks,
    encode_block,
    encode_block_lines,
    encoders,
    encoding_workers,
    id_dtype,
    map_blocks,
)
from lmkit.data.errors import DataError

__all__ = ["CACHE_ENV", "LineIds", "TokenStream", "cache_root", "cache_key", "open_cached", "encode_to_cache",
           "cached_stream", "encoding_workers", "open_cached_lines", "encode_lines_to_cache", "cached_lines",
           "sweep_temp_folders"]

CACHE_ENV = "LMKIT_DATA_CACHE"
FORMAT = 1
IDS_FILE = "ids.bin"
MANIFEST_FILE = "manifest.json"
LINES_FILE = "lines.bin"
BLANK_FILE = "blank.bin"
TOKENIZER_DIR = "tokenizer"
#: Below this many bytes of text one process encodes (starting workers costs more).
PARALLEL_MIN_BYTES = 16 << 20
_OFF = ("none", "off")


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


def _tokenizer_record(tokenizer) -> Dict[str, object]:
    return {"name": tokenizer.name, "options": tokenizer.options, "vocab_size": int(tokenizer.vocab_size),
            "fingerprint": tokenizer.fingerprint()}


def source_identities(files: Sequence[Any]) -> List[Dict[str, object]]:
    """What a cache's key holds of each source (:func:`lmkit.data.textfile.source_identity`).

    Raises:
      DataError: a file does not exist or cannot be read.
    """
    try:
        return [textfile.source_identity(f) for f in files]
    except FileNotFoundError as exc:
        raise DataError(f"text file {exc.filename!r} does not exist; check the path") from None
    except OSError as exc:
        raise DataError(f"text file {exc.filename!r} cannot be read ({exc.strerror}); check its "
                        "permissions") from None


def cache_key(tokenizer, files: Sequence[str], add_eos: bool, layout: str = "stream") -> str:
    """The folder name of ``files`` encoded by ``tokenizer`` (see the module's docstring).

    ``layout`` is ``"stream"`` (:func:`encode_to_cache`) or ``"lines"`` (:func:`encode_lines_to_cache`).

    Raises:
      DataError: a file does not exist or cannot be read.
    """
    record = {"format": FORMAT, "tokenizer": _tokenizer_record(tokenizer), "add_eos": bool(add_eos),
              "files": source_identities(files)}
    if layout != "stream":  # the streams' keys stay those of the caches written before layouts
        record["layout"] = layout
    digest = hashlib.sha256(json.dumps(record, sort_keys=True).encode("utf-8")).hexdigest()
    return f"{tokenizer.name}-{digest[:24]}"


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


def _encode_files(folder: str, tokenizer, files: Sequence[str], add_eos: bool, what: str,
                  workers: int, total: int, log: Callable[[str], None]) -> Dict[str, object]:
    """Writes ``folder/ids.bin``; returns the manifest's counts and sources."""
    dtype = id_dtype(tokenizer.vocab_size)
    names = files[0] if len(files) == 1 else f"{len(files)} files"
    log(f"encoding {what} ({names}, {total / 1e6:.1f} MB) with the {tokenizer.name} tokenizer in "
        f"{workers} process(es) into the data cache {os.path.dirname(folder)}")
    update = _progress(log, what, total)
    sources: List[Dict[str, object]] = []
    counts = {"num_tokens": 0, "lines": 0, "words": 0}
    done_before = 0
    with encoders(workers, os.path.join(folder, TOKENIZER_DIR), add_eos, what) as pool, \
            open(os.path.join(folder, IDS_FILE), "wb") as out:
        for path in files:
            blocks = SourceBlocks(path, what)
            file_counts = {"num_tokens": 0, "lines": 0, "words": 0}

            def take(result) -> None:
                ids, lines, words = result
                out.write(ids.astype(dtype, copy=False).tobytes())
                for k, v in (("num_tokens", ids.size), ("lines", lines), ("words", words)):
                    file_counts[k] += int(v)
                update(done_before + blocks.read)

            map_blocks(blocks, encode_block, pool, workers, take)
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
        dtype = id_dtype(tokenizer.vocab_size)
        log(f"encoding {what} ({path}, {total / 1e6:.1f} MB) line by line with the {tokenizer.name} "
            f"tokenizer in {workers} process(es) into the data cache {root}")
        update = _progress(log, what, total)
        blocks = SourceBlocks(path, what, layout="lines")
        counts = {"num_tokens": 0, "lines": 0}
        with encoders(workers, os.path.join(temp, TOKENIZER_DIR), False, what) as pool, \
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

            map_blocks(blocks, encode_block_lines, pool, workers, take)
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
