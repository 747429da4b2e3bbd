"""The decode loop shared by every per-token sampler.

:func:`decode` runs any model that follows the language-model protocol of
``docs/design.md`` (``initial_state``, ``step``, ``__call__``, ``vocab_size``)
and any :class:`~lmkit.decoding.samplers.Sampler`. The whole loop is one
``tf.while_loop`` inside one ``tf.function`` with fixed shapes: the output
buffer is pre-allocated at ``[batch, max_length]`` and the model state (the
RNN state or the transformer's key/value cache) is sized for ``max_length``.

Position ``t`` of the output is chosen from the logits the model returns after
reading positions ``0..t-1``. While ``t`` is inside a sequence's prompt the
token is forced to the prompt token, so prompts of different lengths share the
same path as generation; after the prompt the sampler picks the token. A
sequence finishes when it generates ``eos_id``; from then on it emits
``pad_id``, and the loop ends as soon as every sequence has finished.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from lmkit.decoding import samplers as samplers_lib

__all__ = ["DecodeResult", "decode"]

_NO_EOS = -1  # stands in for eos_id = None: no token id is negative


# eq=False: the fields are arrays, which have no single truth value.
@dataclasses.dataclass(frozen=True, eq=False)
class DecodeResult:
    """Output of :func:`decode` (NumPy arrays).

    Attributes:
      ids: int32 `[batch, max_length]`, prompt then generated tokens, then
        ``pad_id`` after ``<eos>``.
      lengths: int32 `[batch]`, tokens before the padding (prompt and the
        ``<eos>`` included).
      prompt_lengths: int32 `[batch]`, tokens of ``ids`` that came from the prompt.
      log_probs: float32 `[batch]`, the model's log-probability of the generated
        tokens (not the prompt), from the untempered softmax.
      seed: the seed used (drawn at random when none was given), so a sampled
        output can be reproduced; None for beam search.
    """

    ids: np.ndarray
    lengths: np.ndarray
    prompt_lengths: np.ndarray
    log_probs: np.ndarray
    seed: Optional[int]

    def sequences(self, include_prompt: bool = True) -> List[List[int]]:
        """The unpadded sequences as lists of ids."""
        out = []
        for row, length, start in zip(self.ids, self.lengths, self.prompt_lengths):
            out.append(row[0 if include_prompt else start:length].tolist())
        return out


def decode(model: Any,
           max_length: int,
           sampler: Optional[Union[samplers_lib.Sampler, samplers_lib.BeamSampler]] = None,
           *,
           batch_size: Optional[int] = None,
           prompts: Optional[Sequence[Sequence[int]]] = None,
           eos_id: Optional[int] = None,
           start_id: Optional[int] = None,
           pad_id: Optional[int] = None,
           seed: Optional[int] = None,
           use_cache: bool = True,
           compiled: bool = True) -> DecodeResult:
    """Generates a batch of sequences with one sampler.

    Args:
      model: a language model following the protocol of ``docs/design.md``.
      max_length: length of every output row, prompt included.
      sampler: a :class:`Sampler` (default greedy). A :class:`BeamSampler` is
        handed to :func:`lmkit.decoding.beam_search` with the same arguments
        (``seed`` and ``use_cache`` must keep their defaults).
      batch_size: number of sequences when no prompts are given; must equal
        ``len(prompts)`` when both are given.
      prompts: one list of token ids per sequence, lengths may differ. Each is
        copied to the start of its output row and fed to the model before
        generation starts.
      eos_id: the token that ends a sequence (e.g. PTB's ``<eos>``); None
        generates exactly up to ``max_length``.
      start_id: a token put in front of every prompt (for example ``<eos>`` as a
        sentence boundary). Without prompts it is the whole prompt and defaults
        to ``eos_id``.
      pad_id: the token after the end of a sequence; defaults to ``eos_id``,
        or 0 when there is no ``eos_id``.
      seed: non-negative integer for the random samplers; the same seed gives
        the same output, compiled or not. None draws one (see
        :attr:`DecodeResult.seed`).
      use_cache: True feeds one token per step through ``model.step`` with the
        model state; False recomputes the whole prefix with ``model(prefix)``
        each step (slow; a reference for tests and benchmarks).
      compiled: run the loop inside ``tf.function`` (traced once per model,
        sampler and shape); False runs it eagerly, for debugging.

    Returns:
      A :class:`DecodeResult`.

    Raises:
      ValueError: inconsistent or out-of-range arguments, named in the message.
    """
    if isinstance(sampler, samplers_lib.BeamSampler):
        if seed is not None or not use_cache:
            raise ValueError("beam search is deterministic and always uses the cache; "
                             "drop seed and use_cache when sampler is a BeamSampler")
        from lmkit.decoding.beam_search import beam_search  # the beam module imports this one
        return beam_search(model, max_length, beam_width=sampler.beam_width,
                           length_penalty=sampler.length_penalty, batch_size=batch_size,
                           prompts=prompts, eos_id=eos_id, start_id=start_id, pad_id=pad_id,
                           compiled=compiled)
    if sampler is None:
        sampler = samplers_lib.GreedySampler()
    if not isinstance(sampler, samplers_lib.Sampler):
        raise ValueError(f"sampler = {sampler!r} is not an lmkit.decoding Sampler; "
                         f"build one with lmkit.decoding.get_sampler(name, ...)")
    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**63:
        raise ValueError(f"seed = {seed!r} must be an integer in [0, 2**63)")
    prompt_ids, prompt_lengths, pad_id = prepare_prompts(
        model, max_length, batch_size=batch_size, prompts=prompts, eos_id=eos_id,
        start_id=start_id, pad_id=pad_id)
    loop = _decode_loop_compiled if compiled else _decode_loop
    ids, lengths, log_probs = loop(
        model, sampler, tf.constant(prompt_ids), tf.constant(prompt_lengths),
        tf.constant([int(seed), 0], tf.int64), max_length=max_length,
        eos_id=_NO_EOS if eos_id is None else eos_id, pad_id=pad_id, use_cache=use_cache)
    return DecodeResult(ids=ids.numpy(), lengths=lengths.numpy(), prompt_lengths=prompt_lengths,
                        log_probs=log_probs.numpy(), seed=int(seed))


def prepare_prompts(model: Any,
                    max_length: int,
                    *,
                    batch_size: Optional[int],
                    prompts: Optional[Sequence[Sequence[int]]],
                    eos_id: Optional[int],
                    start_id: Optional[int],
                    pad_id: Optional[int]) -> Tuple[np.ndarray, np.ndarray, int]:
    """Checks the decoding arguments and pads the prompts into one array.

    Returns:
      ``(prompt_ids, prompt_lengths, pad_id)``: int32 `[batch, max_length]`
      prompts padded with ``pad_id``, int32 `[batch]` their lengths, and the
      resolved ``pad_id``.

    Raises:
      ValueError: naming the bad argument.
    """
    vocab_size = int(model.vocab_size)

    def check_id(name: str, value: Optional[int]) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < vocab_size:
            raise ValueError(f"{name} = {value!r} is not a token id of the model "
                             f"(vocab_size {vocab_size}); use an id in [0, {vocab_size})")

    check_id("eos_id", eos_id)
    check_id("start_id", start_id)
    check_id("pad_id", pad_id)
    if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or max_length < 1:
        raise ValueError(f"max_length = {max_length!r} must be an integer >= 1")
    if pad_id is None:
        pad_id = 0 if eos_id is None else eos_id

    if prompts is None:
        if batch_size is None:
            raise ValueError("give batch_size or prompts")
        first = eos_id if start_id is None else start_id
        if first is None:
            raise ValueError("without prompts every sequence needs a first token; "
                             "pass start_id (or eos_id, which is then used as the start)")
        rows = [[first]] * int(batch_size)
    else:
        if isinstance(prompts, (str, bytes)) or any(isinstance(p, (int, np.integer)) for p in prompts):
            raise ValueError("prompts must be a list of token-id lists, one per sequence; "
                             "wrap a single prompt: prompts=[[...]]")
        rows = [([] if start_id is None else [start_id]) + [int(i) for i in p] for p in prompts]
        if batch_size is not None and batch_size != len(rows):
            raise ValueError(f"batch_size = {batch_size} but {len(rows)} prompts were given; "
                             f"drop batch_size or pass one prompt per sequence")
        for b, row in enumerate(rows):
            if not row:
                raise ValueError(f"prompt {b} is empty; give it a first token or pass start_id")
            if len(row) > max_length:
                raise ValueError(f"prompt {b} has {len(row)} tokens (start_id included), more than "
                                 f"max_length = {max_length}; raise max_length")
            for i in row:
                check_id(f"prompt {b} token", i)
    if not rows:
        raise ValueError(f"batch_size = {len(rows)} must be >= 1")
    prompt_ids = np.full((len(rows), max_length), pad_id, dtype=np.int32)
    for b, row in enumerate(rows):
        prompt_ids[b, :len(row)] = row
    prompt_lengths = np.array([len(r) for r in rows], dtype=np.int32)
    return prompt_ids, prompt_lengths, int(pad_id)


def _decode_loop(model: Any,
                 sampler: samplers_lib.Sampler,
                 prompt_ids: tf.Tensor,
                 prompt_lengths: tf.Tensor,
                 seed: tf.Tensor,
                 *,
                 max_length: int,
                 eos_id: int,
                 pad_id: int,
                 use_cache: bool) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The loop body of :func:`decode`; compiled by ``_decode_loop_compiled``.

    Returns:
      ``(ids [batch, max_length], lengths [batch], log_probs [batch])``.
    """
    batch_size = prompt_ids.shape[0]
    positions = tf.range(max_length, dtype=tf.int32)  # [max_length]
    state = model.initial_state(batch_size, max_length) if use_cache else ()

    def not_done(t, ids, state, finished, lengths, log_probs):
        del ids, state, lengths, log_probs
        return tf.logical_and(t < max_length - 1, tf.logical_not(tf.reduce_all(finished)))

    def body(t, ids, state, finished, lengths, log_probs):
        inputs = ids[:, t]  # [batch]
        if use_cache:
            logits, state = model.step(inputs, state)  # [batch, vocab]
        else:
            all_logits, _ = model(ids[:, :t + 1], training=False)  # [batch, t + 1, vocab]
            logits = all_logits[:, -1]  # [batch, vocab]
        logits = tf.cast(logits, tf.float32)
        pos = t + 1  # the position being chosen
        step_seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(pos, tf.int64))
        sampled = tf.cast(sampler.get_next_token(logits, pos, step_seed), tf.int32)  # [batch]
        in_prompt = pos < prompt_lengths  # [batch]
        generated = tf.logical_and(tf.logical_not(in_prompt), tf.logical_not(finished))  # [batch]
        token = tf.where(in_prompt, ids[:, pos], tf.where(finished, pad_id, sampled))  # [batch]
        token_log_prob = tf.gather(tf.nn.log_softmax(logits), token, batch_dims=1)  # [batch]
        log_probs += tf.where(generated, token_log_prob, 0.0)
        lengths = tf.where(generated, pos + 1, lengths)
        finished = tf.logical_or(finished, tf.logical_and(generated, tf.equal(token, eos_id)))
        # Writing one column through a mask keeps the buffer's shape fixed.
        ids = tf.where(tf.equal(positions, pos)[tf.newaxis, :], token[:, tf.newaxis], ids)
        return t + 1, ids, state, finished, lengths, log_probs

    loop_vars = (tf.constant(0, tf.int32), prompt_ids, state,
                 tf.zeros([batch_size], tf.bool), prompt_lengths, tf.zeros([batch_size], tf.float32))
    _, ids, _, _, lengths, log_probs = tf.while_loop(not_done, body, loop_vars)
    return ids, lengths, log_probs


# The model and sampler are Python arguments: TensorFlow traces once per model
# object, sampler object and shape, and drops the trace when they die.
_decode_loop_compiled = tf.function(_decode_loop)
