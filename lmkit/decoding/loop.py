"""``decode``: token ids in, token ids out, with any sampler.

:func:`decode` pads the prompts (:func:`~lmkit.decoding.batch.prepare_prompts`)
and hands them to the sampler, whose
:meth:`~lmkit.decoding.sampler.Sampler.generate` runs the loop (beam search
overrides it); see ``docs/generation.md``. Its settings travel in a
:class:`~lmkit.decoding.config.GenerationConfig`, or as keywords that
override the config's fields, as ``transformers``' ``generate`` takes them.
Text in and out (tokenizers, stop strings, windows past the context,
encoder-decoders' sources) is :func:`lmkit.decoding.generate`.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from lmkit.core.errors import UsageError
from lmkit.decoding.batch import DecodeResult, PromptBatch, end_ids, prepare_prompts
from lmkit.decoding.config import GenerationConfig
from lmkit.decoding.constraints import Constraints
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
      sampler: a :class:`~lmkit.decoding.sampler.Sampler` (:func:`lmkit.decoding.get_sampler`); default the
        config's strategy, else greedy. A :class:`~lmkit.decoding.beam.BeamSampler` runs beam search.
      prompts: one list of token ids per sequence (lengths may differ), copied to the start of its row.
      batch_size: number of sequences when no prompts are given.
      condition: an encoder-decoder's ``model.encode(source_ids, source_mask)``, one row per sequence.
      rules: a :class:`~lmkit.decoding.constraints.Constraints` (default the config's rules on tokens).
      on_token: ``on_token(tokens, generated)`` after every step, on the host (streaming; no XLA then).
      config: a :class:`~lmkit.decoding.config.GenerationConfig`; this reads ``eos_id`` (one id or several,
        None runs to ``max_length``), ``start_id`` (before every prompt; without prompts the whole prompt,
        default the first ``eos_id``), ``pad_id`` (after the end; default the first ``eos_id`` or 0),
        ``seed`` (None draws one), ``use_cache``, ``compiled``, ``jit_compile``, ``repetition_penalty`` and
        ``min_new_tokens`` (one value, or one per sequence).
      **options: fields of the config as keywords (``eos_id=0, seed=3``); they win over ``config``.

    Returns:
      A :class:`~lmkit.decoding.batch.DecodeResult` (beam search: a ``BeamSearchResult``).

    Raises:
      UsageError: inconsistent or out-of-range arguments, named in the message.
    """
    config = (config or GenerationConfig()).replace(**options)
    sampler = _sampler(sampler, config)
    if rules is None and any(key in config.given() for key in RULE_KEYS):
        rules = config.rules()
    if rules is not None and not isinstance(rules, Constraints):
        raise UsageError(f"rules = {rules!r} is not an lmkit.decoding.constraints.Constraints")
    prompt_ids, prompt_lengths, pad_id = prepare_prompts(
        model, max_length, batch_size=batch_size, prompts=prompts, eos_id=config.eos_id,
        start_id=config.start_id, pad_id=config.pad_id)
    min_new_tokens = 0 if config.min_new_tokens is None else config.min_new_tokens
    min_new = np.asarray(min_new_tokens)
    if min_new.ndim == 0:
        min_new = np.broadcast_to(min_new, prompt_lengths.shape)
    if min_new.shape != prompt_lengths.shape:
        raise UsageError(f"min_new_tokens = {min_new_tokens!r} must be one integer >= 0, or one per sequence "
                         f"({len(prompt_lengths)})")
    batch = PromptBatch(prompt_ids, prompt_lengths, pad_id, end_ids(config.eos_id), min_new.astype(np.int32))
    return sampler.generate(model, batch, config, condition=condition,
                            rules=rules if rules is not None and rules.active else None, on_token=on_token)


def _sampler(sampler: Any, config: GenerationConfig) -> Sampler:
    """``sampler``, else the config's strategy, else greedy."""
    if sampler is None:
        if config.strategy is None:
            from lmkit.decoding.samplers import GreedySampler
            return GreedySampler()
        return config.sampler()
    if not isinstance(sampler, Sampler):
        raise UsageError(f"sampler = {sampler!r} is not an lmkit.decoding Sampler; "
                         f"build one with lmkit.decoding.get_sampler(name, ...)")
    return sampler


def trace_count() -> int:
    """How many times the decode loops were traced (compiled) in this process (tests, benchmarks)."""
    from lmkit.decoding import beam, sampler
    loops = (*sampler._DECODE_LOOPS.values(), *beam._BEAM_SEARCHES.values())
    return sum(int(f.experimental_get_tracing_count()) for f in loops)
