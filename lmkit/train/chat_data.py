"""A run's conversations and prompt/completion pairs as weighted examples, the same on every rank.

``lmkit train --train_file chats.jsonl`` reads records as examples with a
loss weight per token (:mod:`lmkit.data.chat`) when ``data_format`` says so
(``chat``, ``completion`` or ``text``), when ``packing`` is on, or when the
first record of the training file has ``messages`` or ``prompt``
(:func:`wants_examples`). Then, on every rank in the same order
(:func:`lmkit.train.run_data.load_run_data` puts these pieces together):

1. rank 0 copies the pretrained tokenizer into the model folder, every rank
   reads it (:func:`~lmkit.train.run_data.tokenizer_everywhere`);
2. the encoder takes the chat template of the model folder (``init_from``,
   or the folder of ``tokenizer = "hf:..."``), or ``chat_template``'s file;
3. rank 0 encodes each split into the data cache (every core's work is one
   process's here: rendering templates is Python) while the others wait, then
   every rank maps the files (:func:`~lmkit.train.run_data.cached_everywhere`);
   without a cache every rank gets rank 0's examples;
4. every rank cuts the examples to ``num_steps + 1`` ids
   (:func:`~lmkit.data.packing.fit_examples`): the same on all of them.

Rank 0 logs what was read, skipped, cut and dropped.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Dict, List, Optional

from lmkit import distributed as dist
from lmkit.core.errors import UsageError
from lmkit.core.preemption import doing
from lmkit.data.pipeline import RunData

__all__ = ["chat_encoder", "encode_splits", "example_jobs", "example_run_data", "hf_chat_encoder", "wants_examples"]

Log = Callable[[str], None]
_FORMATS = ("chat", "completion", "text")


def wants_examples(data: Any, train_sources: List[Any], readable: bool) -> bool:
    """Whether a text run's data are examples with loss weights: ``data_format`` or ``packing`` set, or the
    first training record has ``messages`` or ``prompt`` (rank 0 reads it when this rank cannot).

    Raises:
      UsageError: a ``data_format`` that is none of chat, completion, text (on every rank).
    """
    if data.data_format and data.data_format not in _FORMATS:
        raise UsageError(f"data_format = {data.data_format!r} is not one of {', '.join(_FORMATS)} (or '' to find "
                         "it from the records' fields: messages, prompt)")
    if data.data_format or data.packing:
        return True
    from lmkit.data.chat import holds_examples
    return bool(dist.read_or_receive(readable, lambda: holds_examples(train_sources[0], "train_file")))


def _template_folder(config: Any, tokenizer: Any) -> Optional[str]:
    """The folder whose chat template renders the conversations: ``init_from``'s, else that of
    ``tokenizer = "hf:<folder or name>"``."""
    if config.checkpoints.init_from:
        return config.checkpoints.init_from
    source = getattr(tokenizer, "source", "")
    if not source:
        return None
    from lmkit.hub.download import tokenizer_folder
    return tokenizer_folder(source)


def chat_encoder(config: Any, tokenizer: Any) -> Any:
    """The run's :class:`~lmkit.data.chat.ChatEncoder`: its tokenizer, the model folder's chat template (or
    ``chat_template``'s file, read with the folder's special tokens), ``train_on_prompt``.

    A folder without a template still encodes completion and text records; the first conversation then
    stops the run with a message naming ``--chat_template``.

    Raises:
      UsageError: a tokenizer that is not a Hugging Face one (lmkit's own have no chat template), a
        ``chat_template`` file that does not exist.
    """
    from lmkit.data.chat import ChatEncoder
    from lmkit.hub.chat import ChatTemplate, read_chat_template

    data = config.data
    if getattr(tokenizer, "name", "") != "hf":
        raise UsageError(f"conversations and prompt/completion records are encoded with a pretrained model's "
                         f"tokenizer, not lmkit's {tokenizer.name!r}: pass --init_from <a Hugging Face model folder> "
                         "(or --tokenizer hf:<folder> for a model trained from scratch)")
    folder = _template_folder(config, tokenizer)
    missing = ("a conversation is rendered with the model's chat template, and "
               f"{folder or 'this tokenizer'} has none; pass --chat_template FILE (a Jinja template)")
    template = None
    if data.chat_template:
        if not os.path.isfile(data.chat_template):
            raise UsageError(f"chat_template {data.chat_template!r} does not exist; give a Jinja file")
        if folder is None:
            with open(data.chat_template, encoding="utf-8") as f:
                template = ChatTemplate(f.read(), {}, data.chat_template)
        else:
            template = read_chat_template(folder, missing, data.chat_template)
    elif folder is not None:
        try:
            template = read_chat_template(folder, missing)
        except UsageError:
            template = None  # completion and text records need none: the first conversation says so
    encoder = ChatEncoder(tokenizer, template, data.train_on_prompt)
    encoder.missing_template = missing
    return encoder


def hf_chat_encoder(folder: str, tokenizer: Any) -> Any:
    """The :class:`~lmkit.data.chat.ChatEncoder` of a Hugging Face folder: ``tokenizer`` (the folder's), its chat
    template (a folder without one encodes completions, and names ``--chat_template`` at a conversation)."""
    from lmkit.data.chat import ChatEncoder
    from lmkit.hub.chat import read_chat_template

    try:
        template = read_chat_template(folder, "give a chat model's folder")
    except UsageError as exc:
        encoder = ChatEncoder(tokenizer)
        encoder.missing_template = str(exc)
        return encoder
    return ChatEncoder(tokenizer, template)


def encode_splits(encoder: Any, sources: Dict[str, List[Any]], data: Any) -> Dict[str, Any]:
    """Each split's :class:`~lmkit.data.example_cache.CachedExamples`, encoded in memory (no data cache)."""
    from lmkit.data.example_cache import encode_examples

    with doing("encoding the records (--data_cache none)"):
        return {name: encode_examples(encoder, files, what=f"{name}_file", data_format=data.data_format or None,
                                      skip_bad_records=data.skip_bad_records)
                for name, files in sources.items()}


def example_jobs(encoder: Any, sources: Dict[str, List[Any]], data: Any, cache: str) -> Dict[str, Any]:
    """The jobs of :func:`lmkit.train.run_data.cached_everywhere` that encode each split into the data cache."""
    from lmkit.data.example_cache import cached_examples, open_cached_examples

    data_format = data.data_format or None
    return {name: (f"{name}_file", functools.partial(open_cached_examples, cache, encoder, files, data_format),
                   functools.partial(cached_examples, cache, encoder, files, what=f"{name}_file",
                                     data_format=data_format, skip_bad_records=data.skip_bad_records))
            for name, files in sources.items()}


def example_run_data(config: Any, tokenizer: Any, found: Dict[str, Any], cache: Optional[str],
                     log: Log) -> RunData:
    """The run's data from each split's encoded examples, the same on every rank: bad records checked
    (:func:`~lmkit.data.example_cache.check_bad_records`), examples cut to ``num_steps + 1`` ids; rank 0 logs
    what was read, skipped, cut and dropped.

    Raises:
      UsageError: a split that skipped bad records without ``skip_bad_records`` (its first one named).
    """
    from lmkit.data.example_cache import check_bad_records
    from lmkit.data.packing import fit_examples
    from lmkit.data.pipeline import run_vocabulary

    data = config.data
    config, _ = run_vocabulary(config, tokenizer)
    splits = {}
    for name, result in found.items():
        what = f"{name}_file"
        check_bad_records(result, data.skip_bad_records, what)
        examples, fitted = fit_examples(result.examples, data.num_steps + 1)
        for line in result.report.lines(what) + fitted.lines(what, data.num_steps + 1):
            log(line)
        log(_summary(what, result, examples, cache))
        splits[name] = examples
    log(f"tokenizer: {tokenizer.source or tokenizer.name}, {tokenizer.vocab_size} ids")
    return RunData(splits["train"], splits.get("valid"), splits.get("test"), tokenizer, config)


def _summary(what: str, found: Any, examples: Any, cache: Optional[str]) -> str:
    """``train_file: 1,000 records -> 998 examples, 51,234 ids, 12,345 weighted targets (from the data cache)``."""
    where = f"from the data cache {cache}" if cache else "in memory"
    return (f"{what}: {found.report.records:,} records -> {len(examples):,} examples, {examples.tokens:,} ids, "
            f"{int(examples.targets().sum()):,} weighted targets ({where})")
