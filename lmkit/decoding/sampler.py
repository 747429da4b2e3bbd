"""The sampler interface and the one per-token decode loop.

A :class:`Sampler` decides which token comes next from the model's logits
(:meth:`Sampler.get_next_token`, the one method a new strategy overrides, as
in KerasHub); :meth:`Sampler.generate` runs the loop that feeds tokens,
forces prompts, stops at ``<eos>`` and pads. A strategy that is not
per-token, such as beam search, overrides :meth:`Sampler.generate` instead.

Position ``t`` of the output is chosen from the logits the model returns after
reading positions ``0..t-1``. While ``t`` is inside a sequence's prompt the
token is forced to the prompt token, so prompts of different lengths share the
same path as generation; after the prompt the sampler picks the token. A
sequence finishes when it generates ``eos_id``; from then on it emits
``pad_id``, and the loop ends as soon as every sequence has finished. The
whole loop is one ``tf.while_loop`` inside one ``tf.function`` with fixed
shapes: the output buffer is pre-allocated at ``[batch, max_length]`` and the
model state (the RNN state or the transformer's key/value cache) is sized for
``max_length``. Softmax runs in float32.

With the cache (the default) the loop is compiled with XLA
(``jit_compile``): the whole loop becomes a few fused kernels instead of a
few hundred TensorFlow ops per token, and the key/value cache is updated in
place. Measured in ``docs/generation.md``: 5-8x more tokens/sec for the
transformer at batch 1, 2x for the LSTM, the same tokens and, for a fixed
seed, the same samples as without XLA (tested). Inputs keep one shape per
(batch size, max_length), so a second call with other prompts reuses the
compiled loop (``trace_count`` counts the traces).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

import numpy as np
import tensorflow as tf

from lmkit.core.xla import use_autograph
from lmkit.decoding.batch import DecodeResult, PromptBatch, check_seed
from lmkit.decoding.constraints import is_end
from lmkit.layers import layouts

__all__ = ["Sampler", "compiled_forms", "pick_loop"]

#: ``on_token(tokens, generated)``: a step's tokens and which rows generated theirs (NumPy ``[batch]``).
OnToken = Callable[[np.ndarray, np.ndarray], None]


class Sampler:
    """Picks the next token from logits; subclasses override :meth:`get_next_token`.

    Samplers are immutable settings objects: they hold no TensorFlow state, so
    one instance can be reused by any number of decode calls.
    """

    def get_next_token(self, logits: tf.Tensor, step: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        """Chooses one token per row.

        Args:
          logits: float32 `[batch, vocab]` unnormalised scores of the next token.
          step: int32 scalar, the position (0-based, prompt included) of the
            token being chosen.
          seed: int64 `[2]` seed (the run's seed, then the position), already specific to
            this ``step``; deterministic samplers ignore it.

        Returns:
          int32 `[batch]` token ids.
        """
        raise NotImplementedError(f"{type(self).__name__} must override get_next_token")

    def generate(self, model: Any, batch: PromptBatch, config: Any, *, condition: Any = None, rules: Any = None,
                 on_token: Optional[OnToken] = None) -> DecodeResult:
        """Runs the decode loop with this sampler (``lmkit.decoding.decode`` checks the arguments).

        Args:
          model: a language model following the protocol of ``docs/design.md``.
          batch: the padded prompts, their end and pad ids and ``min_new_tokens``.
          config: a :class:`~lmkit.decoding.config.GenerationConfig`; this reads its ``seed`` (None
            draws one), ``use_cache`` (True feeds one token per step through ``model.step``, after
            :func:`prefill_length` tokens of every prompt in one pass; False recomputes the prefix
            each step, a reference), ``compiled`` (``tf.function``),
            ``jit_compile`` (XLA; None: when compiled and cached, as the uncached reference grows
            its input every step) and ``repetition_penalty`` (a positive logit of every token already
            in the row, prompt included, divided by it, a negative one multiplied, before the sampler
            sees it: CTRL's penalty as ``transformers`` applies it; 1 = off).
          condition: an encoder-decoder's encoded sources (``model.initial_state(..., condition=)``).
          rules: a :class:`~lmkit.decoding.constraints.Constraints` (tokens the sampler may not
            choose), or None.
          on_token: called on the host after every step with the step's tokens and whether each row
            generated its token (NumPy ``[batch]`` int32 and bool): streaming. It runs the loop
            without XLA (a host callback cannot be compiled) and waits for each token.

        Returns:
          A :class:`DecodeResult`.
        """
        seed = check_seed(config.seed)
        jit_compile = config.jit_compile
        if on_token is not None:
            if jit_compile:
                from lmkit.core.errors import UsageError
                raise UsageError("on_token (streaming) runs the loop without XLA; leave jit_compile unset")
            jit_compile = False
        use_cache, compiled = config.use_cache is not False, config.compiled is not False
        loop = pick_loop(_decode_loop, _DECODE_LOOPS, compiled, use_cache, jit_compile,
                         autograph=use_autograph(model, self))
        penalty = 1.0 if config.repetition_penalty is None else float(config.repetition_penalty)
        prefill = prefill_length(model, batch.lengths, use_cache, condition, batch.max_length)
        settings = _LoopSettings(batch.max_length, batch.ends, batch.pad_id, use_cache, penalty, batch.holds_ends,
                                 prefill, layouts.pays(uses_xla(jit_compile, use_cache, compiled),
                                                               batch.max_length - 1 - prefill))
        min_new = np.zeros(len(batch.lengths), np.int32) if batch.min_new_tokens is None else batch.min_new_tokens
        ids, lengths, log_probs = loop(
            model, self.canonical(), tf.constant(batch.ids), tf.constant(batch.lengths),
            tf.constant([seed, 0], tf.int64), tf.constant(np.asarray(min_new, np.int32)), settings,
            on_token=on_token, condition=condition, rules=rules)
        return DecodeResult(ids=ids.numpy(), lengths=lengths.numpy(), prompt_lengths=batch.lengths,
                            log_probs=log_probs.numpy(), seed=seed)

    def get_config(self) -> Dict[str, Any]:
        """The constructor arguments (for logs and equality)."""
        return {}

    def canonical(self) -> "Sampler":
        """The first sampler of this type and settings seen in this process.

        ``tf.function`` keys its traces on the sampler object, not on its
        settings; passing the canonical one lets a new ``get_sampler(...)``
        per call reuse the compiled loop.
        """
        key = (type(self), tuple(sorted(self.get_config().items())))
        return _CANONICAL.setdefault(key, self)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        if type(self) is not type(other):
            return False
        return self.get_config() == other.get_config()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(self.get_config().items()))))


class _LoopSettings(NamedTuple):
    """The Python settings of one traced decode loop (``tf.function`` keys its traces on their values)."""

    max_length: int  # every output row's length
    eos_id: Tuple[int, ...]  # the ids that end a row
    pad_id: int  # the token after a row's end
    use_cache: bool  # one token a step through model.step (False: the whole prefix again)
    repetition_penalty: float  # 1: off
    hold_eos: bool  # some row must generate min_new_tokens before an end
    prefill: int = 0  # leading prompt tokens of every row fed in one teacher-forced call (0: none)
    layouts: bool = False  # in lmkit.layers.layouts.decode_layouts (XLA on a CPU)


def _decode_loop(model: Any, sampler: "Sampler", prompt_ids: tf.Tensor, prompt_lengths: tf.Tensor, seed: tf.Tensor,
                 min_new_tokens: tf.Tensor, settings: _LoopSettings, *, on_token: Optional[OnToken] = None,
                 condition: Any = None, rules: Any = None) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The per-token loop of :meth:`Sampler.generate`; compiled by ``_decode_loop_compiled``.

    Returns:
      ``(ids [batch, max_length], lengths [batch], log_probs [batch])``.
    """
    max_length, eos_id, pad_id = settings.max_length, settings.eos_id, settings.pad_id
    batch_size = prompt_ids.shape[0]
    vocab_size = int(model.vocab_size)
    positions = tf.range(max_length, dtype=tf.int32)  # [max_length]
    conditioned = {} if condition is None else {"condition": condition}  # an encoder-decoder's source
    state = model.initial_state(batch_size, max_length, **conditioned) if settings.use_cache else ()
    penalize = settings.repetition_penalty != 1.0
    # The tokens each row holds so far (for the repetition penalty), carried through the loop.
    seen = tf.zeros([batch_size, vocab_size if penalize else 0], tf.bool)
    state, seen, start = _prefill(model, prompt_ids, prompt_lengths, state, seen, settings.prefill)

    def not_done(t, ids, state, finished, lengths, log_probs, seen):
        del ids, state, lengths, log_probs, seen
        return tf.logical_and(t < max_length - 1, tf.logical_not(tf.reduce_all(finished)))

    def body(t, ids, state, finished, lengths, log_probs, seen):
        inputs = ids[:, t]  # [batch]
        if settings.use_cache:
            logits, state = model.step(inputs, state)  # [batch, vocab]
        else:
            all_logits, _ = model(ids[:, :t + 1], training=False, **conditioned)  # [batch, t + 1, vocab]
            logits = all_logits[:, -1]  # [batch, vocab]
        logits = tf.cast(logits, tf.float32)
        pos = t + 1  # the position being chosen
        if penalize:
            seen = tf.logical_or(seen, tf.cast(tf.one_hot(inputs, vocab_size), tf.bool))  # [batch, vocab]
        # What the sampler sees; log_probs stay the model's own.
        choice = _allowed(logits, seen, ids, pos, prompt_lengths, min_new_tokens, settings, rules)
        # The position in the seed's second word: plain integers, the same compiled or not
        # (stateless_fold_in is a random op, and under XLA it gives other seeds for seeds >= 2^32).
        step_seed = tf.stack([seed[0], seed[1] + tf.cast(pos, tf.int64)])
        sampled = tf.cast(sampler.get_next_token(choice, pos, step_seed), tf.int32)  # [batch]
        in_prompt = pos < prompt_lengths  # [batch]
        generated = tf.logical_and(tf.logical_not(in_prompt), tf.logical_not(finished))  # [batch]
        token = tf.where(in_prompt, ids[:, pos], tf.where(finished, pad_id, sampled))  # [batch]
        token_log_prob = tf.gather(tf.nn.log_softmax(logits), token, batch_dims=1)  # [batch]
        log_probs += tf.where(generated, token_log_prob, 0.0)
        lengths = tf.where(generated, pos + 1, lengths)
        finished = tf.logical_or(finished, tf.logical_and(generated, is_end(token, eos_id)))
        if on_token is not None:  # streaming: hand the step's tokens to the host before going on
            token = _after_callback(on_token, token, generated)
        # Writing one column through a mask keeps the buffer's shape fixed.
        ids = tf.where(tf.equal(positions, pos)[tf.newaxis, :], token[:, tf.newaxis], ids)
        return t + 1, ids, state, finished, lengths, log_probs, seen

    loop_vars = (start, prompt_ids, state,
                 tf.zeros([batch_size], tf.bool), prompt_lengths, tf.zeros([batch_size], tf.float32), seen)
    with layouts.decode_layouts(model, settings.layouts):
        _, ids, _, _, lengths, log_probs, _ = tf.while_loop(not_done, body, loop_vars)
    return ids, lengths, log_probs


def _prefill(model: Any, prompt_ids: tf.Tensor, prompt_lengths: tf.Tensor, state: Any, seen: tf.Tensor,
             length: int) -> Tuple[Any, tf.Tensor, tf.Tensor]:
    """``(state, seen, start)`` after the prompts' first ``length`` tokens in one teacher-forced pass (matrix
    products, as transformers' prefill): the loop goes on from position ``start``, and ``seen`` (the
    repetition penalty's, when kept) holds the tokens before it.

    A cache of positions goes back to the shortest prompt's last token: the window's padding past it (up to
    a multiple of :data:`PREFILL_MULTIPLE`) is written again, a token a step, before any query sees it.
    """
    start = tf.constant(length, tf.int32)
    if not length:
        return state, seen, start
    _, state = model(prompt_ids[:, :length], state, training=False)
    if positional(state):
        start = tf.minimum(tf.reduce_min(prompt_lengths) - 1, length)
        state = state._replace(positions=tf.fill(tf.shape(state.positions), start))
    if seen.shape[-1]:  # the repetition penalty is on
        fed = (tf.range(length) < start)[tf.newaxis, :, tf.newaxis]  # [1, length, 1]
        seen = tf.reduce_any(tf.logical_and(tf.cast(tf.one_hot(prompt_ids[:, :length], seen.shape[-1]), tf.bool),
                                            fed), axis=1)
    return state, seen, start


def positional(state: Any) -> bool:
    """Whether ``state`` is a cache of positions (``positions`` [batch], a NamedTuple: a transformer's)."""
    return hasattr(state, "positions") and hasattr(state, "_replace")


def _allowed(logits: tf.Tensor, seen: tf.Tensor, ids: tf.Tensor, pos: tf.Tensor, prompt_lengths: tf.Tensor,
             min_new_tokens: tf.Tensor, settings: _LoopSettings, rules: Any) -> tf.Tensor:
    """float32 `[batch, vocab]` ``logits`` as the sampler sees them at position ``pos``: the repetition
    penalty on the ``seen`` tokens, the end ids held back before ``min_new_tokens``, the ``rules``."""
    choice = logits
    penalty = settings.repetition_penalty
    if penalty != 1.0:
        choice = tf.where(seen, tf.where(choice > 0, choice / penalty, choice * penalty), choice)
    if settings.hold_eos:
        early = (pos - prompt_lengths) < min_new_tokens  # [batch]
        ends = is_end(tf.range(tf.shape(logits)[-1]), settings.eos_id)  # [vocab]
        choice = tf.where(tf.logical_and(early[:, tf.newaxis], ends[tf.newaxis, :]), -1e30, choice)
    if rules is not None:  # forbidden tokens at -inf (one hypothesis a row)
        choice = rules.apply(choice[:, tf.newaxis], ids[:, tf.newaxis], pos, prompt_lengths, settings.max_length,
                             settings.eos_id)[:, 0]
    return choice


def _after_callback(on_token: OnToken, token: tf.Tensor, generated: tf.Tensor) -> tf.Tensor:
    """``token``, once ``on_token`` has seen the step on the host (the next step depends on it having run)."""
    def call(token, generated):
        on_token(token.numpy(), generated.numpy())
        return np.int32(0)
    done = tf.reshape(tf.py_function(call, [token, generated], tf.int32), [])  # 0
    return token + done


_CANONICAL: Dict[Any, Sampler] = {}  # (type, settings) -> the sampler object the traces are keyed on


PREFILL_MULTIPLE = 8  # prefill lengths are multiples of this: few traces across prompt lengths


def prefill_length(model: Any, prompt_lengths: np.ndarray, use_cache: bool, condition: Any,
                   max_length: Optional[int] = None) -> int:
    """How many leading prompt tokens of every row the cached loop feeds in one teacher-forced call.

    The rest of the prompts go one token a step. For lmkit's decoder-only models (their ``model(ids,
    state)`` extends the cache, ``docs/design.md``), a multiple of :data:`PREFILL_MULTIPLE` (few traces
    across prompt lengths) when the shortest prompt has that many tokens before its last (its last token
    gives the first new one): for a cache of positions the next multiple at or past them, which the loop
    then rewinds (at most ``max_length``); for another state (an RNN's) the one below them. 0 otherwise:
    shorter prompts (one trace for them all), no cache, an encoder-decoder's condition, or a model from
    outside lmkit, whose call may not take a state.
    """
    if not use_cache or condition is not None or use_autograph(model) or len(prompt_lengths) == 0:
        return 0
    before_last = int(np.min(prompt_lengths)) - 1
    below = before_last // PREFILL_MULTIPLE * PREFILL_MULTIPLE
    padded = -(-before_last // PREFILL_MULTIPLE) * PREFILL_MULTIPLE
    if below and (max_length is None or padded <= max_length) and _positional_model(model):
        return padded
    return below


_POSITIONAL: Dict[type, bool] = {}  # model class -> whether its state is a cache of positions


def _positional_model(model: Any) -> bool:
    """Whether ``model``'s decoding state is a cache of positions (asked once per model class)."""
    kind = type(model)
    if kind not in _POSITIONAL:
        try:
            _POSITIONAL[kind] = positional(model.initial_state(1, 1))
        except Exception:  # noqa: BLE001 (a state that needs more: the safe answer)
            _POSITIONAL[kind] = False
    return _POSITIONAL[kind]


def compiled_forms(loop: Any) -> Dict[Tuple[bool, bool], Any]:
    """``{(jit_compile, autograph): tf.function(loop)}``: the traced forms of a decode loop.

    lmkit's models and samplers trace without AutoGraph (:func:`lmkit.core.xla.use_autograph`); a user's
    model or sampler, which may branch on tensors in Python, keeps it.
    """
    return {(jit, autograph): tf.function(loop, jit_compile=jit, autograph=autograph)
            for jit in (False, True) for autograph in (False, True)}


def uses_xla(jit_compile: Optional[bool], use_cache: bool, compiled: bool = True) -> bool:
    """Whether a decode loop compiles with XLA: ``jit_compile``, or when None, whenever compiled with the cache."""
    return bool(compiled and use_cache) if jit_compile is None else bool(jit_compile)


def pick_loop(eager: Any, forms: Dict[Tuple[bool, bool], Any], compiled: bool, use_cache: bool,
              jit_compile: Optional[bool], autograph: bool = True) -> Any:
    """The loop to run: eager, one of ``forms`` (:func:`compiled_forms`), compiled with XLA by default with
    the cache.

    Raises:
      UsageError: XLA asked for without ``compiled`` or without the cache.
    """
    jit_compile = uses_xla(jit_compile, use_cache, compiled)
    if jit_compile and not (compiled and use_cache):
        from lmkit.core.errors import UsageError
        raise UsageError("jit_compile=True needs compiled=True and use_cache=True (the uncached reference "
                         "grows its input every step, which XLA cannot compile once)")
    return forms[(bool(jit_compile), bool(autograph))] if compiled else eager


# The model and sampler are Python arguments: TensorFlow traces once per model
# object, sampler object and shape, and drops the trace when they die.
_DECODE_LOOPS = compiled_forms(_decode_loop)
