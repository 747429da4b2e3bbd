"""lmkit.decoding.prompts: a prompt (text, token ids, conversation, nothing) as the model reads it."""

from __future__ import annotations

import re

import pytest

from lmkit.core.errors import UsageError
from lmkit.decoding.checks import flag_spelling
from lmkit.decoding.prompts import as_prompts, encode_prompt, is_conversation, prompt_text, unknown_words

CHAT = [{"role": "user", "content": "hi"}]


class Letters:
    """A character tokenizer of a-z (ids 2-27), a line break as id 1: enough to encode prompts."""

    name, eos_id = "char", 1

    def encode(self, text):
        return [1 if c == "\n" else ord(c) - ord("a") + 2 for c in text if c == "\n" or c.isalpha()]


def test_one_prompt_or_a_list_of_them():
    assert as_prompts(None) == [None] and as_prompts("ab") == ["ab"] and as_prompts([3, 4]) == [[3, 4]]
    assert as_prompts(CHAT) == [CHAT] and as_prompts([CHAT, CHAT]) == [CHAT, CHAT]
    assert as_prompts(["ab", [3], None]) == ["ab", [3], None] and as_prompts([]) == []
    assert is_conversation(CHAT) and not is_conversation([]) and not is_conversation([1, 2])
    assert [prompt_text(p) for p in ("ab", None, [3, 4], CHAT)] == ["ab", "", "<2 token ids>", "hi"]


def test_texts_ids_and_nothing_are_encoded():
    tokenizer = Letters()
    assert encode_prompt(tokenizer, "ab\nc") == [2, 3, 1, 4]  # its line breaks are text
    assert encode_prompt(tokenizer, None) == [] and encode_prompt(tokenizer, "") == []  # the start of a line
    assert encode_prompt(tokenizer, [5, 6]) == [5, 6]
    for blank in (" ", "\n", "42"):  # whitespace alone, or nothing the tokenizer keeps
        with pytest.raises(UsageError, match=re.escape(f"prompt {blank!r} is empty after tokenization; give at least")):
            encode_prompt(tokenizer, blank)
    with flag_spelling(), pytest.raises(UsageError, match="--prompt ' ' is empty .* or leave --prompt out"):
        encode_prompt(tokenizer, " ")
    with pytest.raises(UsageError, match="prompt 3.5 must be a text, token ids or a conversation"):
        encode_prompt(tokenizer, 3.5)
    with pytest.raises(UsageError, match="a conversation is laid out by its model's chat template"):
        encode_prompt(tokenizer, CHAT)


def test_unknown_words_are_those_a_word_vocabulary_lacks():
    class WordTokenizer:
        name, vocab = "word", {"the": 0, "cat": 1}
    assert unknown_words(WordTokenizer(), "the zebra cat Cat") == ["zebra", "Cat"]
    assert unknown_words(WordTokenizer(), [0, 1]) == [] and unknown_words(Letters(), "zebra") == []
