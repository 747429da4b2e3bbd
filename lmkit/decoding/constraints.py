"""Rules on the next token that a model folder's generation settings ask for (``decode(..., rules=)``).

:class:`Constraints` holds what ``transformers``' ``generate`` calls logits
processors and a ``generation_config.json`` sets for encoder-decoders (a
summarizer's): no n-gram twice (``no_repeat_ngram_size``), a forced
first token (``forced_bos_token_id``) and a forced end at the last position
(``forced_eos_token_id``); with the decode's ``min_new_tokens`` (its
``min_length``, counted without the decoder's prompt) no end before that
many new tokens. ``vocab_limit`` is the model's, not a setting: text
generation sets it to the tokenizer's size when the model's vocabulary is
padded past it (50,304 ids for a tokenizer's 50,257), whose extra ids
name no text. :meth:`Constraints.apply` turns
the log-probabilities (or logits) of the next token of every hypothesis of
beam search, or of every row of the per-token loop, into those of the allowed
tokens (``-inf`` elsewhere), inside the compiled loop, with the
shapes fixed: the n-grams are compared over the whole id buffer and masked to
the tokens written so far.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.decoding.checks import check_setting

__all__ = ["Constraints", "is_end"]


def is_end(tokens: tf.Tensor, ends: Tuple[int, ...]) -> tf.Tensor:
    """Whether each of ``tokens`` (int32, any shape) is one of the end ids ``ends`` (all False for none)."""
    if not ends:
        return tf.zeros_like(tokens, tf.bool)
    return tf.reduce_any(tf.equal(tokens[..., tf.newaxis], tf.constant(ends, tokens.dtype)), axis=-1)


@dataclasses.dataclass(frozen=True)
class Constraints:
    """Which next tokens a hypothesis may take.

    Attributes:
      no_repeat_ngram_size: n > 0: a token that would complete an n-gram already in the
        hypothesis (its prompt included, as ``transformers`` counts) is not allowed.
      forced_first_id: the first new token is this id.
      forced_last_id: the token at the last position of the output is this id.
      vocab_limit: no id at or past this one is chosen (None: any id of the model).
    """

    no_repeat_ngram_size: int = 0
    forced_first_id: Optional[int] = None
    forced_last_id: Optional[int] = None
    vocab_limit: Optional[int] = None

    def __post_init__(self) -> None:
        check_setting("no_repeat_ngram_size", self.no_repeat_ngram_size)
        check_setting("forced_first_id", self.forced_first_id)
        check_setting("forced_last_id", self.forced_last_id)
        limit = self.vocab_limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise UsageError(f"vocab_limit = {limit!r} must be the number of ids the tokenizer has (>= 1) or None")

    @property
    def active(self) -> bool:
        return bool(self.no_repeat_ngram_size or self.forced_first_id is not None or self.forced_last_id is not None
                    or self.vocab_limit is not None)

    def get_config(self) -> Dict[str, Any]:
        """The rules a :class:`~lmkit.decoding.config.GenerationConfig` holds (``vocab_limit`` is the model's)."""
        config = dataclasses.asdict(self)
        del config["vocab_limit"]
        return config

    def apply(self, log_probs: tf.Tensor, ids: tf.Tensor, length: tf.Tensor, prompt_lengths: tf.Tensor,
              max_length: int, ends: Tuple[int, ...], min_new_tokens: Optional[tf.Tensor] = None) -> tf.Tensor:
        """The log-probabilities with the tokens these rules forbid at ``-inf``.

        Args:
          log_probs: float32 `[batch, width, vocab]`, of the token at position ``length``.
          ids: int32 `[batch, width, max_length]`, positions ``0..length-1`` written.
          length: int32 scalar, tokens written so far (the prompt included).
          prompt_lengths: int32 `[batch]`.
          max_length: the output's length.
          ends: the end ids (what ``min_new_tokens`` holds back).
          min_new_tokens: int32 `[batch]`: no end id before this many new tokens (None: no limit).
        """
        vocab = log_probs.shape[-1]
        neg_inf = tf.constant(float("-inf"), log_probs.dtype)
        if self.vocab_limit is not None:
            log_probs = tf.where(tf.range(tf.shape(log_probs)[-1]) >= self.vocab_limit, neg_inf, log_probs)
        if self.no_repeat_ngram_size:
            log_probs = tf.where(_repeated_ngram_mask(ids, length, self.no_repeat_ngram_size, vocab), neg_inf,
                                 log_probs)
        if min_new_tokens is not None and ends:
            early = (length - prompt_lengths) < min_new_tokens  # [batch]
            log_probs = tf.where(early[:, tf.newaxis, tf.newaxis] & is_end(tf.range(vocab), ends), neg_inf, log_probs)

        def only(token: int, when: tf.Tensor) -> tf.Tensor:  # when: [batch]
            forced = tf.one_hot(token, vocab, on_value=0.0, off_value=float("-inf"), dtype=log_probs.dtype)
            return tf.where(when[:, tf.newaxis, tf.newaxis], forced, log_probs)

        if self.forced_first_id is not None:
            log_probs = only(self.forced_first_id, tf.equal(length, prompt_lengths))
        if self.forced_last_id is not None:
            log_probs = only(self.forced_last_id, tf.fill(tf.shape(prompt_lengths), tf.equal(length, max_length - 1)))
        return log_probs


def _repeated_ngram_mask(ids: tf.Tensor, length: tf.Tensor, n: int, vocab: int) -> tf.Tensor:
    """bool `[batch, width, vocab]`: the tokens that would repeat an n-gram of ``ids[..., :length]``.

    An n-gram can be completed only by a token following the last ``n - 1``
    ones, so those are compared with the first ``n - 1`` tokens of every
    n-gram written so far, and each match forbids that n-gram's last token.
    """
    batch, width, max_length = ids.shape
    starts = max_length - n + 1  # n-grams that fit the buffer
    if starts < 1:
        return tf.zeros([batch, width, vocab], tf.bool)
    if n == 1:  # every token written so far
        written = tf.range(max_length) < length
        heads_match = tf.broadcast_to(written, [batch, width, max_length])
        lasts = ids
    else:
        heads = tf.stack([ids[..., k:k + starts] for k in range(n - 1)], axis=-1)  # [batch, width, starts, n-1]
        suffix = tf.gather(ids, tf.maximum(length - (n - 1) + tf.range(n - 1), 0), axis=2)  # [batch, width, n-1]
        inside = tf.range(starts) + n - 1 < length  # the n-gram at each start is written: [starts]
        heads_match = tf.reduce_all(tf.equal(heads, suffix[:, :, tf.newaxis, :]), axis=-1) & inside
        heads_match &= length >= n
        lasts = ids[..., n - 1:n - 1 + starts]  # [batch, width, starts]
    rows = batch * width
    banned = tf.reshape(tf.where(heads_match, lasts, vocab), [rows, -1])  # unmatched: a spare column
    row_index = tf.broadcast_to(tf.range(rows)[:, tf.newaxis], tf.shape(banned))
    indices = tf.stack([row_index, tf.minimum(banned, vocab)], axis=-1)  # [rows, starts, 2]
    marks = tf.tensor_scatter_nd_max(tf.zeros([rows, vocab + 1], tf.int32), tf.reshape(indices, [-1, 2]),
                                     tf.ones([tf.size(banned)], tf.int32))
    return tf.reshape(marks[:, :vocab] > 0, [batch, width, vocab])
