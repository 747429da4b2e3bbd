"""Text in and out of the server: prompts as ``lmkit generate`` encodes them, replies cut at stop strings.

:class:`Prompts` turns a completion's prompt (text or token ids) or a chat's
messages into the model's input, as ``lmkit generate`` (and ``--chat``)
would: lmkit's own models read a prompt after a line break, a Hugging Face
model as ``transformers`` encodes it; a chat is laid out by the folder's
chat template and ends at its end-of-turn text. :class:`Reply` follows one
sequence's tokens and says what text is new (held back while it could still
start a stop string, or ends inside a character), and where a stop string ends it.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Tuple

from lmkit.core.errors import UsageError
from lmkit.decoding.text import check_stop_strings, end_of_document_ids, start_id_of

__all__ = ["Prompts", "Reply"]

# Prompt tokens decoded before a reply's own, so that its first characters read as in the whole text.
_TAIL = 8


class Prompts:
    """How a model folder's prompts become token ids.

    Args:
      tokenizer: the folder's tokenizer (lmkit's or a Hugging Face folder's).
      chat: the folder's :class:`~lmkit.hub.chat.ChatTemplate`, or None.
    """

    def __init__(self, tokenizer: Any, chat: Any = None) -> None:
        self.tokenizer, self.chat = tokenizer, chat
        self.start_id = start_id_of(tokenizer, None)
        self.end_ids = list(end_of_document_ids(tokenizer))
        limit = getattr(tokenizer, "vocab_size", None)
        self.vocab_limit = None if limit is None else int(limit)

    def text(self, text: str) -> List[int]:
        """A completion's text prompt, as the model reads it (the start token first, where the model has one).

        Raises:
          UsageError: the prompt is empty after tokenization.
        """
        ids = self.tokenizer.encode(text) if text.strip() else []
        if text and not ids and self.start_id is None:
            raise UsageError(f"prompt {text[:40]!r} is empty after tokenization")
        return self.started(ids)

    def started(self, ids: Sequence[int]) -> List[int]:
        """Token ids with the start token before them (where the model has one)."""
        ids = [int(i) for i in ids]
        if self.vocab_limit is not None:
            bad = next((i for i in ids if not 0 <= i < self.vocab_limit), None)
            if bad is not None:
                raise UsageError(f"prompt token id {bad} is not an id of this model's tokenizer; "
                                 f"use ids in [0, {self.vocab_limit})")
        out = ([] if self.start_id is None else [self.start_id]) + ids
        if not out:
            raise UsageError("the prompt is empty and this model has no start token; give a prompt")
        return out

    def messages(self, messages: Sequence[Mapping[str, str]]) -> Tuple[List[int], List[str]]:
        """A chat's messages laid out by the template: ``(ids, the stop strings the template adds)``.

        Raises:
          UsageError: the folder has no chat template (naming ``--chat_template``), or the template refused.
        """
        if self.chat is None:
            raise UsageError("this model has no chat template: start lmkit serve with --chat_template FILE "
                             "(a Jinja chat template), or use /v1/completions")
        text = self.chat.render(list(messages))
        hf = getattr(self.tokenizer, "hf", None)
        # The whole laid-out text at once, as lmkit generate --chat does: the template's special tokens are tokens.
        ids = list(hf.encode(text, add_special_tokens=False).ids) if hf is not None else self.tokenizer.encode(text)
        return ids, ([self.chat.eos_token] if self.chat.eos_token else [])

    def check_stop(self, stop: Sequence[str]) -> List[str]:
        """Stop strings the tokenizer can write (:func:`lmkit.decoding.text.check_stop_strings`)."""
        return check_stop_strings(list(stop), self.tokenizer) if stop else []

    def token_text(self, token: int) -> str:
        """One token's text (a log-probability's label)."""
        return self.tokenizer.decode([int(token)])


class Reply:
    """One sequence's text as its tokens come: the new text, and the stop string that ends it.

    Args:
      tokenizer: the model's tokenizer.
      prompt: the prompt's ids (the start token left out).
      stop: the stop strings (text where the reply ends, not included).
    """

    def __init__(self, tokenizer: Any, prompt: Sequence[int], stop: Sequence[str]) -> None:
        self.tokenizer, self.stop = tokenizer, list(stop)
        self.tail = list(prompt[-_TAIL:])
        self.tail_text = tokenizer.decode(self.tail)
        self.tokens: List[int] = []
        self.text = ""  # the whole reply so far, cut at a stop string
        self.sent = 0  # characters of it already handed out
        self.stopped: Optional[str] = None
        self.hold = max((len(s) for s in self.stop), default=1) - 1

    def add(self, token: int) -> None:
        """Takes one generated token (not an end token: those are no text)."""
        self.tokens.append(int(token))
        whole = self.tokenizer.decode(self.tail + self.tokens)
        text = whole[len(self.tail_text):] if whole.startswith(self.tail_text) else whole
        hits = [(i, s) for i, s in ((text.find(s), s) for s in self.stop) if i >= 0]
        if hits:
            at, self.stopped = min(hits)
            text = text[:at]
        self.text = text

    def new_text(self, final: bool) -> str:
        """The text not handed out yet; before the end, less what could still change."""
        end = len(self.text)
        if not final and self.stopped is None:
            end -= self.hold
            while end > self.sent and self.text[end - 1] == "\ufffd":  # a character whose bytes are still coming
                end -= 1
        if end <= self.sent:
            return ""
        out, self.sent = self.text[self.sent:end], end
        return out
