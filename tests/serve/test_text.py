"""Prompts as lmkit generate reads them, and replies cut at stop strings (held back while one could start)."""
import pytest

from lmkit.core.errors import UsageError
from lmkit.serve.text import Prompts, Reply


class Chars:
    """A character tokenizer (ids are code points) with a line break as its end of line."""

    name, eos_id, vocab_size = "char", 10, 256

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_a_prompt_starts_after_the_line_break_and_ids_are_checked():
    prompts = Prompts(Chars())
    assert prompts.text("ab") == [10, 97, 98] and prompts.started([1, 2]) == [10, 1, 2]
    with pytest.raises(UsageError, match="999"):
        prompts.started([999])
    with pytest.raises(UsageError, match="--chat_template"):
        prompts.messages([{"role": "user", "content": "hi"}])


def test_a_reply_holds_back_what_could_start_a_stop_string_and_ends_before_it():
    reply = Reply(Chars(), Chars().encode("x"), ["END"])
    shown = []
    for c in "abE":
        reply.add(ord(c))
        shown.append(reply.new_text(False))
    assert "".join(shown) == "a" and reply.stopped is None  # "bE" could begin "END"
    reply.add(ord("N"))
    reply.add(ord("D"))
    assert reply.stopped == "END" and reply.new_text(True) == "b" and reply.text == "ab"
