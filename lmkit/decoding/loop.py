"""``decode``: token ids in, token ids out, with any sampler.

:func:`decode` checks the arguments, pads the prompts
(:func:`~lmkit.decoding.prompts.prepare_prompts`) and hands them to the
sampler, whose :meth:`~lmkit.decoding.sampler.Sampler.generate` runs the
loop (beam search overrides it); see ``docs/generation.md``. Its settings
travel in a :class:`~lmkit.decoding.config.GenerationConfig`, or as keywords
that override the config's fields, as ``transformers``' ``generate`` takes
them. Text in and out (tokenizers, stop strings, windows past the context,
encoder-decoders' sources) is :func:`lmkit.decoding.generate`.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from lmkit.core.errors import UsageError
from lmkit.decoding.config import GenerationConfig
from lmkit.decoding.constraints import Constraints
from lmkit.decoding.prompts import DecodeResult, PromptBatch, end_ids, prepare_prompts
from lmkit.decoding.registry import RULE_KEYS
from lmkit.decoding.sampler import OnToken, Sampler

__all__ = ["decode", "trace_count"]


def decode(model: Any,
           max_length: int,
           sampler: Optional[Sampler] = None,
           *,
           prompts: Optional[Sequence[Sequence[int]]] = None,
           batch_size: Optional[int] = None,
           condition: Any = None,
           rules: Optional[Constraints] = None,
           on_token: Optional[OnToken] = None,
           config: Optional[GenerationConfig] = None,
           **options: Any) -> DecodeResult:
    """Generates a batch of sequences with one sampler.

    Args:
      model: a language model following the protocol of ``docs/design.md``.
      max_length: length of every output row, prompt included.
      sampler: a :class:`~lmkit.decoding.sampler.Sampler`, e.g. from
        :func:`lmkit.decoding.get_sampler`; default the config's strategy, else greedy. A
        :class:`~lmkit.decoding.beam.BeamSampler` runs beam search (``seed`` and ``use_cache``
        must then keep their defaults).
      prompts: one list of token ids per sequence, lengths may differ. Each is
        copied to the start of its output row and fed to the model before
        generation starts.
      batch_size: number of sequences when no prompts are given; must equal
        ``len(prompts)`` when both are given.
      condition: what a conditional model generates from (an encoder-decoder's
        ``model.encode(source_ids, source_mask)``, one row per sequence), given
        to ``model.initial_state(..., condition=)`` and, without the cache, to
        ``model(ids, condition=)``; None for a language model.
      rules: a :class:`~lmkit.decoding.constraints.Constraints`: tokens no strategy may choose (no
        n-gram twice, a forced first or last token); default the config's rules on tokens.
      on_token: ``on_token(tokens, generated)`` after every step, on the host
        (streaming; the loop then runs without XLA).
      config: a :class:`~lmkit.decoding.config.GenerationConfig`. This reads its token ids
        (``eos_id``: the token that ends a sequence, or a list of them, any one ends it, None runs
        to ``max_length``; ``start_id``: put before every prompt, and without prompts the whole
        prompt, default the first ``eos_id``; ``pad_id``: after the end, default the first
        ``eos_id`` or 0), ``seed`` (None draws one, see :attr:`DecodeResult.seed`), ``use_cache``
        (False recomputes the whole prefix each step: a slow reference), ``compiled``
        (``tf.function``; False runs eagerly), ``jit_compile`` (XLA, by default whenever compiled
        and cached: the same tokens, several times faster), ``repetition_penalty`` (> 0, CTRL's,
        as ``transformers`` applies it; 1 = off) and ``min_new_tokens`` (tokens generated before an
        end may be chosen: one value, or one per sequence).
      **options: fields of the config given as keywords (``eos_id=0, seed=3``); they win over ``config``.

    Returns:
      A :class:`DecodeResult`.

    Raises:
      UsageError: inconsistent or out-of-range arguments, named in the message.
    """
    config = (config or GenerationConfig()).replace(**options)
    if sampler is None:
        if config.strategy is None:
            from lmkit.decoding.samplers import GreedySampler
            sampler = GreedySampler()
        else:
            sampler = config.sampler()
    if not isinstance(sampler, Sampler):
        raise UsageError(f"sampler = {sampler!r} is not an lmkit.decoding Sampler; "
                         f"build one with lmkit.decoding.get_sampler(name, ...)")
    if rules is None and any(key in config.given() for key in RULE_KEYS):
        rules = config.rules()
    if rules is not None and not isinstance(rules, Constraints):
        raise UsageError(f"rules = {rules!r} is not an lmkit.decoding.constraints.Constraints")
    prompt_ids, prompt_lengths, pad_id = prepare_prompts(
        model, max_length, batch_size=batch_size, prompts=prompts, eos_id=config.eos_id,
        start_id=config.start_id, pad_id=config.pad_id)
    penalty = 1.0 if config.repetition_penalty is None else config.repetition_penalty
    if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not penalty > 0:
        raise UsageError(f"repetition_penalty = {penalty!r} must be a number > 0 (1 = off)")
    min_new_tokens = 0 if config.min_new_tokens is None else config.min_new_tokens
    min_new = np.broadcast_to(np.asarray(min_new_tokens), prompt_lengths.shape) \
        if np.ndim(min_new_tokens) == 0 else np.asarray(min_new_tokens)
    if min_new.shape != prompt_lengths.shape or min_new.dtype.kind not in "iu" or np.any(min_new < 0):
        raise UsageError(f"min_new_tokens = {min_new_tokens!r} must be an integer >= 0, or one per sequence")
    batch = PromptBatch(prompt_ids, prompt_lengths, pad_id, end_ids(config.eos_id), min_new.astype(np.int32))
    return sampler.generate(model, batch, config, condition=condition,
                            rules=rules if rules is not None and rules.active else None, on_token=on_token)


def trace_count() -> int:
    """How many times the decode loops were traced (compiled) in this process (tests, benchmarks)."""
    from lmkit.decoding import beam, beam_hf, sampler
    loops = (sampler._decode_loop_compiled, sampler._decode_loop_xla, beam._beam_search_compiled,
             beam._beam_search_xla, beam_hf._beam_search_transformers_compiled,
             beam_hf._beam_search_transformers_xla)
    return sum(int(f.experimental_get_tracing_count()) for f in loops)
