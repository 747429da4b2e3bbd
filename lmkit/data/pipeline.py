"""The pieces of a run's data that each rank computes by itself: which files a config names, their
checks, the pairs' lines, the model's vocabulary, and :class:`RunData` that holds the result.

Nothing here talks to the other ranks (``lmkit.data`` imports nothing of
``lmkit.distributed``): :func:`lmkit.train.run_data.load_run_data` puts
these pieces together on every rank, with rank 0 downloading, training the
tokenizer or encoding while the others wait. Each piece is a plain function
of the config and the files, testable in one process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from lmkit.data.tokenizers import PRETRAINED_PREFIX, check_vocabulary

__all__ = ["RunData", "find_or_download_ptb", "text_sources", "check_sources", "pair_splits", "read_pair_splits",
           "model_vocabulary", "run_vocabulary"]

SPLITS = ("train", "valid", "test")  # as lmkit.data.text's (which imports TensorFlow)

@dataclass
class RunData:
    """The id streams of a run and what made them.

    Attributes:
      train, valid, test: int32 id streams (valid and test may be None); for
        pairs, :class:`~lmkit.data.paired.Pairs`.
      vocab: the PTB :class:`~lmkit.data.Vocab`, or the text data's tokenizer
        (for pairs the target side's).
      config: the config, its ``vocab_size`` the tokenizer's for text data.
      words: words of each split, for perplexity per word; empty for
        word-level data, where a token is a word.
      source_vocab: pairs: the source side's tokenizer (the same object when shared).
    """

    train: Any
    valid: Optional[Any]
    test: Optional[Any]
    vocab: Any
    config: Any
    words: Dict[str, int] = field(default_factory=dict)
    source_vocab: Any = None


def find_or_download_ptb(data_path: str, url: Optional[str], expected_vocab_size: Optional[int],
                         verify: bool = True) -> str:
    """:func:`~lmkit.data.ptb.ensure_ptb` whose failure names the missing folder or files and leaves no empty
    folder behind."""
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


def text_sources(data: Any) -> Dict[str, List[str]]:
    """``{split: files}`` of a text run's data section (``train_file``, ``valid_file``, ``test_file``; a split
    not given is left out), each resolved (:func:`~lmkit.data.sources.resolve_sources`).

    Raises:
      UsageError: a file, folder or pattern that names nothing readable.
    """
    from lmkit.data.formats import DATASET_SPLITS
    from lmkit.data.sources import resolve_sources

    specs = {name: spec for name, spec in zip(SPLITS, (data.train_file, data.valid_file, data.test_file)) if spec}
    return {name: resolve_sources(spec, f"{name}_file", text_field=data.text_field, text_column=data.text_column,
                                  dataset_split=DATASET_SPLITS[name])
            for name, spec in specs.items()}


def check_sources(sources: Dict[str, List[str]], cached: bool) -> None:
    """Checks a text run's files (:func:`~lmkit.data.textfile.check_text_file`) before anything is written into
    the model folder; with a data cache, the training files are checked as they are encoded instead (not at all
    when they are cached already)."""
    from lmkit.data.textfile import check_text_file

    for name, files in sources.items():
        if not (cached and name == "train"):
            for path in files:
                check_text_file(path, f"{name}_file")


def pair_splits(data: Any) -> Dict[str, Tuple[str, str]]:
    """``{split: (source file, target file)}`` of an encoder-decoder's data section (a split not given is left
    out)."""
    from lmkit.config import PAIR_FILE_KEYS

    return {split: (getattr(data, source_key), getattr(data, target_key))
            for split, (source_key, target_key) in zip(SPLITS, PAIR_FILE_KEYS) if getattr(data, source_key)}


def read_pair_splits(splits: Dict[str, Tuple[str, str]], cached: bool) -> Dict[str, Any]:
    """Checks the pair files and reads their lines (``{split: (sources, targets)}``), before anything is written
    into the model folder. With a data cache the lines go into the cache instead: the training files' text is
    checked as it is encoded (as for a language model's), and only the files' line counts are checked here
    (nothing is returned).

    Raises:
      UsageError: a missing or non-UTF-8 file, files of different line counts.
    """
    from lmkit.data.paired import check_pair_files, read_pairs
    from lmkit.data.textfile import check_text_file

    lines = {}
    for split, (source_path, target_path) in splits.items():
        prefix = "" if split == "train" else f"{split}_"
        if not cached or split != "train":
            check_text_file(source_path, f"{prefix}source_file", plain=True)
            check_text_file(target_path, f"{prefix}target_file", plain=True)
        if cached:
            check_pair_files(source_path, target_path)
        else:
            lines[split] = read_pairs(source_path, target_path)
    return lines


def model_vocabulary(config: Any, tokenizer: Any) -> Tuple[Any, str]:
    """The config with the ``vocab_size`` of a model trained from scratch with ``tokenizer``, and what the log
    line adds about it.

    lmkit's own tokenizers size the model: ``vocab_size`` becomes the tokenizer's. With a pretrained tokenizer
    (``tokenizer = "hf:<folder or name>"``) a config's ``vocab_size`` at least the tokenizer's is kept, the ids
    past the tokenizer's padding that the data never holds and generation never picks (nanoGPT's 50,304 for
    GPT-2's 50,257, a multiple of 64 for speed); a smaller one becomes the tokenizer's, since every config
    states a ``vocab_size`` and no model can have fewer ids than its tokenizer.
    """
    size, asked = int(tokenizer.vocab_size), int(config.model.get("vocab_size"))
    pretrained = config.data.tokenizer.startswith(PRETRAINED_PREFIX)
    if asked == size:
        return config, ""
    if asked > size and pretrained:
        return config, (f"; the model keeps the config's vocab_size = {asked}: ids {size}..{asked - 1} are padding, "
                        "never in the data nor generated")
    if pretrained:
        return config.replace(vocab_size=size), (f"; the model's vocab_size is the tokenizer's {size}, not the "
                                                 f"config's {asked} (a vocab_size >= {size} pads)")
    return config.replace(vocab_size=size), f" (the model's vocabulary; the config said vocab_size = {asked})"


def run_vocabulary(config: Any, tokenizer: Any) -> Tuple[Any, str]:
    """:func:`model_vocabulary` for a model trained from scratch; for a pretrained one (``init_from``), whose
    vocabulary is fixed, the check that the tokenizer fits in it (the config unchanged, nothing to add).

    Raises:
      UsageError: the tokenizer has more ids than the pretrained model.
    """
    init_from = config.checkpoints.init_from
    if init_from:
        check_vocabulary(tokenizer, config.model.get("vocab_size"), init_from)
        return config, ""
    return model_vocabulary(config, tokenizer)
