"""Conversations and prompt/completion pairs as token ids with a loss weight per token.

A record (:mod:`lmkit.data.records`) is one of three formats, found from its
fields or set with ``data_format``:

* ``chat``: ``{"messages": [{"role": ..., "content": ...}, ...]}``, the
  OpenAI and Hugging Face chat format, roles ``system``, ``user`` and
  ``assistant``, any number of turns. Rendered with the model's chat
  template; every token an assistant turn adds weighs 1 (its end-of-turn
  token included: Qwen's ``<|im_end|>``, Llama 3's ``<|eot_id|>``), the
  system and user turns and the template's own scaffolding 0.
* ``completion``: ``{"prompt": ..., "completion": ...}``: no template; the
  tokenizer's start ids and the prompt weigh 0, the completion and the
  end-of-text id after it 1.
* ``text``: ``{"text": ...}`` (or a line of a plain file): every id weighs 1,
  the end-of-text id after it too.

How the assistant's tokens are found (:meth:`ChatEncoder.encode_messages`),
on any template, with or without transformers' ``{% generation %}`` markers:
the whole conversation is rendered (``add_generation_prompt=False``) and
tokenized once; for each assistant turn ``k`` the conversation is rendered
again up to turn ``k`` with the generation prompt (the assistant's header:
scaffolding, weight 0) and through turn ``k`` without it. Both renders must
be prefixes of the whole: the characters between their ends are the turn's,
and every token that overlaps them weighs 1 (transformers' rule for its
``assistant_masks``). A template that renders earlier turns otherwise than
the whole does (one that drops the reasoning of older turns) is an error
naming the record and the turn. A token that spans the boundary between the
generation prompt and the answer counts as the answer's; such boundaries are
counted (``merged_boundaries``).

Bad records are :class:`BadRecord` errors (a :class:`~lmkit.data.errors.DataError`:
exit 2 on the command line) with one message naming the file and the record,
or, with ``skip_bad_records``, counted by reason and left out
(:func:`read_examples`).
"""

from __future__ import annotations

import collections
import hashlib
import os
from typing import Any, Dict, Iterable, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from lmkit.core.registry import import_object
from lmkit.data.errors import DataError

__all__ = ["FORMATS", "ROLES", "BadRecord", "ChatEncoder", "Example", "EncodeReport", "Tally", "bad_record",
           "check_messages", "encode_conversation", "encode_records", "find_format", "holds_examples",
           "read_examples"]

#: The record formats (``data_format``).
FORMATS = ("chat", "completion", "text")
#: The roles a message may have.
ROLES = ("system", "user", "assistant")
# lmkit.hub (above lmkit.data) reads a model folder's tokenizer and template: named, not imported.
_READ_TOKENIZER = "lmkit.hub.tokenizer:read_tokenizer"
_HF_TOKENIZER = "lmkit.hub.tokenizer:HFTokenizer"
_READ_TEMPLATE = "lmkit.hub.chat:read_chat_template"
_TEMPLATE = "lmkit.hub.chat:ChatTemplate"


class BadRecord(DataError):
    """A record that cannot be trained on; ``reason`` is its kind (what ``skip_bad_records`` counts)."""

    def __init__(self, message: str, reason: str = "bad record") -> None:
        super().__init__(message)
        self.reason = reason


class Example(NamedTuple):
    """One example: ``ids`` int32 [length] and ``weights`` uint8 [length] (1: a target the loss counts)."""

    ids: np.ndarray
    weights: np.ndarray


def find_format(record: Mapping[str, Any], data_format: Optional[str] = None) -> str:
    """The format of ``record``: ``data_format`` when given, else from its fields
    (``messages``: chat, ``prompt``: completion, ``text``: text).

    Raises:
      BadRecord: the record lacks the format's field (or, unset, every format's).
    """
    fields = {"chat": "messages", "completion": "prompt", "text": "text"}
    if data_format is not None:
        if data_format not in FORMATS:
            raise DataError(f"data_format {data_format!r} is not one of {', '.join(FORMATS)}")
        if fields[data_format] in record:
            return data_format
        wanted = f"field {fields[data_format]!r} (data_format {data_format!r})"
    else:
        found = next((f for f, field in fields.items() if field in record), None)
        if found is not None:
            return found
        wanted = "'messages' (a conversation) or 'prompt' and 'completion'"
    present = ", ".join(map(repr, sorted(record))) or "none"
    raise BadRecord(f"has no {wanted}; fields present: {present}", "no messages or prompt")


def check_messages(messages: Any) -> List[Dict[str, Any]]:
    """``messages`` checked: a list of ``{"role", "content"}`` dicts, roles in :data:`ROLES`, every
    assistant turn non-empty, at least one assistant turn. Other keys of a message are kept.

    Raises:
      BadRecord: the first problem, naming the turn (counted from 1).
    """
    if not isinstance(messages, list) or not messages:
        raise BadRecord("has 'messages' that are not a list of messages; write "
                        '[{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]',
                        "no messages or prompt")
    for turn, message in enumerate(messages, 1):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise BadRecord(f"turn {turn} is not a message with a role and a content ({_shown(message)})",
                            "message without role or content")
        role, content = message["role"], message["content"]
        if role not in ROLES:
            raise BadRecord(f"turn {turn} has the unknown role {role!r}; roles are {', '.join(ROLES)}",
                            "unknown role")
        if not isinstance(content, str):
            raise BadRecord(f"turn {turn} ({role}) has a content that is not a string ({_shown(content)})",
                            "message without role or content")
        if role == "assistant" and not content.strip():
            raise BadRecord(f"turn {turn} is an empty assistant turn: nothing to train on; fill it in or drop "
                            "the record", "empty assistant turn")
    if not any(m["role"] == "assistant" for m in messages):
        raise BadRecord("has no assistant turn: nothing to train on", "no assistant turn")
    return messages


def _shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _text_field(record: Mapping[str, Any], field: str, empty_ok: bool) -> str:
    value = record.get(field)
    if not isinstance(value, str) or not (empty_ok or value.strip()):
        what = "an empty string" if isinstance(value, str) else _shown(value)
        raise BadRecord(f"has {what} in {field!r}, not a text", "no messages or prompt")
    return value


class ChatEncoder:
    """Encodes records with one tokenizer and (for conversations) one chat template.

    Args:
      tokenizer: lmkit's :class:`~lmkit.hub.tokenizer.HFTokenizer`, a ``tokenizers.Tokenizer`` or a
        ``transformers`` fast tokenizer (its ``backend_tokenizer`` is used).
      template: a :class:`~lmkit.hub.chat.ChatTemplate`, the Jinja text of one, or None (then only
        completion and text records encode).
      train_on_prompt: every token of a record weighs 1.
      end_id: the id after a completion or a text (default: the tokenizer's first end id).
    """

    def __init__(self, tokenizer: Any, template: Any = None, train_on_prompt: bool = False,
                 end_id: Optional[int] = None) -> None:
        self.tokenizer = _hf_tokenizer(tokenizer)
        self.template_source = template if isinstance(template, str) else None  # the Jinja text, when given as one
        if isinstance(template, str):
            template = import_object(_TEMPLATE, "chat template")(template, {}, "the chat template")
        self.template = template
        self.train_on_prompt = bool(train_on_prompt)
        ends = self.tokenizer.end_ids
        self.end_id = end_id if end_id is not None else (ends[0] if ends else None)
        self.missing_template = ("a conversation is rendered with the model's chat template, and none was given; "
                                 "pass --chat_template FILE (or a template to ChatEncoder)")
        self.merged_boundaries = 0  # assistant turns whose first token also holds the generation prompt's end

    @classmethod
    def from_folder(cls, folder: str, template: Any = None, train_on_prompt: bool = False) -> "ChatEncoder":
        """The encoder of a Hugging Face model folder: its tokenizer and its chat template (or ``template``:
        a Jinja file's path, read with the folder's special tokens, or a template object).

        Raises:
          UsageError: the folder has no tokenizer or no template (naming ``--chat_template``).
        """
        from lmkit.core.errors import UsageError
        tokenizer = import_object(_READ_TOKENIZER, "tokenizer reader")(folder)
        missing = None
        if template is None or isinstance(template, (str, os.PathLike)):  # the folder's, or a file's
            fix = "a conversation is rendered with the model's chat template: give one with --chat_template FILE"
            read = import_object(_READ_TEMPLATE, "chat template reader")
            try:
                template = read(folder, fix, None if template is None else os.fspath(template))
            except UsageError as exc:  # completion and text records need none: said at the first conversation
                template, missing = None, str(exc)
        encoder = cls(tokenizer, template, train_on_prompt)
        encoder.missing_template = missing or encoder.missing_template
        return encoder

    def identity(self) -> Dict[str, Any]:
        """What decides the examples besides the tokenizer and the records (the data cache keys on it): the
        template (a hash of its text, or of the file it came from, and its special tokens), ``train_on_prompt``
        and the end id."""
        template: Any = None
        if self.template is not None:
            where = getattr(self.template, "where", "")
            if self.template_source is not None:
                text = self.template_source.encode("utf-8")
            elif where and os.path.isfile(where):
                with open(where, "rb") as f:
                    text = f.read()
            else:
                text = repr(self.template).encode("utf-8")
            template = {"sha256": hashlib.sha256(text).hexdigest(),
                        "special": dict(sorted(getattr(self.template, "special_tokens", {}).items()))}
        return {"template": template, "train_on_prompt": self.train_on_prompt,
                "end_id": None if self.end_id is None else int(self.end_id)}

    def encode_record(self, record: Mapping[str, Any], data_format: Optional[str] = None) -> Example:
        """One record (any format, :func:`find_format`) as an :class:`Example`.

        Raises:
          BadRecord: what is wrong with it (a message that follows the record's name and a colon).
        """
        kind = find_format(record, data_format)
        if kind == "chat":
            return self.encode_messages(check_messages(record["messages"]))
        if kind == "completion":
            if "completion" not in record:
                raise BadRecord("has a 'prompt' but no 'completion'", "no messages or prompt")
            return self.encode_completion(_text_field(record, "prompt", True),
                                          _text_field(record, "completion", False))
        return self.encode_text(_text_field(record, "text", True))

    def encode_text(self, text: str) -> Example:
        """A text: its ids and the end id, all of weight 1."""
        ids = self._ids(text) + self._end_ids("a text")
        return Example(np.asarray(ids, np.int32), np.ones(len(ids), np.uint8))

    def encode_completion(self, prompt: str, completion: str) -> Example:
        """The start ids and the prompt (weight 0), then the completion and the end id (weight 1)."""
        head = list(self.tokenizer.start_ids) + self._ids(prompt)
        tail = self._ids(completion) + self._end_ids("a completion")
        weights = np.concatenate([np.full(len(head), int(self.train_on_prompt), np.uint8),
                                  np.ones(len(tail), np.uint8)])
        return Example(np.asarray(head + tail, np.int32), weights)

    def encode_messages(self, messages: Sequence[Mapping[str, Any]]) -> Example:
        """A checked conversation (:func:`check_messages`) rendered with the template, weight 1 on the
        tokens the assistant turns add.

        Raises:
          BadRecord: the template fails on a prefix, or renders one that is not a prefix of the whole.
          UsageError: there is no template.
        """
        if self.template is None:
            raise DataError(self.missing_template)
        whole = self._render(messages, False, len(messages))
        encoding = self.tokenizer.hf.encode(whole, add_special_tokens=False)
        ids = np.asarray(encoding.ids, np.int32)
        if self.train_on_prompt:
            return Example(ids, np.ones(len(ids), np.uint8))
        offsets = np.asarray(encoding.offsets, np.int64).reshape(-1, 2)
        starts, ends = offsets[:, 0], offsets[:, 1]
        weights = np.zeros(len(ids), np.uint8)
        for start, end in self._assistant_spans(messages, whole):
            weights[(starts < end) & (ends > start)] = 1  # every token that overlaps the turn's characters
            if start not in starts and start < len(whole):
                self.merged_boundaries += 1
        return Example(ids, weights)

    def _assistant_spans(self, messages: Sequence[Mapping[str, Any]], whole: str) -> List[Tuple[int, int]]:
        """The characters of ``whole`` that each assistant turn adds: ``[(start, end)]``."""
        spans = []
        for k, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = self._render(messages[:k], True, k + 1)
            through = self._render(messages[:k + 1], False, k + 1)
            if not (whole.startswith(before) and whole.startswith(through) and len(before) <= len(through)):
                raise BadRecord(
                    f"turn {k + 1} (assistant): the chat template renders the conversation up to this turn "
                    "otherwise than the start of the whole conversation (it rewrites earlier turns, e.g. drops "
                    "their reasoning), so the assistant's tokens cannot be found; use a template that renders "
                    "earlier turns as they are (--chat_template FILE), or --train_on_prompt",
                    "template rewrites earlier turns")
            spans.append((len(before), len(through)))
        return spans

    def _render(self, messages: Sequence[Mapping[str, Any]], generation_prompt: bool, turn: int) -> str:
        from lmkit.core.errors import UsageError
        try:
            return self.template.render(list(messages), add_generation_prompt=generation_prompt)
        except UsageError as exc:
            raise BadRecord(f"turn {turn}: {exc}", "chat template error") from None

    def _ids(self, text: str) -> List[int]:
        return list(self.tokenizer.hf.encode(text, add_special_tokens=False).ids)

    def _end_ids(self, what: str) -> List[int]:
        if self.end_id is None:
            raise DataError(f"{what} ends with the tokenizer's end-of-text id, and this tokenizer names none; "
                            "pass end_id= (the id that ends a text)")
        return [int(self.end_id)]


def _hf_tokenizer(tokenizer: Any) -> Any:
    """lmkit's HFTokenizer of ``tokenizer`` (an HFTokenizer, a ``tokenizers.Tokenizer`` or a
    transformers fast tokenizer)."""
    if hasattr(tokenizer, "hf") and hasattr(tokenizer, "start_ids"):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not hasattr(backend, "encode") or not hasattr(backend, "token_to_id"):
        raise DataError(f"a {type(tokenizer).__name__} is not a tokenizer encode_conversation reads; pass a model "
                        "folder, lmkit's HFTokenizer, a tokenizers.Tokenizer or a transformers fast tokenizer")
    return import_object(_HF_TOKENIZER, "tokenizer")(backend)


def encode_conversation(model_dir_or_tokenizer: Any, messages: Sequence[Mapping[str, Any]], template: Any = None,
                        train_on_prompt: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    """A conversation's ids and loss weights (1 on the assistant's tokens).

    Args:
      model_dir_or_tokenizer: a Hugging Face model folder (its tokenizer, and its chat template
        unless ``template`` is given), or a tokenizer (as :class:`ChatEncoder` takes).
      messages: ``[{"role": ..., "content": ...}, ...]`` (:func:`check_messages`).
      template: a :class:`~lmkit.hub.chat.ChatTemplate`; with a folder, a Jinja file's path; with a
        tokenizer, the Jinja text.
      train_on_prompt: every token weighs 1.

    Returns:
      ``(ids int32 [n], weights uint8 [n])``; ``ids`` are the whole render's tokens.

    Raises:
      BadRecord: bad messages, or a template that rewrites earlier turns (naming the turn).
      UsageError: no template (naming ``--chat_template``), a folder without a tokenizer.
    """
    if isinstance(model_dir_or_tokenizer, (str, os.PathLike)):
        encoder = ChatEncoder.from_folder(os.fspath(model_dir_or_tokenizer), template, train_on_prompt)
    else:
        encoder = ChatEncoder(model_dir_or_tokenizer, template, train_on_prompt)
    return tuple(encoder.encode_messages(check_messages(list(messages))))  # type: ignore[return-value]


class EncodeReport(NamedTuple):
    """What :func:`read_examples` read: ``records``, ``skipped`` (reason -> count) and
    ``merged_boundaries`` (see the module's docstring)."""

    records: int
    skipped: Dict[str, int]
    merged_boundaries: int

    def lines(self, what: str) -> List[str]:
        """The log lines: one when records were skipped or boundaries merged, none otherwise."""
        out = []
        if self.skipped:
            reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(self.skipped.items()))
            out.append(f"{what}: skipped {sum(self.skipped.values())} of {self.records} records ({reasons})")
        if self.merged_boundaries:
            out.append(f"{what}: {self.merged_boundaries} assistant turns start inside a token of the generation "
                       "prompt; that token counts as the assistant's")
        return out


class Tally:
    """What :func:`encode_records` has read so far: records, those skipped by reason, the first one skipped
    (``(source, where, message, reason)``), merged boundaries; :meth:`report` as an :class:`EncodeReport`."""

    def __init__(self) -> None:
        self.records, self.merged_boundaries = 0, 0
        self.skipped: Dict[str, int] = collections.Counter()
        self.first_bad: Optional[Tuple[str, str, str, str]] = None

    def report(self) -> EncodeReport:
        return EncodeReport(self.records, dict(self.skipped), self.merged_boundaries)


def bad_record(what: str, source: str, where: str, message: str, reason: str) -> BadRecord:
    """The error of a bad record: ``<what> '<source>': <where>: <message>; fix it, or pass --skip_bad_records ...``."""
    return BadRecord(f"{what} {source!r}: {where}: {message}; fix it, or pass --skip_bad_records to leave such "
                     "records out", reason)


def encode_records(records: Iterable[Tuple[str, Mapping[str, Any]]], encoder: ChatEncoder, tally: Tally, *,
                   source: str = "", what: str = "train_file", data_format: Optional[str] = None,
                   skip_bad_records: bool = False) -> Iterator[Example]:
    """The examples of ``records`` (``(where, record)`` pairs), one at a time, counted in ``tally``; the
    arguments as :func:`read_examples`'.

    Raises:
      BadRecord: the first bad record (without ``skip_bad_records``), named as :func:`bad_record` names it.
    """
    for where, record in records:
        tally.records += 1
        merged = encoder.merged_boundaries
        try:
            example = encoder.encode_record(record, data_format)
        except BadRecord as exc:
            if not skip_bad_records:
                raise bad_record(what, source, where, str(exc), exc.reason) from None
            tally.skipped[exc.reason] += 1
            tally.first_bad = tally.first_bad or (source, where, str(exc), exc.reason)
            continue
        tally.merged_boundaries += encoder.merged_boundaries - merged
        yield example


def read_examples(records: Iterable[Tuple[str, Mapping[str, Any]]], encoder: ChatEncoder, *, source: str = "",
                  what: str = "train_file", data_format: Optional[str] = None,
                  skip_bad_records: bool = False) -> Tuple[List[Example], EncodeReport]:
    """The examples of ``records`` (``(where, record)`` pairs: :func:`lmkit.data.records.read_records`).

    Args:
      records: the records, each with how messages name it.
      encoder: the :class:`ChatEncoder`.
      source, what: the file and how messages call it (``train_file``).
      data_format: one of :data:`FORMATS`, or None to find each record's from its fields.
      skip_bad_records: count and leave out bad records instead of stopping at the first.

    Raises:
      BadRecord: the first bad record, ``<what> '<source>': record 3 (line 4) <what is wrong>``.
    """
    tally = Tally()
    examples = list(encode_records(records, encoder, tally, source=source, what=what, data_format=data_format,
                                   skip_bad_records=skip_bad_records))
    return examples, tally.report()


def holds_examples(source: Any, what: str = "train_file") -> bool:
    """Whether ``source`` holds conversations or prompt/completion pairs: a source of records (JSON Lines,
    Parquet, a ``datasets`` folder) whose first record has ``messages`` or ``prompt``. Plain text: never.

    Raises:
      DataError: the first record cannot be read (as :func:`lmkit.data.records.read_records` says).
    """
    from lmkit.data.formats import holds_records
    from lmkit.data.records import read_records

    if not holds_records(source):
        return False
    records = read_records(source, what)
    try:
        first = next(records, None)
    finally:
        records.close()
    return first is not None and ("messages" in first[1] or "prompt" in first[1])
