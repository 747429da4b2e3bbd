"""Beam search: one search, a sampler that overrides the decode loop.

:class:`BeamSampler` is a :class:`~lmkit.decoding.sampler.Sampler` whose
:meth:`~BeamSampler.generate` runs its own loop over ``beam_width`` hypotheses
per sequence, so ``decode(model, n, BeamSampler(...))`` and
``get_sampler("beam", ...)`` work like every other strategy.

Each sequence keeps ``beam_width`` *alive* hypotheses, still growing, and
``beam_width`` *finished* ones, ended by an end id or by reaching
``max_length``. Each step extends every alive hypothesis by every token
(:func:`_extend`: the rules on tokens applied, a prompt's own tokens forced
at no cost), takes the best ``max(2, 1 + ends) * beam_width`` extensions by
log-probability (so ``beam_width`` of them do not end), moves the ended ones
into the finished set when their score beats its worst, and keeps the best
``beam_width`` others alive; the model state follows them
(``model.reorder_state``). A finished hypothesis scores ``log_prob / norm(length)``,
``log_prob`` summing the generated tokens' log-probabilities (not the
prompt's) and ``length`` counting them, the end id included.

Its options (:class:`BeamSampler`) choose how it scores and when it stops:

* ``scoring="gnmt"`` (lmkit's): ``norm = ((5 + length) / 6) ** length_penalty``
  (Wu et al., 2016), and every ended extension may finish;
* ``scoring="transformers"``: ``norm = length ** length_penalty``, only the
  ended extensions among the best ``beam_width`` may finish, and scores are
  masked as ``transformers`` masks them (-1e9 added), so near-equal
  hypotheses rank alike: the search of a model folder's
  ``generation_config.json``, token for token;
* ``early_stopping``: ``"never"`` (gnmt's default) stops a sequence once no
  alive hypothesis can still beat its worst finished one, which never changes
  the result; False (transformers' default) once the best alive hypothesis,
  scored at its present length, cannot; True once ``beam_width`` have finished.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, NamedTuple, Optional, Tuple

import numpy as np
import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.core.xla import use_autograph
from lmkit.decoding.batch import DecodeResult, PromptBatch
from lmkit.decoding.checks import check_setting
from lmkit.decoding.constraints import Constraints, is_end
from lmkit.decoding.registry import EARLY_STOPPING
from lmkit.decoding.sampler import OnToken, Sampler, compiled_forms, pick_loop, uses_xla
from lmkit.layers import layouts

__all__ = ["BeamSampler", "BeamSearchResult", "gnmt_length_penalty"]
_NEG_INF = float("-inf")
_TRANSFORMERS_MASK = -1.0e9  # transformers' "very large negative value"


@dataclasses.dataclass(frozen=True, eq=False)
class BeamSearchResult(DecodeResult):
    """Output of a beam search (NumPy arrays).

    The :class:`DecodeResult` fields (``ids``, ``lengths``, ``prompt_lengths``, ``log_probs``) describe the
    best hypothesis of each sequence; ``seed`` is None.

    Attributes:
      scores: float32 `[batch]`, the best hypothesis' score.
      beam_ids: int32 `[batch, beam_width, max_length]`, the finished hypotheses, best first (rows
        with score ``-inf`` are unused slots).
      beam_lengths: int32 `[batch, beam_width]`; beam_scores: float32, descending; beam_log_probs: float32.
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
      length_penalty: the power of the length normalization: GNMT's alpha (0 ranks by log-probability,
        0.6-1.0 favours longer outputs), or with ``scoring="transformers"`` the power of the length.
      scoring: ``"gnmt"`` (lmkit's) or ``"transformers"`` (``transformers``' search, token for token).
      early_stopping: True, False or ``"never"`` (see the module); None: the scoring's own (``"never"``
        for gnmt, False for transformers).
    """

    def __init__(self, beam_width: int = 4, length_penalty: float = 0.0, *, scoring: str = "gnmt",
                 early_stopping: Any = None) -> None:
        check_setting("beam_width", beam_width)
        check_setting("length_penalty", length_penalty)
        check_setting("beam_scoring", scoring)
        check_setting("early_stopping", early_stopping)
        self.beam_width = int(beam_width)
        self.length_penalty = float(length_penalty)
        self.scoring = scoring
        self.early_stopping = EARLY_STOPPING[scoring] if early_stopping is None else early_stopping

    def get_config(self) -> Dict[str, Any]:
        return {"beam_width": self.beam_width, "length_penalty": self.length_penalty, "scoring": self.scoring,
                "early_stopping": self.early_stopping}

    def get_next_token(self, logits: tf.Tensor, step: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        raise NotImplementedError("beam search keeps several hypotheses per row; it runs its "
                                  "own loop in BeamSampler.generate")

    def generate(self, model: Any, batch: PromptBatch, config: Any, *, condition: Any = None,
                 rules: Optional[Constraints] = None, on_token: Optional[OnToken] = None) -> "BeamSearchResult":
        """Finds high-scoring continuations of the prompts (arguments as in ``Sampler.generate``); the model
        state is built for ``batch * beam_width`` rows.

        Raises:
          UsageError: a ``seed``, ``use_cache=False``, a repetition penalty or streaming (beam search is
            deterministic, always uses the cache, scores whole hypotheses and knows its best one only at the end).
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
        compiled = config.compiled is not False
        settings = BeamSettings(self.beam_width, batch.max_length, batch.ends, self.length_penalty, self.scoring,
                                self.early_stopping, layouts.pays(uses_xla(config.jit_compile, True, compiled),
                                                             batch.max_length - 1))
        search = pick_loop(_beam_search, _BEAM_SEARCHES, compiled, True, config.jit_compile,
                           autograph=use_autograph(model))
        ids, lengths, scores, log_probs = search(model, inputs, settings, rules or Constraints(), condition=condition)
        ids, lengths, scores, log_probs = ids.numpy(), lengths.numpy(), scores.numpy(), log_probs.numpy()
        return BeamSearchResult(ids=ids[:, 0], lengths=lengths[:, 0], prompt_lengths=batch.lengths,
                                log_probs=log_probs[:, 0], seed=None, scores=scores[:, 0],
                                beam_ids=ids, beam_lengths=lengths, beam_scores=scores,
                                beam_log_probs=log_probs)


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
    length_penalty: float  # the power of the length normalization
    scoring: str  # "gnmt" or "transformers"
    early_stopping: Any  # True, False or "never"
    layouts: bool = False  # in lmkit.layers.layouts.decode_layouts (XLA on a CPU)

    @property
    def mask(self) -> float:
        """What a ruled-out score gets added: -inf (lmkit's), or -1e9 as ``transformers`` adds it."""
        return _TRANSFORMERS_MASK if self.scoring == "transformers" else _NEG_INF

    def norm(self, length: tf.Tensor) -> tf.Tensor:
        """float32 normalizer of ``length`` generated tokens (an int tensor)."""
        if self.scoring == "transformers":  # computed in float64, as transformers raises a Python number
            return tf.cast(tf.pow(tf.cast(length, tf.float64), self.length_penalty), tf.float32)
        return gnmt_length_penalty(tf.cast(length, tf.float32), self.length_penalty)


class _Extensions(NamedTuple):
    """The best continuations of one step, ``[batch, cand]`` unless said."""

    pos: tf.Tensor  # the position chosen (scalar)
    log_probs: tf.Tensor  # the hypothesis' running score plus the token's log-probability
    beams: tf.Tensor  # the hypothesis each extends
    tokens: tf.Tensor  # the token it adds
    ids: tf.Tensor  # [batch, cand, max_length]: its ids, the token written at pos
    ends: tf.Tensor  # an end token outside the prompt, or the last position
    state: Any  # the model's state after the step, rows in the old hypotheses' order


class _Search(NamedTuple):
    """The loop's variables."""

    t: tf.Tensor  # positions 0..t of every hypothesis are written
    alive_ids: tf.Tensor  # [batch, width, max_length]
    alive_scores: tf.Tensor  # [batch, width], best first
    state: Any  # the model's, rows b * width + w
    fin_ids: tf.Tensor  # [batch, width, max_length]
    fin_lengths: tf.Tensor  # [batch, width]
    fin_scores: tf.Tensor  # [batch, width], best first
    fin_log_probs: tf.Tensor  # [batch, width]
    fin_done: tf.Tensor  # [batch, width]: the slot holds a finished hypothesis
    live: tf.Tensor  # [batch]: the sequence can still improve
    all_ended: tf.Tensor  # scalar: every extension of the last step ended


def _gather_beams(values: tf.Tensor, beams: tf.Tensor) -> tf.Tensor:
    """``values[b, beams[b, i], ...]``: ``[batch, n, ...]`` from ``[batch, width, ...]``."""
    return tf.gather(values, beams, batch_dims=1)


def _ruled_out(scores: tf.Tensor, out: tf.Tensor, mask: float) -> tf.Tensor:
    """``scores`` plus ``mask`` where ``out``: -inf, or transformers' -1e9 added."""
    return tf.where(out, scores + mask, scores)


def _extend(model: Any, s: _Search, inputs: BeamInputs, settings: BeamSettings, constraints: Constraints,
            num_candidates: int) -> _Extensions:
    """One step from the alive hypotheses (``s.t + 1`` ids written): the ``num_candidates`` best extensions."""
    prompt_ids, prompt_lengths, max_length = inputs.prompt_ids, inputs.prompt_lengths, settings.max_length
    batch_size, width = s.alive_ids.shape[0], s.alive_ids.shape[1]
    vocab_size = int(model.vocab_size)
    logits, state = model.step(tf.reshape(s.alive_ids[:, :, s.t], [batch_size * width]), s.state)
    log_probs = tf.reshape(tf.nn.log_softmax(tf.cast(logits, tf.float32)), [batch_size, width, vocab_size])
    pos = s.t + 1
    log_probs = constraints.apply(log_probs, s.alive_ids, pos, prompt_lengths, max_length, settings.eos_id,
                                  inputs.min_new_tokens)
    in_prompt = pos < prompt_lengths  # [batch]
    forced = tf.one_hot(prompt_ids[:, pos], vocab_size, on_value=0.0, off_value=_NEG_INF)  # [batch, vocab]
    log_probs = tf.where(in_prompt[:, tf.newaxis, tf.newaxis], forced[:, tf.newaxis, :], log_probs)

    totals = tf.reshape(s.alive_scores[:, :, tf.newaxis] + log_probs, [batch_size, width * vocab_size])
    cand_log_probs, flat = tf.math.top_k(totals, k=num_candidates)  # [batch, cand]
    beams, tokens = flat // vocab_size, flat % vocab_size
    write = tf.equal(tf.range(max_length, dtype=tf.int32), pos)[tf.newaxis, tf.newaxis, :]  # [1, 1, max_length]
    cand_ids = tf.where(write, tokens[:, :, tf.newaxis], _gather_beams(s.alive_ids, beams))
    ends = (is_end(tokens, settings.eos_id) & tf.logical_not(in_prompt)[:, tf.newaxis]) | tf.equal(pos, max_length - 1)
    return _Extensions(pos, cand_log_probs, beams, tokens, cand_ids, ends, state)


def _finish(s: _Search, step: _Extensions, settings: BeamSettings, prompt_lengths: tf.Tensor) -> Tuple:
    """The finished set with this step's ended extensions merged in (those that may finish, of the sequences
    still open): ``(ids, lengths, scores, log_probs, done)``, best first."""
    width = settings.beam_width
    new_tokens = tf.maximum(step.pos + 1 - prompt_lengths, 1)  # [batch]
    scores = step.log_probs / settings.norm(new_tokens)[:, tf.newaxis]  # [batch, cand]
    finishing = step.ends
    if settings.scoring == "transformers":  # only the best width extensions may finish
        finishing &= (tf.range(tf.shape(step.ends)[1]) < width)[tf.newaxis, :]
    scores = _ruled_out(scores, tf.logical_not(finishing) | tf.logical_not(s.live)[:, tf.newaxis], settings.mask)
    fin_scores, keep = tf.math.top_k(tf.concat([s.fin_scores, scores], axis=1), k=width)  # [batch, width]
    lengths = tf.fill(tf.shape(step.tokens), step.pos + 1)
    return (_gather_beams(tf.concat([s.fin_ids, step.ids], axis=1), keep),
            _gather_beams(tf.concat([s.fin_lengths, lengths], axis=1), keep),
            fin_scores,
            _gather_beams(tf.concat([s.fin_log_probs, step.log_probs], axis=1), keep),
            _gather_beams(tf.concat([s.fin_done, finishing], axis=1), keep))


def _still_open(was_open: tf.Tensor, best: tf.Tensor, fin_scores: tf.Tensor, fin_done: tf.Tensor, pos: tf.Tensor,
                prompt_lengths: tf.Tensor, settings: BeamSettings) -> tf.Tensor:
    """bool `[batch]`: whether the best alive hypothesis (score ``best`` `[batch]`, ``pos + 1`` ids written) can
    still beat the worst finished one, as ``early_stopping`` bounds it."""
    if settings.early_stopping == "never":  # its log-probability only falls: the better end of its lengths
        soonest = tf.maximum(pos + 2 - prompt_lengths, 1)
        latest = tf.maximum(settings.max_length - prompt_lengths, 1)
        bound = tf.maximum(best / settings.norm(soonest), best / settings.norm(latest))
    else:  # transformers' heuristic: scored at its present length
        bound = best / settings.norm(tf.maximum(pos + 1 - prompt_lengths, 1))
    worst = tf.where(fin_done, tf.reduce_min(fin_scores, axis=1, keepdims=True), settings.mask)  # [batch, width]
    still = was_open & tf.reduce_any(bound[:, tf.newaxis] > worst, axis=1)
    if settings.early_stopping is True:  # done once width hypotheses finished
        still &= tf.logical_not(tf.reduce_all(fin_done, axis=1))
    return still


def _beam_search(model: Any, inputs: BeamInputs, settings: BeamSettings, constraints: Constraints,
                 condition: Any = None) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """The search; returns the finished set ``(ids, lengths, scores, log_probs)``, best first (``-inf``
    scores mark slots that no hypothesis filled)."""
    prompt_ids, prompt_lengths = inputs.prompt_ids, inputs.prompt_lengths
    batch_size, width, mask = prompt_ids.shape[0], settings.beam_width, settings.mask
    # Enough candidates that width of them do not end.
    num_candidates = min(max(2, 1 + len(settings.eos_id)) * width, width * int(model.vocab_size))

    def body(s: _Search) -> Tuple[_Search]:
        step = _extend(model, s, inputs, settings, constraints, num_candidates)
        # The best width extensions that did not end go on.
        alive_scores, survivors = tf.math.top_k(_ruled_out(step.log_probs, step.ends, mask), k=width)
        state = model.reorder_state(step.state, tf.reshape(
            tf.range(batch_size)[:, tf.newaxis] * width + _gather_beams(step.beams, survivors), [-1]))
        fin_ids, fin_lengths, fin_scores, fin_log_probs, fin_done = _finish(s, step, settings, prompt_lengths)
        still = _still_open(s.live, alive_scores[:, 0], fin_scores, fin_done, step.pos, prompt_lengths, settings)
        return (_Search(s.t + 1, _gather_beams(step.ids, survivors), alive_scores, state, fin_ids, fin_lengths,
                        fin_scores, fin_log_probs, fin_done, still, tf.reduce_all(step.ends)),)

    def not_done(s: _Search) -> tf.Tensor:
        return (s.t < settings.max_length - 1) & tf.reduce_any(s.live) & tf.logical_not(s.all_ended)

    alive_ids = tf.tile(prompt_ids[:, tf.newaxis, :], [1, width, 1])  # [batch, width, max_length]
    # Only beam 0 is live at the start, so the identical copies do not fill the beam.
    first_beam = tf.one_hot(tf.zeros([batch_size], tf.int32), width, on_value=0.0, off_value=mask)
    # A conditional model repeats each row's condition for its width hypotheses (rows b * width + w).
    state = model.initial_state(batch_size * width, settings.max_length,
                                **({} if condition is None else {"condition": condition}))
    start = _Search(tf.constant(0, tf.int32), alive_ids, first_beam, state, alive_ids,
                    tf.zeros([batch_size, width], tf.int32), tf.fill([batch_size, width], mask),
                    tf.zeros([batch_size, width]), tf.zeros([batch_size, width], tf.bool),
                    tf.ones([batch_size], tf.bool), tf.constant(False))
    with layouts.decode_layouts(model, settings.layouts):
        s = tf.while_loop(not_done, body, (start,))[0]
    return _results(s, prompt_lengths)


def _results(s: _Search, prompt_lengths: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """The finished set, unused slots at -inf; a sequence that finished nothing (the loop never ran: its
    prompt fills ``max_length``) answers with its alive hypotheses."""
    fin_scores = tf.where(s.fin_done, s.fin_scores, _NEG_INF)
    fin_log_probs = tf.where(s.fin_done, s.fin_log_probs, _NEG_INF)
    alive = tf.where(s.alive_scores <= _TRANSFORMERS_MASK, _NEG_INF, s.alive_scores)  # masked: unused
    empty = tf.logical_not(tf.reduce_any(s.fin_done, axis=1))  # [batch]
    prompt_only = tf.broadcast_to(prompt_lengths[:, tf.newaxis], tf.shape(s.fin_lengths))
    return (tf.where(empty[:, tf.newaxis, tf.newaxis], s.alive_ids, s.fin_ids),
            tf.where(empty[:, tf.newaxis], prompt_only, s.fin_lengths),
            tf.where(empty[:, tf.newaxis], alive, fin_scores),
            tf.where(empty[:, tf.newaxis], alive, fin_log_probs))


_BEAM_SEARCHES = compiled_forms(_beam_search)
