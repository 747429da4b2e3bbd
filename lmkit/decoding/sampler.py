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
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np
import tensorflow as tf

from lmkit.decoding.prompts import NO_EOS, DecodeResult, check_seed

__all__ = ["Sampler"]


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
          seed: int32 `[2]` seed for stateless random ops, already specific to
            this ``step``; deterministic samplers ignore it.

        Returns:
          int32 `[batch]` token ids.
        """
        raise NotImplementedError(f"{type(self).__name__} must override get_next_token")

    def generate(self, model: Any, prompt_ids: np.ndarray, prompt_lengths: np.ndarray, *,
                 max_length: int, eos_id: Optional[int], pad_id: int, seed: Optional[int],
                 use_cache: bool, compiled: bool) -> DecodeResult:
        """Runs the decode loop with this sampler (``lmkit.decoding.decode`` checks the arguments).

        Args:
          model: a language model following the protocol of ``docs/design.md``.
          prompt_ids: int32 `[batch, max_length]`, prompts padded with ``pad_id``.
          prompt_lengths: int32 `[batch]`.
          max_length: length of every output row, prompt included.
          eos_id: the token that ends a sequence, or None.
          pad_id: the token after the end of a sequence.
          seed: for the random samplers; None draws one.
          use_cache: feed one token per step through ``model.step`` (True) or
            recompute the prefix each step (False, a reference).
          compiled: run inside ``tf.function``.

        Returns:
          A :class:`DecodeResult`.
        """
        seed = check_seed(seed)
        loop = _decode_loop_compiled if compiled else _decode_loop
        ids, lengths, log_probs = loop(
            model, self, tf.constant(prompt_ids), tf.constant(prompt_lengths),
            tf.constant([seed, 0], tf.int64), max_length=max_length,
            eos_id=NO_EOS if eos_id is None else eos_id, pad_id=pad_id, use_cache=use_cache)
        return DecodeResult(ids=ids.numpy(), lengths=lengths.numpy(), prompt_lengths=prompt_lengths,
                            log_probs=log_probs.numpy(), seed=seed)

    def get_config(self) -> Dict[str, Any]:
        """The constructor arguments (for logs and equality)."""
        return {}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        if type(self) is not type(other):
            return False
        return self.get_config() == other.get_config()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(self.get_config().items()))))


def _decode_loop(model: Any,
                 sampler: "Sampler",
                 prompt_ids: tf.Tensor,
                 prompt_lengths: tf.Tensor,
                 seed: tf.Tensor,
                 *,
                 max_length: int,
                 eos_id: int,
                 pad_id: int,
                 use_cache: bool) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The per-token loop of :meth:`Sampler.generate`; compiled by ``_decode_loop_compiled``.

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
