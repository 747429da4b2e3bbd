"""Beam search: a sampler that overrides the decode loop.

:class:`BeamSampler` is a :class:`~lmkit.decoding.sampler.Sampler` whose
:meth:`~BeamSampler.generate` runs its own loop over ``beam_width`` hypotheses
per sequence (not one token per row), so ``decode(model, n, BeamSampler(...))``
and ``get_sampler("beam", ...)`` work like every other strategy.

Each sequence keeps two sets of ``beam_width`` hypotheses: the *alive* ones,
still growing, and the *finished* ones, ended by ``eos_id`` or by reaching
``max_length``. Each step extends every alive hypothesis by every token, takes
the ``2 * beam_width`` best extensions by log-probability (at most
``beam_width`` of them end in ``eos_id``, so enough stay alive), moves the
ended ones into the finished set when their score beats its worst, and keeps
the best ``beam_width`` others alive. The model state follows the surviving
hypotheses through ``model.reorder_state``.

A hypothesis is ranked by the GNMT score (Wu et al., 2016)::

    score = log_prob / ((5 + length) / 6) ** length_penalty

where ``log_prob`` sums the log-probabilities of the generated tokens (not the
prompt) and ``length`` counts them, ``eos_id`` included. A sequence stops
early once no alive hypothesis can still beat its worst finished one, which
never changes the result.

``scoring="transformers"`` runs ``transformers``' beam search instead
(:mod:`lmkit.decoding.beam_hf`: its length normalization and
``early_stopping``), as a model folder's ``generation_config.json`` tunes it.
Both searches take ``decode``'s rules on tokens
(:class:`~lmkit.decoding.constraints.Constraints`: no repeated n-grams, forced
first and last tokens) and ``min_new_tokens``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.decoding.beam_step import BeamInputs, BeamSettings, extend, gather_beams, reorder
from lmkit.decoding.config import GenerationConfig
from lmkit.decoding.constraints import Constraints
from lmkit.decoding.prompts import DecodeResult, PromptBatch, end_ids, prepare_prompts
from lmkit.decoding.sampler import OnToken, Sampler, pick_loop

__all__ = ["BeamSampler", "BeamSearchResult", "beam_search", "gnmt_length_penalty", "SCORINGS"]
SCORINGS = ("gnmt", "transformers")
_NEG_INF = float("-inf")


@dataclasses.dataclass(frozen=True, eq=False)
class BeamSearchResult(DecodeResult):
    """Output of :func:`beam_search` (NumPy arrays).

    The :class:`DecodeResult` fields (``ids``, ``lengths``, ``prompt_lengths``,
    ``log_probs``) describe the best hypothesis of each sequence; ``seed`` is None.

    Attributes:
      scores: float32 `[batch]`, length-penalised score of the best hypothesis.
      beam_ids: int32 `[batch, beam_width, max_length]`, the finished
        hypotheses, best first (rows with score ``-inf`` are unused slots).
      beam_lengths: int32 `[batch, beam_width]`.
      beam_scores: float32 `[batch, beam_width]`, descending.
      beam_log_probs: float32 `[batch, beam_width]`.
    """

    scores: np.ndarray = None  # type: ignore[assignment]
    beam_ids: np.ndarray = None  # type: ignore[assignment]
    beam_lengths: np.ndarray = None  # type: ignore[assignment]
    beam_scores: np.ndarray = None  # type: ignore[assignment]
    beam_log_probs: np.ndarray = None  # type: ignore[assignment]


def gnmt_length_penalty(length, alpha: float):
    """``((5 + length) / 6) ** alpha``: the GNMT length normaliser (NumPy or TF)."""
    return ((5.0 + length) / 6.0) ** alpha


class BeamSampler(Sampler):
    """Beam search settings; :meth:`generate` runs the search.

    Args:
      beam_width: hypotheses kept per sequence, >= 1.
      length_penalty: with ``scoring="gnmt"`` GNMT's alpha: scores are
        ``log_prob / ((5 + len) / 6) ** alpha``; with ``"transformers"`` the
        power of the length: ``log_prob / len ** length_penalty``.
      scoring: ``"gnmt"`` (lmkit's search) or ``"transformers"`` (``transformers``' search,
        :mod:`lmkit.decoding.beam_hf`).
      early_stopping: ``transformers``' setting (True, False or ``"never"``); only with
        ``scoring="transformers"``.
    """

    def __init__(self, beam_width: int = 4, length_penalty: float = 0.0, *, scoring: str = "gnmt",
                 early_stopping: Any = False) -> None:
        if isinstance(beam_width, bool) or not isinstance(beam_width, (int, np.integer)) or beam_width < 1:
            raise UsageError(f"beam_width = {beam_width!r} must be an integer >= 1")
        if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)):
            raise UsageError(f"length_penalty = {length_penalty!r} must be a number "
                             f"(0 = none, 0.6-1.0 favours longer outputs)")
        if scoring not in SCORINGS:
            raise UsageError(f"scoring = {scoring!r} must be one of {', '.join(SCORINGS)}")
        if not (early_stopping is True or early_stopping is False or early_stopping == "never"):
            raise UsageError(f"early_stopping = {early_stopping!r} must be true, false or \"never\"")
        if early_stopping is not False and scoring != "transformers":
            raise UsageError(f"early_stopping = {early_stopping!r} is a setting of transformers' beam search; "
                             "pass scoring=\"transformers\" (lmkit's own search stops when nothing can improve)")
        self.beam_width = int(beam_width)
        self.length_penalty = float(length_penalty)
        self.scoring = scoring
        self.early_stopping = early_stopping

    def get_config(self) -> Dict[str, Any]:
        return {"beam_width": self.beam_width, "length_penalty": self.length_penalty, "scoring": self.scoring,
                "early_stopping": self.early_stopping}

    def get_next_token(self, logits: tf.Tensor, step: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        raise NotImplementedError("beam search keeps several hypotheses per row; it runs its "
                                  "own loop in BeamSampler.generate")

    def generate(self, model: Any, batch: PromptBatch, config: Any, *, condition: Any = None,
                 rules: Optional[Constraints] = None, on_token: Optional[OnToken] = None) -> "BeamSearchResult":
        """Finds high-scoring continuations of the prompts (arguments as in ``Sampler.generate``).

        The model state is built for ``batch * beam_width`` rows.

        Raises:
          UsageError: a ``seed``, ``use_cache=False``, a repetition penalty or streaming (beam search is
            deterministic, always uses the cache, scores whole hypotheses and knows its best one only
            at the end).
        """
        if on_token is not None:
            raise UsageError("beam search cannot stream: its best hypothesis is known only at the end")
        if config.repetition_penalty not in (None, 1.0):
            raise UsageError("beam search scores whole hypotheses: repetition_penalty applies to the per-token "
                             "strategies (greedy, sample, top_k, top_p)")
        if config.seed is not None or config.use_cache is False:
            raise UsageError("beam search is deterministic and always uses the cache; "
                             "drop seed and use_cache when sampler is a BeamSampler")
        min_new = None  # (pad_id goes unused: unused slots are marked by score -inf)
        if batch.min_new_tokens is not None and np.any(batch.min_new_tokens > 0):
            min_new = tf.constant(np.broadcast_to(np.asarray(batch.min_new_tokens, np.int32), [len(batch.lengths)]))
        inputs = BeamInputs(tf.constant(batch.ids), tf.constant(batch.lengths), min_new)
        settings = BeamSettings(self.beam_width, batch.max_length, batch.ends, self.length_penalty,
                                self.early_stopping)
        compiled = config.compiled is not False
        if self.scoring == "transformers":
            from lmkit.decoding import beam_hf
            search = pick_loop(beam_hf.beam_search_transformers, beam_hf._beam_search_transformers_compiled,
                               beam_hf._beam_search_transformers_xla, compiled, True, config.jit_compile)
        else:
            search = pick_loop(_beam_search, _beam_search_compiled, _beam_search_xla, compiled, True,
                               config.jit_compile)
        ids, lengths, scores, log_probs = search(model, inputs, settings, rules or Constraints(), condition=condition)
        ids, lengths, scores, log_probs = ids.numpy(), lengths.numpy(), scores.numpy(), log_probs.numpy()
        return BeamSearchResult(ids=ids[:, 0], lengths=lengths[:, 0], prompt_lengths=batch.lengths,
                                log_probs=log_probs[:, 0], seed=None, scores=scores[:, 0],
                                beam_ids=ids, beam_lengths=lengths, beam_scores=scores,
                                beam_log_probs=log_probs)


def beam_search(model: Any,
                max_length: int,
                beam_width: int = 4,
                *,
                length_penalty: float = 0.0,
                prompts: Optional[Sequence[Sequence[int]]] = None,
                batch_size: Optional[int] = None,
                condition: Any = None,
                config: Optional[GenerationConfig] = None,
                **options: Any) -> BeamSearchResult:
    """``decode(model, max_length, BeamSampler(beam_width, length_penalty), ...)``.

    Args:
      model: a language model following the protocol of ``docs/design.md``.
      max_length: length of every output row, prompt included.
      beam_width: hypotheses kept per sequence, >= 1.
      length_penalty: GNMT alpha; 0 ranks by log-probability, larger values
        favour longer outputs (0.6-1.0 is usual).
      prompts, batch_size, condition: as in :func:`lmkit.decoding.decode`.
      config: a :class:`~lmkit.decoding.config.GenerationConfig`; its ``eos_id``, ``start_id``,
        ``pad_id``, ``compiled`` and ``jit_compile`` (XLA, default when compiled) are read, as
        :func:`lmkit.decoding.decode` reads them.
      **options: fields of the config as keywords (``eos_id=0``); they win over ``config``.

    Returns:
      A :class:`BeamSearchResult`.

    Raises:
      UsageError: inconsistent or out-of-range arguments, named in the message.
    """
    config = (config or GenerationConfig()).replace(**options)
    sampler = BeamSampler(beam_width, length_penalty)
    prompt_ids, prompt_lengths, pad_id = prepare_prompts(
        model, max_length, batch_size=batch_size, prompts=prompts, eos_id=config.eos_id,
        start_id=config.start_id, pad_id=config.pad_id)
    return sampler.generate(model, PromptBatch(prompt_ids, prompt_lengths, pad_id, end_ids(config.eos_id)), config,
                            condition=condition)


def _beam_search(model: Any, inputs: BeamInputs, settings: BeamSettings, constraints: Constraints,
                 condition: Any = None) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """The search itself; returns the finished set ``(ids, lengths, scores, log_probs)``."""
    prompt_ids, prompt_lengths = inputs.prompt_ids, inputs.prompt_lengths
    max_length, alpha = settings.max_length, settings.length_penalty
    batch_size = prompt_ids.shape[0]
    width = settings.beam_width
    vocab_size = int(model.vocab_size)
    # 2 * width candidates hold at most width <eos> endings, so width stay alive.
    num_candidates = min(2 * width, width * vocab_size)
    neg_inf = tf.constant(_NEG_INF, tf.float32)

    def penalised(log_prob, generated_length):
        return log_prob / gnmt_length_penalty(tf.cast(generated_length, tf.float32), alpha)

    def not_done(t, alive_ids, alive_log_probs, state, fin_ids, fin_lengths, fin_scores, fin_log_probs):
        del alive_ids, state, fin_ids, fin_lengths, fin_log_probs
        # An alive hypothesis can only lose log-probability, and its score is
        # monotone in its final length, so the better of the two length
        # extremes bounds what it can still reach.
        # Generated tokens of a hypothesis ending at the next step (>= 0 inside prompts).
        next_length = tf.maximum(t + 2 - prompt_lengths, 0)  # [batch]
        final_length = max_length - prompt_lengths  # [batch]
        best_alive = tf.reduce_max(alive_log_probs, axis=1)  # [batch]
        reachable = tf.maximum(penalised(best_alive, next_length), penalised(best_alive, final_length))
        worst_finished = fin_scores[:, -1]  # [batch], the set is kept sorted
        done = tf.logical_and(worst_finished > neg_inf, reachable < worst_finished)  # [batch]
        return tf.logical_and(t < max_length - 1, tf.logical_not(tf.reduce_all(done)))

    def body(t, alive_ids, alive_log_probs, state, fin_ids, fin_lengths, fin_scores, fin_log_probs):
        step = extend(model, state, alive_ids, alive_log_probs, t, inputs, settings, constraints, num_candidates)
        pos, cand_log_probs, cand_ids, ends = step.pos, step.log_probs, step.ids, step.ends

        generated_length = tf.maximum(pos + 1 - prompt_lengths, 0)  # [batch]
        cand_scores = tf.where(ends, penalised(cand_log_probs, generated_length[:, tf.newaxis]), neg_inf)

        # Merge the ended candidates into the finished set; top_k keeps it sorted.
        all_scores = tf.concat([fin_scores, cand_scores], axis=1)  # [batch, width + cand]
        fin_scores, keep = tf.math.top_k(all_scores, k=width)  # [batch, width]
        cand_lengths = tf.broadcast_to(pos + 1, tf.shape(step.tokens))  # [batch, cand]
        fin_ids = gather_beams(tf.concat([fin_ids, cand_ids], axis=1), keep)
        fin_lengths = gather_beams(tf.concat([fin_lengths, cand_lengths], axis=1), keep)
        fin_log_probs = gather_beams(tf.concat([fin_log_probs, cand_log_probs], axis=1), keep)

        # The best width candidates that did not end stay alive.
        alive_scores = tf.where(ends, neg_inf, cand_log_probs)  # [batch, cand]
        alive_log_probs, survivors = tf.math.top_k(alive_scores, k=width)  # [batch, width]
        alive_ids = gather_beams(cand_ids, survivors)  # [batch, width, max_length]
        state = reorder(model, step.state, gather_beams(step.beams, survivors))
        return t + 1, alive_ids, alive_log_probs, state, fin_ids, fin_lengths, fin_scores, fin_log_probs

    alive_ids = tf.tile(prompt_ids[:, tf.newaxis, :], [1, width, 1])  # [batch, width, max_length]
    # Only beam 0 is live at the start, so the identical copies do not fill the beam.
    first_beam = tf.one_hot(tf.zeros([batch_size], tf.int32), width, on_value=0.0, off_value=_NEG_INF)
    loop_vars = (
        tf.constant(0, tf.int32),
        alive_ids,
        first_beam,  # [batch, width]
        # A conditional model repeats each row's condition for its width hypotheses (rows b * width + w).
        model.initial_state(batch_size * width, max_length,
                            **({} if condition is None else {"condition": condition})),
        alive_ids,  # finished ids: any content, their scores are -inf
        tf.zeros([batch_size, width], tf.int32),
        tf.fill([batch_size, width], neg_inf),
        tf.fill([batch_size, width], neg_inf),
    )
    _, alive_ids, alive_log_probs, _, fin_ids, fin_lengths, fin_scores, fin_log_probs = tf.while_loop(
        not_done, body, loop_vars)

    # Only when the loop never ran (the prompts fill max_length) is the
    # finished set empty; the prompts are then the answer.
    empty = tf.reduce_all(tf.equal(fin_scores, neg_inf), axis=1)  # [batch]
    prompt_only = tf.broadcast_to(prompt_lengths[:, tf.newaxis], [batch_size, width])
    fin_ids = tf.where(empty[:, tf.newaxis, tf.newaxis], alive_ids, fin_ids)
    fin_lengths = tf.where(empty[:, tf.newaxis], prompt_only, fin_lengths)
    fin_scores = tf.where(empty[:, tf.newaxis], alive_log_probs, fin_scores)
    fin_log_probs = tf.where(empty[:, tf.newaxis], alive_log_probs, fin_log_probs)
    return fin_ids, fin_lengths, fin_scores, fin_log_probs


_beam_search_compiled = tf.function(_beam_search)
_beam_search_xla = tf.function(_beam_search, jit_compile=True)
