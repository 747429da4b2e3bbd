"""Beam search as ``transformers``' ``generate`` runs it (``BeamSampler(scoring="transformers")``).

A model folder's ``generation_config.json`` (BART's summarizers, for
example) tunes its beam search for this search, not for lmkit's own
(:mod:`lmkit.decoding.beam`). The differences that change outputs:

* a finished hypothesis scores ``log_prob / length ** length_penalty``
  (``length``: its new tokens, the end included), not GNMT's penalty;
* each step keeps the ``max(2, 1 + ends) * width`` best extensions; only
  those among the best ``width`` may finish there, and the best ``width``
  unfinished ones go on;
* ``early_stopping``: True ends a sequence once it has ``width`` finished
  hypotheses; False (``transformers``' default) also once the best alive
  hypothesis, scored at its present length, cannot beat the worst finished
  one; ``"never"`` scores it at the longest length instead when
  ``length_penalty`` is positive;
* the search runs until every sequence is done, or every extension ends
  (the last position).

Scores and masks are computed as ``transformers`` computes them (the
unused beams start at -1e9, masks add -1e9), so near-equal hypotheses rank
alike. Prompts of different lengths work as in lmkit's search (each row's
new tokens counted from its own prompt).
"""

from __future__ import annotations

from typing import Any, Tuple, Union

import tensorflow as tf

from lmkit.decoding.beam_step import BeamInputs, BeamSettings, extend, gather_beams, reorder
from lmkit.decoding.constraints import Constraints

__all__ = ["EarlyStopping", "beam_search_transformers"]

EarlyStopping = Union[bool, str]
_MASK = -1.0e9  # transformers' "very large negative value"


def _length_norm(length: tf.Tensor, power: float) -> tf.Tensor:
    """``length ** power`` as float32, computed in float64 (``transformers`` raises a Python number)."""
    return tf.cast(tf.pow(tf.cast(length, tf.float64), power), tf.float32)


def beam_search_transformers(model: Any, inputs: BeamInputs, settings: BeamSettings, constraints: Constraints,
                             condition: Any = None) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """The search; returns the finished set ``(ids, lengths, scores, log_probs)``, best first (``-inf``
    scores mark slots that no hypothesis filled)."""
    prompt_ids, prompt_lengths = inputs.prompt_ids, inputs.prompt_lengths
    max_length, eos_id = settings.max_length, settings.eos_id
    length_penalty, early_stopping = settings.length_penalty, settings.early_stopping
    batch_size = prompt_ids.shape[0]
    width = settings.beam_width
    vocab_size = int(model.vocab_size)
    num_candidates = min(max(2, 1 + len(eos_id)) * width, width * vocab_size)
    top_width = tf.range(num_candidates) < width  # [cand]: the extensions that may finish
    last = max_length - 1

    def not_done(t, run_ids, run_scores, state, fin_ids, fin_lengths, fin_scores, fin_log_probs, fin_done,
                 improvable, all_ended):
        del run_ids, run_scores, state, fin_ids, fin_lengths, fin_scores, fin_log_probs
        full = tf.reduce_all(fin_done) if early_stopping is True else tf.constant(False)
        return (t < last) & tf.reduce_any(improvable) & tf.logical_not(full) & tf.logical_not(all_ended)

    def body(t, run_ids, run_scores, state, fin_ids, fin_lengths, fin_scores, fin_log_probs, fin_done,
             improvable, all_ended):
        del all_ended
        step = extend(model, state, run_ids, run_scores, t, inputs, settings, constraints, num_candidates)
        pos, cand_log_probs, cand_ids, ends = step.pos, step.log_probs, step.ids, step.ends

        # The best width extensions that did not end go on.
        going = cand_log_probs + tf.cast(ends, tf.float32) * _MASK
        _, survivors = tf.math.top_k(going, k=width)
        new_run_ids = gather_beams(cand_ids, survivors)
        new_run_scores = gather_beams(going, survivors)

        # Extensions among the best width that ended join the finished set while it can improve.
        new_tokens = tf.maximum(pos + 1 - prompt_lengths, 1)  # [batch]
        scores = cand_log_probs / _length_norm(new_tokens, length_penalty)[:, tf.newaxis]
        if early_stopping is True:
            scores += tf.cast(tf.reduce_all(fin_done, axis=1, keepdims=True), tf.float32) * _MASK
        scores += tf.cast(tf.logical_not(improvable), tf.float32)[:, tf.newaxis] * _MASK
        finishing = ends & top_width[tf.newaxis, :]
        scores += tf.cast(tf.logical_not(finishing), tf.float32) * _MASK
        merged = tf.concat([fin_scores, scores], axis=1)
        fin_scores, keep = tf.math.top_k(merged, k=width)
        fin_ids = gather_beams(tf.concat([fin_ids, cand_ids], axis=1), keep)
        fin_lengths = gather_beams(tf.concat([fin_lengths, tf.fill(tf.shape(step.tokens), pos + 1)], axis=1), keep)
        fin_log_probs = gather_beams(tf.concat([fin_log_probs, cand_log_probs], axis=1), keep)
        fin_done = gather_beams(tf.concat([fin_done, finishing], axis=1), keep)

        state = reorder(model, step.state, gather_beams(step.beams, survivors))

        # Can the best alive hypothesis still beat the worst finished one?
        if early_stopping == "never" and length_penalty > 0.0:
            best_length = tf.maximum(max_length - prompt_lengths, 1)
        else:
            best_length = tf.maximum(pos + 1 - prompt_lengths, 1)
        best_possible = new_run_scores[:, 0] / _length_norm(best_length, length_penalty)  # [batch]
        worst = tf.where(fin_done, tf.reduce_min(fin_scores, axis=1, keepdims=True), _MASK)  # [batch, width]
        improvable &= tf.reduce_any(best_possible[:, tf.newaxis] > worst, axis=1)
        return (t + 1, new_run_ids, new_run_scores, state, fin_ids, fin_lengths, fin_scores, fin_log_probs,
                fin_done, improvable, tf.reduce_all(ends))

    run_ids = tf.tile(prompt_ids[:, tf.newaxis, :], [1, width, 1])
    first_beam = tf.concat([tf.zeros([batch_size, 1]), tf.fill([batch_size, width - 1], _MASK)], axis=1)
    loop_vars = (
        tf.constant(0, tf.int32), run_ids, first_beam,
        model.initial_state(batch_size * width, max_length, **({} if condition is None else {"condition": condition})),
        run_ids, tf.zeros([batch_size, width], tf.int32), tf.fill([batch_size, width], _MASK),
        tf.zeros([batch_size, width]), tf.zeros([batch_size, width], tf.bool), tf.ones([batch_size], tf.bool),
        tf.constant(False))
    out = tf.while_loop(not_done, body, loop_vars)
    _, _, _, _, fin_ids, fin_lengths, fin_scores, fin_log_probs, fin_done, _, _ = out
    fin_scores = tf.where(fin_done, fin_scores, float("-inf"))  # slots no hypothesis filled
    return fin_ids, fin_lengths, fin_scores, fin_log_probs


_beam_search_transformers_compiled = tf.function(beam_search_transformers)
_beam_search_transformers_xla = tf.function(beam_search_transformers, jit_compile=True)
