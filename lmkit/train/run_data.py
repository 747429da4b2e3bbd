"""The training data of a run, the same on every rank, from Python or from ``lmkit train``.

* PTB (``data = "ptb"``): rank 0 finds or downloads the corpus (verified by
  SHA-1) while the others wait; every rank then reads it, or receives it
  from rank 0 when its host does not see the data folder.
* Text (``data = "text"``): rank 0 trains the tokenizer into the model folder
  (or reuses the one there); the other ranks read it (or receive its files
  from rank 0); rank 0 encodes the text files into the data cache, and every
  rank maps them.
* Conversations and prompt/completion records (``data = "text"`` whose records have ``messages`` or
  ``prompt``, or ``data_format`` set): the pretrained tokenizer as for text,
  each split encoded once into examples with loss weights
  (:mod:`lmkit.train.chat_data`), mapped by every rank.
* Pairs (``data = "pairs"``, encoder-decoders): the tokenizer is trained as
  for text, on both sides (``share_vocab``) or one for each side (the
  source's in ``<model_dir>/source_tokenizer``); every rank reads and
  encodes the line-aligned files, pairs with an empty side or over the
  length limits counted and left out (rank 0 says how many and where).

This is where the data pieces (:mod:`lmkit.data.pipeline`, which know
nothing of ranks) meet the collectives (:func:`lmkit.distributed.rank0_first`,
:func:`~lmkit.distributed.agree`, :func:`~lmkit.distributed.read_or_receive`):
every rank calls :func:`load_run_data` in the same order, and an error on
any rank is raised on all of them. It needs no command line::

    from lmkit import distributed as dist
    from lmkit.config import load_config
    from lmkit.train.run_data import load_run_data

    dist.init()
    config = load_config("config_tiny_transformer", {"data": "text", "train_file": "input.txt"})
    data = load_run_data(config, "runs/tiny")    # data.train: the ids of every rank's text

Nothing here shards: every rank gets the whole stream, and takes its rows of
each batch by its ``(rank, size)`` (:class:`~lmkit.data.batching.BpttBatches`,
:class:`~lmkit.data.windows.WindowBatches`, pure functions of them).
"""

from __future__ import annotations

import functools
import os
import tempfile
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from lmkit import distributed as dist
from lmkit.core.errors import UsageError
from lmkit.core.fileio import atomic_write_bytes
from lmkit.core.preemption import doing
from lmkit.data.pipeline import (
    SPLITS,
    RunData,
    check_sources,
    find_or_download_ptb,
    pair_splits,
    read_pair_splits,
    run_vocabulary,
    text_sources,
)
from lmkit.data.tokenizers import PRETRAINED_PREFIX, check_vocabulary

__all__ = ["RunData", "load_run_data", "load_pair_data", "load_ptb_everywhere", "tokenizer_everywhere",
           "cached_text_everywhere", "cached_pairs_everywhere", "cached_everywhere"]

Log = Callable[[str], None]


def _chief_print(text: str) -> None:
    """The default log: a line on rank 0's stdout."""
    if dist.is_chief():
        print(text, flush=True)


def load_run_data(config: Any, model_dir: str, data_path: str = "data/ptb", data_url: Optional[str] = None,
                  verify: bool = True, log: Log = _chief_print) -> RunData:
    """The data the config names, on every rank (call it on every rank, in the same order).

    Args:
      config: the run's ``TrainConfig`` (its data section: the kind, the files, the tokenizer, the cache).
      model_dir: where rank 0 keeps the tokenizer of text and pairs (the run's folder).
      data_path, data_url, verify: PTB's folder, mirror and check (:func:`load_ptb_everywhere`).
      log: where progress lines go (default: rank 0's stdout).

    Returns:
      The :class:`~lmkit.data.pipeline.RunData`; its ``config`` has the tokenizer's ``vocab_size``
      (text and pairs).

    Raises:
      UsageError: bad files, a vocabulary that does not match the config,
        a tokenizer in ``model_dir`` unlike the one asked for.
    """
    kind = config.data.kind
    if kind == "pairs":
        return load_pair_data(config, model_dir, log)
    if kind == "ptb":
        vocab_size = config.model.get("vocab_size")
        data = load_ptb_everywhere(data_path, data_url, expected_vocab_size=vocab_size, verify=verify)
        return RunData(data.train, data.valid, data.test, data.vocab, config)
    return _load_text_data(config, model_dir, log)


def _load_text_data(config: Any, model_dir: str, log: Log) -> RunData:
    """A language model's text (``data = "text"``), on every rank: see :func:`load_run_data`."""
    from lmkit.data.token_cache import cache_root

    try:
        local: Optional[Dict[str, List[str]]] = text_sources(config.data)
    except UsageError:
        local = None  # this host does not see the files: rank 0 reads them (or says why not)
    readable = local is not None
    sources = dist.read_or_receive(readable, lambda: local if local is not None else text_sources(config.data))
    cache = cache_root(config.data.data_cache)
    from lmkit.train.chat_data import wants_examples
    if wants_examples(config.data, sources["train"], readable):  # conversations, completions: weighted examples
        return _load_examples(config, model_dir, sources, readable, cache, log)
    dist.read_or_receive(readable, lambda: check_sources(sources, cached=cache is not None))
    tokenizer = tokenizer_everywhere(config, model_dir, cache, train_file=sources["train"])
    streams, counts = _text_streams(tokenizer, sources, cache, readable, log)
    config, said = run_vocabulary(config, tokenizer)
    tokenizer_setting = config.data.tokenizer
    name = tokenizer_setting if tokenizer_setting.startswith(PRETRAINED_PREFIX) else tokenizer.name
    log(f"tokenizer: {name}, {tokenizer.vocab_size} ids, in {model_dir}{said}")
    words = {} if tokenizer.name == "word" else counts
    return RunData(streams["train"], streams.get("valid"), streams.get("test"), tokenizer, config, words)


def _load_examples(config: Any, model_dir: str, sources: Dict[str, List[Any]], readable: bool,
                   cache: Optional[str], log: Log) -> RunData:
    """Conversations and prompt/completion records as weighted examples, on every rank (:mod:`lmkit.train.chat_data`):
    the pretrained tokenizer, the chat template, each split encoded once (into the data cache), cut to the context."""
    from lmkit.train.chat_data import chat_encoder, encode_splits, example_jobs, example_run_data

    tokenizer = tokenizer_everywhere(config, model_dir, cache, train_file=sources["train"])
    encoder = dist.agree(lambda: chat_encoder(config, tokenizer))
    if cache is None:
        found = dist.read_or_receive(readable, lambda: encode_splits(encoder, sources, config.data))
    else:
        found = cached_everywhere(example_jobs(encoder, sources, config.data, cache), readable, log)
    return example_run_data(config, tokenizer, found, cache, log)


def _text_streams(tokenizer: Any, sources: Dict[str, List[str]], cache: Optional[str], readable: bool,
                  log: Log) -> Tuple[Dict[str, Any], Dict[str, int]]:
    """``({split: ids}, {split: words})``: from the data cache, or encoded in memory on every rank."""
    if cache is not None:
        cached = cached_text_everywhere(tokenizer, sources, cache, log)
        return {name: c.ids for name, c in cached.items()}, {name: c.words for name, c in cached.items()}
    from lmkit.data.text import load_text_data

    with doing("encoding the text (--data_cache none)"):
        text = dist.read_or_receive(readable, lambda: load_text_data(
            tokenizer, *[sources.get(name) for name in SPLITS]))
    return {name: ids for name, ids, _ in text.splits()}, {name: n for name, _, n in text.splits()}


def load_ptb_everywhere(data_path: str = "data/ptb", url: Optional[str] = None,
                        expected_vocab_size: Optional[int] = None, verify: bool = True):
    """Rank 0 finds or downloads PTB; every rank then gets the same data (call it on every rank).

    Args:
      data_path: the folder with ``ptb.{train,valid,test}.txt`` (or ``simple-examples/data``
        below it); PTB is downloaded there when it is missing.
      url: a mirror of ``simple-examples.tgz``; default ``$LMKIT_PTB_URL`` or the canonical address.
      expected_vocab_size: the vocabulary the files must give (None: any).
      verify: check the downloaded files' SHA-1.

    Returns:
      ``lmkit.data.ptb.PTBData`` on every rank.

    Raises:
      DataError: on every rank, when rank 0 can neither find nor download the files.
      UsageError: on every rank, when files found in ``data_path`` give another vocabulary than
        ``expected_vocab_size`` (a download is checked as it comes).
    """
    from lmkit.data import ptb

    with doing(f"finding or downloading PTB in {data_path}"):
        data_dir = dist.rank0_first(lambda: find_or_download_ptb(data_path, url, expected_vocab_size, verify))
    local = ptb.find_ptb(data_path)  # hosts without a shared file system get it from rank 0
    with doing("reading PTB"):
        data = dist.read_or_receive(local is not None, lambda: ptb.load_ptb(local if local else data_dir))
    if expected_vocab_size is not None and len(data.vocab) != expected_vocab_size:
        raise UsageError(f"the data has {len(data.vocab)} words but the config says vocab_size = "
                         f"{expected_vocab_size}; set vocab_size = {len(data.vocab)}")
    return data


def tokenizer_everywhere(config: Any, model_dir: str, cache_dir: Optional[str] = None,
                         train_file: Optional[Union[str, Sequence[str]]] = None):
    """Rank 0 trains (or reuses) the config's tokenizer in ``model_dir``; every rank gets it.

    With a data cache, a tokenizer trained before on the same files with the
    same settings (in any model folder) is copied from it. ``train_file``
    (default: the config's) names the text it trains on: a config value or
    resolved sources (:func:`~lmkit.data.sources.resolve_sources`).

    Raises:
      DataError: on every rank, when rank 0 cannot train or reuse it.
    """
    from lmkit.data.tokenizers import TOKENIZER_FILE, load_tokenizer, train_tokenizer

    setting = config.data.tokenizer

    def train() -> None:
        train_tokenizer(setting, train_file or config.data.train_file, model_dir, cache_dir=cache_dir,
                        **config.tokenizer_options)

    pretrained = setting.startswith(PRETRAINED_PREFIX) or bool(config.checkpoints.init_from)
    with doing(f"{'reading' if pretrained else 'training'} the {setting} tokenizer (or finding the one saved)"):
        dist.rank0_first(train)
    here = os.path.isfile(os.path.join(model_dir, TOKENIZER_FILE))
    if not all(dist.allgather_object(here)):  # DIST: this host does not see rank 0's model folder
        def files() -> Dict[str, bytes]:
            with tempfile.TemporaryDirectory() as tmp:
                load_tokenizer(model_dir).save(tmp)
                return {name: open(os.path.join(tmp, name), "rb").read() for name in os.listdir(tmp)}
        sent = dist.rank0_first(files)
        if not here:
            for name in sorted(sent, key=lambda n: n == TOKENIZER_FILE):  # tokenizer.json last
                atomic_write_bytes(os.path.join(model_dir, name), sent[name])
    return dist.agree(lambda: load_tokenizer(model_dir))


def cached_text_everywhere(tokenizer: Any, sources: Dict[str, List[str]], root: str,
                           log: Log) -> Dict[str, Any]:
    """Each split's :class:`~lmkit.data.token_cache.TokenStream` on every rank, encoded once.

    Rank 0 encodes what the cache at ``root`` lacks (with every core, logging
    its progress) while the others wait; then every rank maps the files
    (:func:`cached_everywhere`). Call it on every rank, in the same order.
    """
    from lmkit.data.formats import documents_for
    from lmkit.data.token_cache import cached_stream, open_cached

    add_eos = tokenizer.eos_id is not None
    sources = {name: documents_for(tokenizer, files) for name, files in sources.items()}
    jobs = {name: (f"{name}_file", functools.partial(open_cached, root, tokenizer, files, add_eos),
                   functools.partial(cached_stream, root, tokenizer, files, add_eos, what=f"{name}_file"))
            for name, files in sources.items()}
    readable = all(os.path.exists(f) for files in sources.values() for f in files)  # a datasets folder too
    streams = cached_everywhere(jobs, readable, log)
    sizes = [f"{name} {streams[name].ids.size}" + (" tokens" if k == 0 else "")
             for k, name in enumerate(streams)]
    log(f"text: {', '.join(sizes)} ({tokenizer.name} ids, from the data cache {root})")
    return streams


def cached_everywhere(jobs: Dict[Any, Any], readable: bool, log: Log) -> Dict[Any, Any]:
    """Cached token files on every rank, each encoded once: ``{name: (what, open, build)}`` -> ``{name: result}``.

    ``what`` names the job's text in the log, ``open()`` maps its cache files (None when they are not there) and
    ``build(log=...)`` encodes them (or maps them when there); the results have
    ``in_memory()``. Rank 0 builds what the cache lacks (with every core,
    logging its progress) while the others wait; then every rank maps the
    files. Hosts that do not see rank 0's cache (no shared file system) build
    their own, one rank of the host after the other, so that each host encodes
    once; a rank that sees neither the cache nor the text (``readable`` False)
    receives rank 0's ids. Call it on every rank, with the same jobs in the same order.
    """
    others = dist.size() - 1

    def build() -> None:
        for what, open_one, build_one in jobs.values():
            if others and open_one() is None:
                log(f"rank 0 encodes {what}; the other {others} rank(s) wait for it")
            with doing(f"encoding {what} into the data cache"):
                build_one(log=log)

    dist.rank0_first(build)
    found = dist.agree(lambda: {name: open_one() if readable else None for name, (_, open_one, _) in jobs.items()})
    lacking = any(v is None for v in found.values())
    if any(dist.allgather_object(lacking)):  # DIST: a host without rank 0's file system
        found, lacking = _build_on_each_host(jobs, found, lacking, readable)
        if any(dist.allgather_object(lacking)):  # neither the cache nor the text here: rank 0 sends the ids
            sent = dist.rank0_first(lambda: {name: v.in_memory() for name, v in found.items()})
            if lacking:
                found = sent
    return found


def _build_on_each_host(jobs: Dict[Any, Any], found: Dict[Any, Any], lacking: bool,
                        readable: bool) -> Tuple[Dict[Any, Any], bool]:
    """The hosts that do not see rank 0's cache build their own, one local rank at a time (the first that can
    builds, the others then map its files): ``(results, still lacking)`` of this rank."""
    turns = max(dist.allgather_object(dist.local_rank())) + 1
    for turn in range(turns):
        def own() -> Optional[Dict[Any, Any]]:
            if not (lacking and readable and dist.local_rank() == turn):
                return None
            return {name: build_one() for name, (_, _, build_one) in jobs.items()}
        with doing("encoding the text into this host's data cache"):
            mine = dist.agree(own)
        if mine is not None:
            found, lacking = mine, False
    return found, lacking


def load_pair_data(config: Any, model_dir: str, log: Log = _chief_print) -> RunData:
    """An encoder-decoder's pairs and tokenizers on every rank (call it on every rank, in the same order).

    Returns:
      :class:`~lmkit.data.pipeline.RunData` with :class:`~lmkit.data.paired.Pairs` for train,
      valid and test, the target tokenizer as ``vocab``, the source's as
      ``source_vocab``, and the config's ``vocab_size`` and
      ``source_vocab_size`` set from them.

    Raises:
      UsageError: a missing or non-UTF-8 file, files of different line
        counts, a split with no usable pair, a tokenizer without start, end
        and padding ids (on every rank).
    """
    from lmkit.core.layout import SOURCE_TOKENIZER_DIR
    from lmkit.data.paired import SpecialIds
    from lmkit.data.token_cache import cache_root

    splits = pair_splits(config.data)
    readable = all(os.path.isfile(path) for paths in splits.values() for path in paths)
    cache = cache_root(config.data.data_cache)
    lines = dist.read_or_receive(readable, lambda: read_pair_splits(splits, cached=cache is not None))
    tokenizer, source_tokenizer = _pair_tokenizers(config, model_dir, cache, splits["train"])
    dist.agree(lambda: SpecialIds.of(tokenizer))  # the targets' start, end and padding ids
    limits = dict(max_source_length=config.source_length_limit, max_target_length=config.target_length_limit)
    if cache is None:
        from lmkit.data.paired import encode_pairs
        with doing("encoding the pairs (--data_cache none)"):
            pairs = dist.agree(lambda: {
                split: encode_pairs(*lines[split], source_tokenizer.encode, tokenizer.encode, **limits)
                for split in splits})
    else:
        pairs = cached_pairs_everywhere(splits, source_tokenizer, tokenizer, cache, readable, limits, log)
    for split, (source_path, target_path) in splits.items():
        log(f"{split} pairs: {pairs[split].report.summary()} ({source_path}, {target_path}; at most "
            f"{config.source_length_limit} source and {config.target_length_limit} target tokens)")
    if config.checkpoints.init_from:  # a pretrained model's vocabulary is fixed; the tokenizer must fit in it
        check_vocabulary(tokenizer, config.model.get("vocab_size"), config.checkpoints.init_from)
    else:
        config = config.replace(vocab_size=tokenizer.vocab_size, source_vocab_size=source_tokenizer.vocab_size)
    shared = "one tokenizer for both sides" if config.data.share_vocab else \
        f"source {source_tokenizer.vocab_size} ids in {os.path.join(model_dir, SOURCE_TOKENIZER_DIR)}"
    log(f"tokenizer: {tokenizer.name}, {tokenizer.vocab_size} ids, in {model_dir} ({shared})")
    return RunData(pairs["train"], pairs.get("valid"), pairs.get("test"), tokenizer, config,
                   source_vocab=source_tokenizer)


def _pair_tokenizers(config: Any, model_dir: str, cache: Optional[str], train: Tuple[str, str]) -> Tuple[Any, Any]:
    """``(target tokenizer, source tokenizer)`` of an encoder-decoder, on every rank: one trained on both sides
    (``share_vocab``), or one for each side (the source's in ``<model_dir>/source_tokenizer``)."""
    from lmkit.core.layout import SOURCE_TOKENIZER_DIR
    from lmkit.data.sources import SEPARATOR

    source, target = train
    if config.data.share_vocab:
        tokenizer = tokenizer_everywhere(config, model_dir, cache, train_file=f"{source}{SEPARATOR}{target}")
        return tokenizer, tokenizer.source_side()  # the same ids; a BART folder's ends sources with </s>
    tokenizer = tokenizer_everywhere(config, model_dir, cache, train_file=target)
    return tokenizer, tokenizer_everywhere(config, os.path.join(model_dir, SOURCE_TOKENIZER_DIR), cache,
                                           train_file=source)


def cached_pairs_everywhere(splits: Dict[str, Any], source_tokenizer: Any, tokenizer: Any, root: str,
                            readable: bool, limits: Dict[str, int], log: Log) -> Dict[str, Any]:
    """Each split's :class:`~lmkit.data.paired.Pairs` on every rank, from line-by-line caches encoded once.

    Every source and target file is encoded into the data cache at ``root`` by
    rank 0 (with every core) while the others wait
    (:func:`~lmkit.data.token_cache.cached_lines`, :func:`cached_everywhere`);
    every rank then maps the files and keeps the pairs that fit ``limits``
    (:func:`~lmkit.data.paired.pairs_from_lines`): the same pairs as
    encoding the lines in memory, without holding them. Call it on every rank,
    in the same order.
    """
    from lmkit.data.paired import pairs_from_lines
    from lmkit.data.token_cache import cached_lines, open_cached_lines

    jobs = {}
    for split, (source_path, target_path) in splits.items():
        prefix = "" if split == "train" else f"{split}_"
        for side, path, side_tokenizer in (("source", source_path, source_tokenizer),
                                           ("target", target_path, tokenizer)):
            what = f"{prefix}{side}_file"
            jobs[(split, side)] = (what, functools.partial(open_cached_lines, root, side_tokenizer, path),
                                   functools.partial(cached_lines, root, side_tokenizer, path, what=what))
    lines = cached_everywhere(jobs, readable, log)
    pairs = dist.agree(lambda: {
        split: pairs_from_lines(lines[(split, "source")], lines[(split, "target")], source_path=source_path,
                                target_path=target_path, **limits)
        for split, (source_path, target_path) in splits.items()})
    log(f"pairs: {', '.join(f'{split} {len(p)}' for split, p in pairs.items())} (from the data cache {root})")
    return pairs
