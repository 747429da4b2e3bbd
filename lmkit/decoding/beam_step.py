"""The step both beam searches share: extend every hypothesis by one token, keep the best extensions.

:mod:`lmkit.decoding.beam` (lmkit's GNMT-scored search) and
:mod:`lmkit.decoding.beam_hf` (``transformers``' search) differ in how they
score, finish and stop hypotheses, not in how they extend them:
:func:`extend` runs the model one step for every live hypothesis, applies
``decode``'s rules on tokens, forces the prompt's own tokens (at no cost:
a prompt's probability never counts in a score), and keeps the
``num_candidates`` best continuations with their ids written in;
:func:`reorder` moves the model's state to the surviving hypotheses.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Tuple

import tensorflow as tf

from lmkit.decoding.constraints import Constraints, is_end

__all__ = ["BeamInputs", "BeamSettings", "Extensions", "extend", "gather_beams", "reorder"]


class BeamInputs(NamedTuple):
    """The tensors a search starts from."""

    prompt_ids: tf.Tensor  # [batch, max_length], each prompt padded
    prompt_lengths: tf.Tensor  # [batch]
    min_new_tokens: Optional[tf.Tensor]  # [batch]: no end before that many new tokens (None: no limit)


class BeamSettings(NamedTuple):
    """The Python settings of one traced search (``tf.function`` keys its traces on their values)."""

    beam_width: int  # hypotheses kept per sequence
    max_length: int  # every output row's length
    eos_id: Tuple[int, ...]  # the ids that end a hypothesis
    length_penalty: float  # GNMT's alpha, or transformers' power of the length
    early_stopping: Any = False  # transformers' (True, False or "never")


class Extensions(NamedTuple):
    """The best continuations of one step, ``[batch, cand]`` unless said."""

    pos: tf.Tensor  # the position chosen (scalar)
    in_prompt: tf.Tensor  # [batch]: that position is inside the row's prompt
    log_probs: tf.Tensor  # the hypothesis' running score plus the token's log-probability
    beams: tf.Tensor  # the hypothesis each extends
    tokens: tf.Tensor  # the token it adds
    ids: tf.Tensor  # [batch, cand, max_length]: its ids, the token written at pos
    ends: tf.Tensor  # an end token outside the prompt, or the last position
    state: Any  # the model's state after the step, rows in the old hypotheses' order


def gather_beams(values: tf.Tensor, beams: tf.Tensor) -> tf.Tensor:
    """``values[b, beams[b, i], ...]``: ``[batch, n, ...]`` from ``[batch, width, ...]``."""
    return tf.gather(values, beams, batch_dims=1)


def extend(model: Any, state: Any, ids: tf.Tensor, scores: tf.Tensor, t: tf.Tensor, inputs: BeamInputs,
           settings: BeamSettings, constraints: Constraints, num_candidates: int) -> Extensions:
    """One step of beam search from the hypotheses ``ids`` ``[batch, width, max_length]`` (``t + 1`` ids
    written) with running ``scores`` ``[batch, width]``: the ``num_candidates`` best extensions."""
    prompt_ids, prompt_lengths = inputs.prompt_ids, inputs.prompt_lengths
    max_length, eos_id = settings.max_length, settings.eos_id
    batch_size, width = ids.shape[0], ids.shape[1]
    vocab_size = int(model.vocab_size)
    logits, state = model.step(tf.reshape(ids[:, :, t], [batch_size * width]), state)  # [batch * width, vocab]
    log_probs = tf.reshape(tf.nn.log_softmax(tf.cast(logits, tf.float32)), [batch_size, width, vocab_size])
    pos = t + 1
    log_probs = constraints.apply(log_probs, ids, pos, prompt_lengths, max_length, eos_id, inputs.min_new_tokens)
    in_prompt = pos < prompt_lengths  # [batch]
    forced = tf.one_hot(prompt_ids[:, pos], vocab_size, on_value=0.0, off_value=float("-inf"))  # [batch, vocab]
    log_probs = tf.where(in_prompt[:, tf.newaxis, tf.newaxis], forced[:, tf.newaxis, :], log_probs)

    totals = tf.reshape(scores[:, :, tf.newaxis] + log_probs, [batch_size, width * vocab_size])
    cand_log_probs, flat = tf.math.top_k(totals, k=num_candidates)  # [batch, cand]
    beams, tokens = flat // vocab_size, flat % vocab_size
    write = tf.equal(tf.range(max_length, dtype=tf.int32), pos)[tf.newaxis, tf.newaxis, :]  # [1, 1, max_length]
    cand_ids = tf.where(write, tokens[:, :, tf.newaxis], gather_beams(ids, beams))
    ends = (is_end(tokens, eos_id) & tf.logical_not(in_prompt)[:, tf.newaxis]) | tf.equal(pos, max_length - 1)
    return Extensions(pos, in_prompt, cand_log_probs, beams, tokens, cand_ids, ends, state)


def reorder(model: Any, state: Any, parents: tf.Tensor) -> Any:
    """The model's state for the hypotheses that extend ``parents`` ``[batch, width]``."""
    batch_size, width = parents.shape[0], parents.shape[1]
    rows = tf.range(batch_size, dtype=tf.int32)[:, tf.newaxis] * width + parents
    return model.reorder_state(state, tf.reshape(rows, [batch_size * width]))
