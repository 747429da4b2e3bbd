"""The processes that encode text for the data cache: blocks in, ids out, in order.

:func:`encoders` starts a pool of worker processes (``spawn``, one per core
by default, :func:`encoding_workers`), each holding the tokenizer saved in
the cache folder being written; :func:`map_blocks` hands them the blocks of
a file (:class:`lmkit.data.textfile.TextBlocks`) and takes their results in
order, a few blocks in flight per worker. With one worker, or when new
processes cannot start, the blocks are encoded in this process by the same
functions (:func:`encode_block` for a stream, :func:`encode_block_lines` for
a file kept line by line), so the ids never depend on the number of workers.

A worker that dies (the OOM killer, SIGKILL) makes the pool unusable: the
pool says so at the next ``submit``, ``result`` or ``shutdown``, whichever
comes first. :func:`encoders` turns it into one :class:`DataError` wherever
it is raised, and ends the other workers without waiting on their queues.
"""

from __future__ import annotations

import collections
import concurrent.futures
import concurrent.futures.process
import contextlib
import hashlib
import multiprocessing
import os
import sys
from typing import Callable, Deque, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from lmkit.data import textfile
from lmkit.data.errors import DataError

__all__ = ["WORKERS_ENV", "BLOCK_BYTES", "MAX_LINE_BYTES", "SourceBlocks", "encoding_workers", "id_dtype",
           "encoders", "map_blocks", "encode_block", "encode_block_lines", "init_worker", "end_pool"]

WORKERS_ENV = "LMKIT_ENCODING_WORKERS"
#: Raw bytes read at a time; a block handed to a worker holds at most twice as many (a longer line is
#: cut into pieces, see :mod:`lmkit.data.token_cache`).
BLOCK_BYTES = textfile.BLOCK_BYTES
#: The longest line the line layout keeps whole (an example); a longer one is a DataError.
MAX_LINE_BYTES = 16 << 20

_WORKER: Dict[str, object] = {}


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


def id_dtype(vocab_size: int) -> np.dtype:
    """The cache's id type for a vocabulary: uint16 up to 65,536 ids, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= (1 << 16) else np.uint32)


def _can_spawn() -> bool:
    """Whether new processes can start: they import the main script again, which must be a file.

    (``python - < script`` has none; such a caller encodes in one process.)
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return path is None or os.path.isfile(path)


def init_worker(tokenizer_dir: str, add_eos: bool) -> None:
    """Loads the tokenizer that :func:`encode_block` and :func:`encode_block_lines` use (in a worker, or here)."""
    from lmkit.data.tokenizers import load_tokenizer
    parent = multiprocessing.parent_process()
    if parent is not None and sys._getframe(1).f_code is concurrent.futures.process._process_worker.__code__:
        # The pool's initializer (not the call in the parent): a signal to the whole process group (Ctrl-C,
        # mpirun's SIGUSR1) is the parent's to act on; it shuts the pool down (lmkit.core.preemption).
        from lmkit.core.preemption import detach_worker
        detach_worker(parent.pid)
    _WORKER["tokenizer"] = load_tokenizer(tokenizer_dir)
    _WORKER["add_eos"] = add_eos


def encode_block(text: str, continues: bool = False, ends_line: bool = True) -> Tuple[np.ndarray, int, int]:
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
    return ids.astype(id_dtype(size), copy=False)


def encode_block_lines(text: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
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


class SourceBlocks:
    """A file's blocks (:class:`lmkit.data.textfile.TextBlocks`) as the arguments of the encoder of
    ``layout`` (``"stream"``: ``(text, continues, ends_line)``; ``"lines"``: ``(text,)``), hashed as
    read, and checked for changes at the end."""

    def __init__(self, path: str, what: str, layout: str = "stream") -> None:
        self.path, self.what, self.layout = path, what, layout
        self.identity = textfile.source_identity(path)
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
        now = textfile.source_identity(self.path)
        if now != self.identity or self.read != self.identity["size"]:
            change = f"size {self.identity['size']} -> {now['size']} bytes" \
                if now["size"] != self.identity["size"] else "its content or modification time"
            raise DataError(f"{self.what} {self.path!r} changed while it was being encoded ({change}); run "
                            "again once nothing writes to it")


def _died(what: str) -> DataError:
    return DataError(f"an encoding process died while encoding {what} (out of memory?); run again, with "
                     "fewer processes (LMKIT_ENCODING_WORKERS=1) if it happens again")


@contextlib.contextmanager
def encoders(workers: int, tokenizer_dir: str, add_eos: bool,
             what: str) -> Iterator[Optional[concurrent.futures.ProcessPoolExecutor]]:
    """A pool of ``workers`` encoding processes (None: encode in this process), each with the tokenizer.

    Args:
      workers: processes; 1 encodes in this process.
      tokenizer_dir: the saved tokenizer the workers load.
      add_eos: end every non-blank line with the tokenizer's eos id (:func:`encode_block`).
      what: how messages call the text, e.g. ``"train_file"``.

    Raises:
      DataError: a worker died (killed by the OOM killer or SIGKILL), whichever call of the pool
        saw it first (``submit``, ``result``, ``shutdown``), inside the ``with`` block or out.
    """
    from lmkit.core.preemption import signals_held
    pool = None
    try:
        if workers > 1 and _can_spawn():
            # Started with the preemption signals held: a signal to the whole process group
            # (mpirun's SIGUSR1, Ctrl-C) then cannot end a worker, or multiprocessing's resource
            # tracker, before they are set up; submitting starts every worker at once.
            with signals_held():
                pool = concurrent.futures.ProcessPoolExecutor(
                    workers, mp_context=multiprocessing.get_context("spawn"), initializer=init_worker,
                    initargs=(tokenizer_dir, add_eos))
                pool.submit(int)
        else:
            init_worker(tokenizer_dir, add_eos)
        yield pool
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
            pool = None
    except concurrent.futures.process.BrokenProcessPool:
        raise _died(what) from None
    finally:
        if pool is not None:  # stopping (a signal, an error): end the workers, do not wait on their queues
            end_pool(pool)


def end_pool(pool: concurrent.futures.ProcessPoolExecutor, grace: float = 10.0) -> None:
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


def map_blocks(blocks: Iterable[Sequence[object]], encode: Callable[..., object],
               pool: Optional[concurrent.futures.ProcessPoolExecutor], workers: int,
               take: Callable[[object], None]) -> None:
    """``take(encode(*block))`` for every block in order, ``2 x workers`` blocks in flight in ``pool``
    (None: each block encoded here, at once). Call it inside :func:`encoders`, which turns a dead
    worker into its error."""
    pending: Deque = collections.deque()
    for args in blocks:
        pending.append(pool.submit(encode, *args) if pool else encode(*args))
        while len(pending) > (2 * workers if pool else 0):
            take(pending.popleft().result() if pool else pending.popleft())
    while pending:
        take(pending.popleft().result() if pool else pending.popleft())
