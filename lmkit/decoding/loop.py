"""``decode``: generation with any sampler, the one entry point.

:func:`decode` checks the arguments, pads the prompts
(:func:`~lmkit.decoding.prompts.prepare_prompts`) and hands them to the
sampler, whose :meth:`~lmkit.decoding.sampler.Sampler.generate` runs the
loop (beam search overrides it); see ``docs/generation.md``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from lmkit.decoding.prompts import DecodeResult, EndIds, prepare_prompts
from lmkit.decoding.sampler import Sampler
from lmkit.core.errors import UsageError

__all__ = ["decode"]


def decode(model: Any,
           max_length: int,
           sampler: Optional[Sampler] = None,
           *,
           batch_size: Optional[int] = None,
           prompts: Optional[Sequence[Sequence[int]]] = None,
           eos_id: EndIds = None,
           start_id: Optional[int] = None,
           pad_id: Optional[int] = None,
           seed: Optional[int] = None,
           use_cache: bool = True,
           compiled: bool = True,
           jit_compile: Optional[bool] = None,
           repetition_penalty: float = 1.0,
           min_new_tokens: Union[int, Sequence[int]] = 0,
           on_token: Optional[Callable[[np.ndarray, np.ndarray], None]] = None,
           condition: Any = None,
           rules: Any = None) -> DecodeResult:
    """Generates a batch of sequences with one sampler.

    Args:
      model: a language model following the protocol of ``docs/design.md``.
      max_length: length of every output row, prompt included.
      sampler: a :class:`~lmkit.decoding.sampler.Sampler` (default greedy),
        e.g. from :func:`lmkit.decoding.get_sampler`. A
        :class:`~lmkit.decoding.beam.BeamSampler` runs beam search
        (``seed`` and ``use_cache`` must then keep their defaults).
      batch_size: number of sequences when no prompts are given; must equal
        ``len(prompts)`` when both are given.
      prompts: one list of token ids per sequence, lengths may differ. Each is
        copied to the start of its output row and fed to the model before
        generation starts.
      eos_id: the token that ends a sequence (e.g. PTB's ``<eos>``), or a
        list of them (any one ends it: a Hugging Face model's end of text and
        end of turn); None generates exactly up to ``max_length``.
      start_id: a token put in front of every prompt (for example ``<eos>`` as a
        sentence boundary). Without prompts it is the whole prompt and defaults
        to (the first) ``eos_id``.
      pad_id: the token after the end of a sequence; defaults to (the first)
        ``eos_id``, or 0 when there is no ``eos_id``.
      seed: non-negative integer for the random samplers; the same seed gives
        the same output, compiled or not. None draws one (see
        :attr:`DecodeResult.seed`).
      use_cache: True feeds one token per step through ``model.step`` with the
        model state; False recomputes the whole prefix with ``model(prefix)``
        each step (slow; a reference for tests and benchmarks).
      compiled: run the loop inside ``tf.function`` (traced once per model,
        sampler and shape); False runs it eagerly, for debugging.
      jit_compile: compile the loop with XLA (default: whenever ``compiled``
        and ``use_cache``; several times faster, the same tokens). False keeps
        the plain ``tf.function``.
      repetition_penalty: > 0; a token already in the row (prompt included)
        has its positive logit divided by it and its negative one multiplied
        (CTRL's penalty, as ``transformers`` applies it); 1 turns it off.
      min_new_tokens: tokens generated before ``eos_id`` may be chosen (one
        value, or one per sequence).
      on_token: ``on_token(tokens, generated)`` after every step, on the host
        (streaming; the loop then runs without XLA).
      condition: what a conditional model generates from (an encoder-decoder's
        ``model.encode(source_ids, source_mask)``, one row per sequence), given
        to ``model.initial_state(..., condition=)`` and, without the cache, to
        ``model(ids, condition=)``; None for a language model.
      rules: a :class:`~lmkit.decoding.constraints.Constraints`: tokens no strategy may choose (no
        n-gram twice, a forced first or last token), as a model folder's ``generation_config.json``
        asks; None for none.

    Returns:
      A :class:`DecodeResult`.

    Raises:
      UsageError: inconsistent or out-of-range arguments, named in the message.
    """
    if sampler is None:
        from lmkit.decoding.samplers import GreedySampler
        sampler = GreedySampler()
    if not isinstance(sampler, Sampler):
        raise UsageError(f"sampler = {sampler!r} is not an lmkit.decoding Sampler; "
                         f"build one with lmkit.decoding.get_sampler(name, ...)")
    if rules is not None:
        from lmkit.decoding.constraints import Constraints
        if not isinstance(rules, Constraints):
            raise UsageError(f"rules = {rules!r} is not an lmkit.decoding.constraints.Constraints")
    prompt_ids, prompt_lengths, pad_id = prepare_prompts(
        model, max_length, batch_size=batch_size, prompts=prompts, eos_id=eos_id,
        start_id=start_id, pad_id=pad_id)
    if isinstance(repetition_penalty, bool) or not isinstance(repetition_penalty, (int, float)) \
            or not repetition_penalty > 0:
        raise UsageError(f"repetition_penalty = {repetition_penalty!r} must be a number > 0 (1 = off)")
    min_new = np.broadcast_to(np.asarray(min_new_tokens), prompt_lengths.shape) \
        if np.ndim(min_new_tokens) == 0 else np.asarray(min_new_tokens)
    if min_new.shape != prompt_lengths.shape or min_new.dtype.kind not in "iu" or np.any(min_new < 0):
        raise UsageError(f"min_new_tokens = {min_new_tokens!r} must be an integer >= 0, or one per sequence")
    extra: dict = {} if repetition_penalty == 1.0 and not np.any(min_new > 0) else dict(
        repetition_penalty=float(repetition_penalty), min_new_tokens=min_new.astype(np.int32))
    if on_token is not None:
        extra["on_token"] = on_token
    if condition is not None:
        extra["condition"] = condition
    if rules is not None and rules.active:
        extra["rules"] = rules
    return sampler.generate(model, prompt_ids, prompt_lengths, max_length=max_length, eos_id=eos_id,
                            pad_id=pad_id, seed=seed, use_cache=use_cache, compiled=compiled,
                            jit_compile=jit_compile, **extra)
