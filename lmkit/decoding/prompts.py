"""A language model's prompt as the model reads it: a text, token ids or a conversation, encoded in one place.

    from lmkit.decoding.prompts import encode_prompt
    encode_prompt(tokenizer, "ROMEO:")                                   # a text
    encode_prompt(tokenizer, [{"role": "user", "content": "Hi"}], template="models/chat-model")  # a conversation

A text is encoded by the model's tokenizer (its line breaks are text); a
conversation is laid out by the chat template of the model's folder and
encoded whole, its special tokens read as tokens
(:func:`lmkit.hub.chat.encode_chat`, as ``transformers``'
``apply_chat_template`` encodes it); token ids pass as they are. None (or
``""``) is the empty prompt: a sample from the start of a line. Used by
:func:`lmkit.generate` and ``lmkit generate``; a server or a chat fine-tune
takes the same functions. No TensorFlow.
"""

from __future__ import annotations

import numbers
from typing import Any, List, Mapping, Optional, Sequence, Union

from lmkit.core.errors import UsageError
from lmkit.decoding.checks import spelled

__all__ = ["Prompt", "as_prompts", "encode_prompt", "is_conversation", "prompt_text", "unknown_words",
           "unknown_words_warning"]

#: One prompt: a text, token ids, a conversation (``[{"role": ..., "content": ...}, ...]``), or None (empty).
Prompt = Union[None, str, Sequence[int], Sequence[Mapping[str, str]]]


def is_conversation(value: Any) -> bool:
    """Whether ``value`` is a conversation: a non-empty list of message dicts."""
    return (isinstance(value, (list, tuple)) and bool(value)
            and all(isinstance(message, Mapping) for message in value))


def _is_ids(value: Any) -> bool:
    return all(isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in value)


def as_prompts(inputs: Union[Prompt, Sequence[Prompt]]) -> List[Prompt]:
    """``inputs`` as a list of prompts: one prompt (a text, token ids, a conversation, None) becomes a list of it."""
    if inputs is None or isinstance(inputs, str) or is_conversation(inputs):
        return [inputs]
    inputs = list(inputs)
    if inputs and _is_ids(inputs):
        return [inputs]  # one prompt's token ids
    return inputs


def prompt_text(prompt: Prompt) -> str:
    """The prompt as a message shows it: its text (a conversation's last message)."""
    if is_conversation(prompt):
        return str(prompt[-1].get("content", ""))  # type: ignore[index, union-attr]
    return "" if prompt is None else prompt if isinstance(prompt, str) else f"<{len(prompt)} token ids>"


def encode_prompt(tokenizer: Any, prompt: Prompt, template: Any = None) -> List[int]:
    """The token ids the model reads for ``prompt`` (its start token not included).

    Args:
      tokenizer: the model's tokenizer.
      prompt: a text, token ids, a conversation, or None / ``""`` (the empty prompt: no ids).
      template: a conversation's chat template (:class:`lmkit.hub.chat.ChatTemplate`, or the folder holding it).

    Raises:
      UsageError: a text of whitespace alone or one that encodes to nothing, a conversation without a template,
        ids that are not integers.
    """
    if prompt is None or (isinstance(prompt, str) and not prompt):
        return []
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt) if prompt.strip() else []  # its line breaks are text
        if not ids:
            raise UsageError(f"{spelled('prompt')} {prompt!r} is empty after tokenization; give at least one word, "
                             f"or leave {spelled('prompt')} out to start at the beginning of a line")
        return list(ids)
    if is_conversation(prompt):
        if template is None:
            raise UsageError("a conversation is laid out by its model's chat template: give a Hugging Face chat "
                             "model's folder (or a run fine-tuned from one), or the prompt as text")
        from lmkit.hub.chat import encode_chat
        return encode_chat(tokenizer, prompt, template)
    if not isinstance(prompt, Sequence) or not _is_ids(prompt):
        raise UsageError(f"prompt {prompt!r} must be a text, token ids or a conversation "
                         "([{'role': 'user', 'content': ...}])")
    return [int(i) for i in prompt]


def unknown_words(tokenizer: Any, prompt: Prompt) -> List[str]:
    """The words of a text prompt that a word vocabulary lacks (read as its unknown word); none for others."""
    vocab = getattr(tokenizer, "vocab", None) if getattr(tokenizer, "name", None) == "word" else None
    if vocab is None or not isinstance(prompt, str):
        return []
    return [word for word in prompt.split() if word not in vocab]


def unknown_words_warning(number: int, words: Sequence[str], tokenizer: Any, folder: Optional[str]) -> str:
    """``prompt 1: 'The' (try 'the'), 'zzz' not in the vocabulary of runs/x (9999 words); read as <unk>``."""
    vocab = tokenizer.vocab
    parts = []
    for word in dict.fromkeys(words):  # unique, in order
        hint = f" (try {word.lower()!r})" if word.lower() != word and word.lower() in vocab else ""
        parts.append(f"{word!r}{hint}")
    where = f" of {folder}" if folder else ""
    return (f"prompt {number}: {', '.join(parts)} not in the vocabulary{where} ({len(vocab)} words); read as "
            f"{vocab.id_to_token(vocab.unk_id)}")
