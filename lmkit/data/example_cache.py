"""Conversations and prompt/completion pairs encoded once into examples with loss weights, in the data cache.

A split's records (:mod:`lmkit.data.records`) encoded by a
:class:`~lmkit.data.chat.ChatEncoder` are kept in a folder of the data cache
(:func:`lmkit.data.token_cache.cache_root`), beside the token streams, and
memory-mapped by every later run::

    <cache>/<key>/ids.bin          the examples' ids, one after the other, uint16 or uint32
    <cache>/<key>/weights.bin      uint8, each id's loss weight (1: a target the loss counts)
    <cache>/<key>/examples.bin     uint64 offsets: example i is ids[offsets[i]:offsets[i + 1]]
    <cache>/<key>/manifest.json    the sources, the tokenizer, the encoder's settings, the counts and the
                                   records skipped (by reason, and the first one's message)
    <cache>/<key>/tokenizer/       the tokenizer that made the ids

``key`` hashes what decides the examples: the tokenizer (as a token
stream's key does), each source's identity (path, size, modification time,
a sample of its content: :func:`lmkit.data.textfile.source_identity`), the
``data_format`` and the encoder's :meth:`~lmkit.data.chat.ChatEncoder.identity`
(the template's text and special tokens, ``train_on_prompt``, the end id).
Another template, another flag or an edited file gives another folder.

``skip_bad_records`` is not in the key: a folder written with it holds the
records that were fine and says how many were skipped; opened without it,
the first skipped record is the error it would have been
(:func:`check_bad_records`). Encoding without it stops at the first bad
record and writes nothing. The folder is written under a temporary name and
renamed into place when complete, as a token stream's is
(:mod:`lmkit.data.token_cache`). Without a cache (``data_cache = "none"``)
:func:`encode_examples` gives the same examples in memory.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from lmkit.data.chat import ChatEncoder, EncodeReport, Tally, bad_record, encode_records
from lmkit.data.encoding_pool import id_dtype
from lmkit.data.errors import DataError
from lmkit.data.examples import ExampleSet
from lmkit.data.records import read_records
from lmkit.data.token_cache import (
    FORMAT,
    IDS_FILE,
    _build_folder,
    _map,
    _open_folder,
    _tokenizer_record,
    source_identities,
)

__all__ = ["CachedExamples", "cached_examples", "check_bad_records", "encode_examples", "examples_key",
           "open_cached_examples"]

LAYOUT = "examples"
WEIGHTS_FILE = "weights.bin"
OFFSETS_FILE = "examples.bin"
Log = Callable[[str], None]


@dataclasses.dataclass
class CachedExamples:
    """A split's examples and what their encoding found.

    Attributes:
      examples: the :class:`~lmkit.data.examples.ExampleSet` (memory-mapped from the cache, or in memory).
      report: records read, skipped by reason, merged boundaries (:class:`~lmkit.data.chat.EncodeReport`).
      first_bad: the first skipped record, ``(source, where, message, reason)``, or None.
      folder: the cache folder ("" in memory).
      reused: True when the folder existed before this call.
    """

    examples: ExampleSet
    report: EncodeReport
    first_bad: Optional[Sequence[str]]
    folder: str
    reused: bool

    def in_memory(self) -> "CachedExamples":
        """A copy held in memory (to send to a rank that cannot map the files)."""
        return dataclasses.replace(self, examples=self.examples.in_memory(), reused=True)


def examples_key(encoder: ChatEncoder, files: Sequence[Any], data_format: Optional[str]) -> str:
    """The folder name of ``files`` encoded by ``encoder`` (see the module's docstring).

    Raises:
      DataError: a file does not exist or cannot be read.
    """
    tokenizer = encoder.tokenizer
    record = {"format": FORMAT, "layout": LAYOUT, "tokenizer": _tokenizer_record(tokenizer),
              "files": source_identities(files),
              "data_format": data_format or "", "encoder": encoder.identity()}
    digest = hashlib.sha256(json.dumps(record, sort_keys=True).encode("utf-8")).hexdigest()
    return f"{tokenizer.name}-{LAYOUT}-{digest[:24]}"


def open_cached_examples(root: str, encoder: ChatEncoder, files: Sequence[Any],
                         data_format: Optional[str] = None) -> Optional[CachedExamples]:
    """The cached examples of ``files``, memory-mapped, or None when not cached.

    Raises:
      DataError: the folder exists but is broken (naming it, with the fix: delete it).
    """
    folder = os.path.join(root, examples_key(encoder, files, data_format))
    opened = _open_folder(folder, encoder.tokenizer)
    if opened is None:
        return None
    manifest, ids = opened
    try:
        count = int(manifest["examples"])
        report = EncodeReport(int(manifest["records"]), dict(manifest["skipped"]), int(manifest["merged_boundaries"]))
        first_bad = manifest.get("first_bad")
    except (KeyError, TypeError, ValueError):
        raise DataError(f"the data cache folder {folder} has no example counts; delete the folder (it is a cache) "
                        "and run again") from None
    offsets = _map(folder, OFFSETS_FILE, np.dtype(np.uint64), count + 1)
    weights = _map(folder, WEIGHTS_FILE, np.dtype(np.uint8), ids.size)
    starts = np.asarray(offsets[:-1], np.int64)
    examples = ExampleSet(ids, weights, starts, np.asarray(offsets[1:], np.int64) - starts)
    return CachedExamples(examples, report, first_bad, folder, True)


class _Writer:
    """Where :func:`_encode` puts the examples: three open files, or lists in memory (``folder`` None)."""

    def __init__(self, folder: Optional[str], dtype: np.dtype) -> None:
        self.dtype, self.count, self.tokens = dtype, 0, 0
        self.parts: List[Any] = []
        self.files = None if folder is None else [open(os.path.join(folder, name), "wb") for name in
                                                  (IDS_FILE, WEIGHTS_FILE, OFFSETS_FILE)]
        if self.files:
            self.files[2].write(np.zeros(1, np.uint64).tobytes())

    def add(self, ids: np.ndarray, weights: np.ndarray) -> None:
        self.count, self.tokens = self.count + 1, self.tokens + len(ids)
        if self.files is None:
            self.parts.append((ids, weights))
            return
        self.files[0].write(np.asarray(ids).astype(self.dtype).tobytes())
        self.files[1].write(np.asarray(weights, np.uint8).tobytes())
        self.files[2].write(np.array([self.tokens], np.uint64).tobytes())

    def close(self) -> None:
        for f in self.files or ():
            f.flush()
            os.fsync(f.fileno())
            f.close()


def _encode(encoder: ChatEncoder, files: Sequence[Any], writer: _Writer, data_format: Optional[str],
            skip_bad_records: bool, what: str, log: Log) -> Tally:
    """Encodes every record of ``files`` into ``writer``; progress lines every few seconds."""
    tally, last = Tally(), time.perf_counter()
    for path in files:
        records = read_records(path, what)
        for example in encode_records(records, encoder, tally, source=os.fspath(path), what=what,
                                      data_format=data_format, skip_bad_records=skip_bad_records):
            writer.add(*example)
            if time.perf_counter() - last > 5.0:
                last = time.perf_counter()
                log(f"encoding {what}: {tally.records:,} records, {writer.tokens:,} ids")
    if writer.count == 0:
        skipped = f" ({sum(tally.skipped.values())} bad ones skipped)" if tally.skipped else ""
        raise DataError(f"{what} ({', '.join(map(os.fspath, files))}) has no example to train on{skipped}; give "
                        "records with messages (or prompt and completion)")
    return tally


def _counts(tally: Tally, writer: _Writer) -> Dict[str, Any]:
    return {"examples": writer.count, "num_tokens": writer.tokens, "records": tally.records,
            "skipped": dict(tally.skipped), "merged_boundaries": tally.merged_boundaries,
            "first_bad": list(tally.first_bad) if tally.first_bad else None}


def encode_examples(encoder: ChatEncoder, files: Sequence[Any], *, data_format: Optional[str] = None,
                    skip_bad_records: bool = False, what: str = "train_file", log: Log = lambda line: None
                    ) -> CachedExamples:
    """The examples of ``files``' records in memory (no cache): those :func:`cached_examples` maps.

    Raises:
      BadRecord: the first bad record (without ``skip_bad_records``).
      DataError: a file that cannot be read, no template for a conversation, no example at all.
    """
    writer = _Writer(None, np.dtype(np.int32))
    tally = _encode(encoder, files, writer, data_format, skip_bad_records, what, log)
    return CachedExamples(ExampleSet.of(writer.parts), tally.report(), tally.first_bad, "", False)


def cached_examples(root: str, encoder: ChatEncoder, files: Sequence[Any], *, data_format: Optional[str] = None,
                    skip_bad_records: bool = False, what: str = "train_file", log: Log = lambda line: None
                    ) -> CachedExamples:
    """The examples of ``files``' records from the cache at ``root``, encoded into it first when not there.

    Raises:
      BadRecord: the first bad record (without ``skip_bad_records``; nothing is written).
      DataError: as :func:`encode_examples`, and a cache folder that is broken or a disk that is full.
    """
    found = open_cached_examples(root, encoder, files, data_format)
    if found is not None:
        return found
    tokenizer = encoder.tokenizer
    total = sum(os.path.getsize(f) for path in files for f in _files(path))
    names = os.fspath(files[0]) if len(files) == 1 else f"{len(files)} files"

    def fill(temp: str, workers: int) -> Dict[str, Any]:
        log(f"encoding {what} ({names}, {total / 1e6:.1f} MB of records) into examples with the "
            f"{tokenizer.name} tokenizer into the data cache {root}")
        writer = _Writer(temp, id_dtype(tokenizer.vocab_size))
        try:
            tally = _encode(encoder, files, writer, data_format, skip_bad_records, what, log)
        finally:
            writer.close()
        return dict(_counts(tally, writer), dtype=writer.dtype.name, files=source_identities(files))

    record = {"layout": LAYOUT, "data_format": data_format or "", "encoder": encoder.identity()}
    return _build_folder(root, examples_key(encoder, files, data_format), tokenizer, what, total, 1, record, fill,
                         functools.partial(open_cached_examples, root, encoder, files, data_format), log)


def _files(path: Any) -> List[str]:
    from lmkit.data.formats import source_files
    return source_files(path)


def check_bad_records(found: CachedExamples, skip_bad_records: bool, what: str) -> CachedExamples:
    """``found``, unless it skipped records and ``skip_bad_records`` is off: then the first one's error.

    Raises:
      BadRecord: the first record skipped (as encoding without ``skip_bad_records`` names it).
    """
    if found.first_bad and not skip_bad_records:
        source, where, message, reason = found.first_bad
        raise bad_record(what, source, where, message, reason)
    return found
