"""The training data of a run, the same on every rank, from Python or from ``lmkit train``.

* PTB (``data = "ptb"``): rank 0 finds or downloads the corpus (verified by
  SHA-1) while the others wait; every rank then reads it, or receives it
  from rank 0 when its host does not see the data folder.
* Text (``data = "text"``): rank 0 trains the tokenizer into the model folder
  (or reuses the one there); the other ranks read it (or receive its files
  from rank 0); every rank then encodes the text files.
* Pairs (``data = "pairs"``, encoder-decoders): the tokenizer is trained as
  for text, on both sides (``share_vocab``) or one for each side (the
  source's in ``<model_dir>/source_tokenizer``); every rank reads and
  encodes the line-aligned files, pairs with an empty side or over the
  length limits counted and left out (rank 0 says how many and where).

Every rank calls :func:`load_run_data` in the same order: it holds the
collectives that keep the ranks together, and an error on any rank is raised
on all of them. It needs no command line::

    from lmkit import distributed as dist
    from lmkit.config import load_config
    from lmkit.data.pipeline import load_run_data

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
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from lmkit import distributed as dist
from lmkit.core.errors import UsageError
from lmkit.core.fileio import atomic_write_bytes
from lmkit.core.preemption import as_error, doing
from lmkit.data.tokenizers import PRETRAINED_PREFIX, check_vocabulary
from lmkit.distributed import same_outcome_everywhere

__all__ = ["RunData", "load_run_data", "load_pair_data", "load_ptb_everywhere", "tokenizer_everywhere",
           "cached_text_everywhere", "same_outcome_everywhere", "check_vocabulary", "model_vocabulary"]

Log = Callable[[str], None]


def _chief_print(text: str) -> None:
    """The default log: a line on rank 0's stdout."""
    if dist.is_chief():
        print(text, flush=True)


@dataclass
class RunData:
    """The id streams of a run and what made them.

    Attributes:
      train, valid, test: int32 id streams (valid and test may be None); for
        pairs, :class:`~lmkit.data.paired.Pairs`.
      vocab: the PTB :class:`~lmkit.data.Vocab`, or the text data's tokenizer
        (for pairs the target side's).
      words: words of each split, for perplexity per word; empty for
        word-level data, where a token is a word.
      config: the config, its ``vocab_size`` the tokenizer's for text data.
    """

    train: Any
    valid: Optional[Any]
    test: Optional[Any]
    vocab: Any
    config: Any
    words: Dict[str, int] = field(default_factory=dict)
    source_vocab: Any = None  # pairs: the source side's tokenizer (the same object when shared)


def _ensure_ptb(data_path: str, url: Optional[str], expected_vocab_size: Optional[int],
                verify: bool = True) -> str:
    """``ensure_ptb`` whose failure names the missing folder or files and leaves no empty folder."""
    from lmkit.data import ptb
    from lmkit.data.errors import DataError

    existed = os.path.isdir(data_path)
    try:
        return ptb.ensure_ptb(data_path, url=url, expected_vocab_size=expected_vocab_size, verify=verify)
    except DataError as exc:
        if not existed:
            if os.path.isdir(data_path) and not os.listdir(data_path):
                os.rmdir(data_path)  # made for the download that failed
            raise DataError(f"data folder {data_path} does not exist, and downloading PTB failed: "
                            f"{exc}") from None
        have = [n for n in ptb.PTB_FILES if os.path.isfile(os.path.join(data_path, n))]
        if have:
            missing = [n for n in ptb.PTB_FILES if n not in have]
            raise DataError(f"data folder {data_path} lacks {', '.join(missing)} (it has "
                            f"{', '.join(have)}), and downloading PTB failed: {exc}") from None
        raise


def _on_chief(fn: Callable[[], Any]) -> Any:
    """``fn()`` on rank 0 while the others wait; its error, a preemption signal too, is raised on every rank."""
    return dist.run_on_chief(as_error(fn))


def _everywhere(local_ok: bool, read: Callable[[], Any]) -> Any:
    """``read()`` on every rank when all can (errors raised on all), else rank 0's result, sent."""
    if all(dist.allgather_object(local_ok)):
        return same_outcome_everywhere(read)
    return _on_chief(read)


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
    """
    from lmkit.data import ptb

    with doing(f"finding or downloading PTB in {data_path}"):
        data_dir = _on_chief(lambda: _ensure_ptb(data_path, url, expected_vocab_size, verify))
    local = ptb.find_ptb(data_path)  # hosts without a shared file system get it from rank 0
    with doing("reading PTB"):
        return _everywhere(local is not None, lambda: ptb.load_ptb(local if local else data_dir))


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

    def train() -> None:
        train_tokenizer(config.data.tokenizer, train_file or config.data.train_file, model_dir, cache_dir=cache_dir,
                        **config.tokenizer_options)

    pretrained = config.data.tokenizer.startswith(PRETRAINED_PREFIX) or bool(config.checkpoints.init_from)
    with doing(f"{'reading' if pretrained else 'training'} the {config.data.tokenizer} tokenizer (or finding the one "
               "saved)"):
        _on_chief(train)
    here = os.path.isfile(os.path.join(model_dir, TOKENIZER_FILE))
    if not all(dist.allgather_object(here)):
        # This host does not see rank 0's model folder: rank 0 sends the files.
        def files() -> Dict[str, bytes]:
            with tempfile.TemporaryDirectory() as tmp:
                load_tokenizer(model_dir).save(tmp)
                return {name: open(os.path.join(tmp, name), "rb").read() for name in os.listdir(tmp)}
        sent = _on_chief(files)
        if not here:
            for name in sorted(sent, key=lambda n: n == TOKENIZER_FILE):  # tokenizer.json last
                atomic_write_bytes(os.path.join(model_dir, name), sent[name])
    return same_outcome_everywhere(lambda: load_tokenizer(model_dir))


def load_run_data(config: Any, model_dir: str, data_path: str = "data/ptb", data_url: Optional[str] = None,
                  verify: bool = True, log: Log = _chief_print) -> RunData:
    """The data the config names, on every rank (call it on every rank, in the same order).

    Args:
      config: the run's ``TrainConfig`` (``data``, the files, the tokenizer's settings, ``data_cache``).
      model_dir: where rank 0 keeps the tokenizer of text and pairs (the run's folder).
      data_path, data_url, verify: PTB's folder, mirror and check (:func:`load_ptb_everywhere`).
      log: where progress lines go (default: rank 0's stdout).

    Returns:
      The :class:`RunData`; its ``config`` has the tokenizer's ``vocab_size`` (text and pairs).

    Raises:
      UsageError: bad files, a vocabulary that does not match the config,
        a tokenizer in ``model_dir`` unlike the one asked for.
    """
    if config.data == "pairs":
        return load_pair_data(config, model_dir, log)
    if config.data == "ptb":
        data = load_ptb_everywhere(data_path, data_url, expected_vocab_size=config.model["vocab_size"],
                                   verify=verify)
        if len(data.vocab) != config.model["vocab_size"]:
            raise UsageError(f"the data has {len(data.vocab)} words but the config says vocab_size = "
                             f"{config.model['vocab_size']}; set vocab_size = {len(data.vocab)}")
        return RunData(data.train, data.valid, data.test, data.vocab, config)

    from lmkit.data.formats import DATASET_SPLITS
    from lmkit.data.sources import resolve_sources
    from lmkit.data.text import SPLITS, load_text_data
    from lmkit.data.textfile import check_text_file
    from lmkit.data.token_cache import cache_root

    specs = {name: spec for name, spec in zip(SPLITS, (config.data.train_file, config.data.valid_file,
                                                       config.data.test_file)) if spec}

    def resolve() -> Dict[str, List[str]]:
        return {name: resolve_sources(spec, f"{name}_file", text_field=config.data.text_field,
                                      text_column=config.data.text_column,
                                      dataset_split=DATASET_SPLITS[name])
                for name, spec in specs.items()}

    try:
        local: Optional[Dict[str, List[str]]] = resolve()
    except UsageError:
        local = None  # this host does not see the files: rank 0 reads them (or says why not)
    readable = local is not None
    sources = _everywhere(readable, lambda: local if local is not None else resolve())
    cache = cache_root(config.data.data_cache)
    # The evaluation files are checked before anything is written into the model folder; the
    # training files by the tokenizer's training or their encoding (not at all when cached).
    checked = sources if cache is None else {k: v for k, v in sources.items() if k != "train"}
    _everywhere(readable, lambda: [check_text_file(f, f"{name}_file")
                                   for name, files in checked.items() for f in files])
    tokenizer = tokenizer_everywhere(config, model_dir, cache, train_file=sources["train"])
    if cache is None:
        with doing("encoding the text (--data_cache none)"):
            text = _everywhere(readable, lambda: load_text_data(
                tokenizer, *[sources.get(name) for name in SPLITS]))
        streams = {name: ids for name, ids, _ in text.splits()}
        counts = {name: n for name, _, n in text.splits()}
    else:
        cached = cached_text_everywhere(tokenizer, sources, cache, log)
        streams = {name: c.ids for name, c in cached.items()}
        counts = {name: c.words for name, c in cached.items()}
    if config.checkpoints.init_from:  # a pretrained model's vocabulary is fixed; the tokenizer must fit in it
        check_vocabulary(tokenizer, config.model["vocab_size"], config.checkpoints.init_from)
        said = ""
    else:
        config, said = model_vocabulary(config, tokenizer)
    name = config.data.tokenizer if config.data.tokenizer.startswith(PRETRAINED_PREFIX) else tokenizer.name
    log(f"tokenizer: {name}, {tokenizer.vocab_size} ids, in {model_dir}{said}")
    words = {} if tokenizer.name == "word" else counts
    return RunData(streams["train"], streams.get("valid"), streams.get("test"), tokenizer, config, words)


def model_vocabulary(config: Any, tokenizer: Any) -> Tuple[Any, str]:
    """The config with the ``vocab_size`` of a model trained from scratch with ``tokenizer``, and what the log
    line adds about it.

    lmkit's own tokenizers size the model: ``vocab_size`` becomes the tokenizer's. With a pretrained tokenizer
    (``tokenizer = "hf:<folder or name>"``) a config's ``vocab_size`` at least the tokenizer's is kept, the ids
    past the tokenizer's padding that the data never holds and generation never picks (nanoGPT's 50,304 for
    GPT-2's 50,257, a multiple of 64 for speed); a smaller one becomes the tokenizer's, since every config
    states a ``vocab_size`` and no model can have fewer ids than its tokenizer.
    """
    size, asked = int(tokenizer.vocab_size), int(config.model["vocab_size"])
    if asked == size:
        return config, ""
    if asked > size and config.data.tokenizer.startswith(PRETRAINED_PREFIX):
        return config, (f"; the model keeps the config's vocab_size = {asked}: ids {size}..{asked - 1} are padding, "
                        "never in the data nor generated")
    if config.data.tokenizer.startswith(PRETRAINED_PREFIX):
        return config.replace(vocab_size=size), (f"; the model's vocab_size is the tokenizer's {size}, not the "
                                                 f"config's {asked} (a vocab_size >= {size} pads)")
    return config.replace(vocab_size=size), f" (the model's vocabulary; the config said vocab_size = {asked})"


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


def cached_everywhere(jobs: Dict[str, Any], readable: bool, log: Log) -> Dict[str, Any]:
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

    def open_all() -> Dict[str, Any]:  # the cache's name needs the files' sizes and times
        return {name: open_one() if readable else None for name, (_, open_one, _) in jobs.items()}

    _on_chief(build)
    found = same_outcome_everywhere(open_all)
    lacking = any(v is None for v in found.values())
    if any(dist.allgather_object(lacking)):  # DIST: a host without rank 0's file system
        turns = max(dist.allgather_object(dist.local_rank())) + 1
        for turn in range(turns):
            def own() -> Optional[Dict[str, Any]]:
                if not (lacking and readable and dist.local_rank() == turn):
                    return None
                return {name: build_one() for name, (_, _, build_one) in jobs.items()}
            with doing("encoding the text into this host's data cache"):
                mine = same_outcome_everywhere(own)
            if mine is not None:
                found, lacking = mine, False
        if any(dist.allgather_object(lacking)):  # neither the cache nor the text here: rank 0 sends the ids
            sent = _on_chief(lambda: {name: v.in_memory() for name, v in found.items()})
            if lacking:
                found = sent
    return found


def load_pair_data(config: Any, model_dir: str, log: Log = _chief_print) -> RunData:
    """An encoder-decoder's pairs and tokenizers on every rank (call it on every rank, in the same order).

    Returns:
      :class:`RunData` with :class:`~lmkit.data.paired.Pairs` for train,
      valid and test, the target tokenizer as ``vocab``, the source's as
      ``source_vocab``, and the config's ``vocab_size`` and
      ``source_vocab_size`` set from them.

    Raises:
      UsageError: a missing or non-UTF-8 file, files of different line
        counts, a split with no usable pair, a tokenizer without start, end
        and padding ids (on every rank).
    """
    from lmkit.config import PAIR_FILE_KEYS
    from lmkit.core.layout import SOURCE_TOKENIZER_DIR
    from lmkit.data.paired import SpecialIds, check_pair_files, encode_pairs, read_pairs
    from lmkit.data.sources import SEPARATOR
    from lmkit.data.textfile import check_text_file
    from lmkit.data.token_cache import cache_root

    splits = {split: (getattr(config.data, source_key), getattr(config.data, target_key))
              for split, (source_key, target_key) in zip(("train", "valid", "test"), PAIR_FILE_KEYS)
              if getattr(config.data, source_key)}
    readable = all(os.path.isfile(path) for paths in splits.values() for path in paths)

    cache = cache_root(config.data.data_cache)

    def read() -> Dict[str, Any]:  # checked before anything is written into the model folder
        lines = {}
        for split, (source_path, target_path) in splits.items():
            prefix = "" if split == "train" else f"{split}_"
            # With the cache, the training files' text is checked as it is encoded (as for a language model's).
            if cache is None or split != "train":
                check_text_file(source_path, f"{prefix}source_file", plain=True)
                check_text_file(target_path, f"{prefix}target_file", plain=True)
            if cache is None:
                lines[split] = read_pairs(source_path, target_path)
            else:  # the lines go into the cache: only their counts are checked here
                check_pair_files(source_path, target_path)
        return lines

    lines = _everywhere(readable, read)
    source, target = splits["train"]
    if config.data.share_vocab:
        tokenizer = tokenizer_everywhere(config, model_dir, cache, train_file=f"{source}{SEPARATOR}{target}")
        source_tokenizer = tokenizer.source_side()  # the same ids; a BART folder's ends sources with </s>
    else:
        tokenizer = tokenizer_everywhere(config, model_dir, cache, train_file=target)
        source_tokenizer = tokenizer_everywhere(config, os.path.join(model_dir, SOURCE_TOKENIZER_DIR), cache,
                                                train_file=source)

    same_outcome_everywhere(lambda: SpecialIds.of(tokenizer))  # the targets' start, end and padding ids
    limits = dict(max_source_length=config.source_length_limit, max_target_length=config.target_length_limit)
    if cache is None:
        with doing("encoding the pairs (--data_cache none)"):
            pairs = same_outcome_everywhere(lambda: {
                split: encode_pairs(*lines[split], source_tokenizer.encode, tokenizer.encode, **limits)
                for split in splits})
    else:
        pairs = cached_pairs_everywhere(splits, source_tokenizer, tokenizer, cache, readable, limits, log)
    for split, (source_path, target_path) in splits.items():
        log(f"{split} pairs: {pairs[split].report.summary()} ({source_path}, {target_path}; at most "
            f"{config.source_length_limit} source and {config.target_length_limit} target tokens)")
    if config.checkpoints.init_from:  # a pretrained model's vocabulary is fixed; the tokenizer must fit in it
        check_vocabulary(tokenizer, config.model["vocab_size"], config.checkpoints.init_from)
    else:
        config = config.replace(vocab_size=tokenizer.vocab_size, source_vocab_size=source_tokenizer.vocab_size)
    shared = "one tokenizer for both sides" if config.data.share_vocab else \
        f"source {source_tokenizer.vocab_size} ids in {os.path.join(model_dir, SOURCE_TOKENIZER_DIR)}"
    log(f"tokenizer: {tokenizer.name}, {tokenizer.vocab_size} ids, in {model_dir} ({shared})")
    return RunData(pairs["train"], pairs.get("valid"), pairs.get("test"), tokenizer, config,
                   source_vocab=source_tokenizer)


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
    pairs = same_outcome_everywhere(lambda: {
        split: pairs_from_lines(lines[(split, "source")], lines[(split, "target")], source_path=source_path,
                                target_path=target_path, **limits)
        for split, (source_path, target_path) in splits.items()})
    log(f"pairs: {', '.join(f'{split} {len(p)}' for split, p in pairs.items())} (from the data cache {root})")
    return pairs
