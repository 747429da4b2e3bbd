"""The per-token strategies: greedy, sampling, top-k and top-p.

Each overrides only :meth:`lmkit.decoding.sampler.Sampler.get_next_token`;
feeding tokens, prompts, `<eos>`, padding and the model state live in the
one decode loop of :class:`~lmkit.decoding.sampler.Sampler`. Register a new
strategy in ``lmkit.decoding.registry.SAMPLERS``.

Random samplers are reproducible: they draw with stateless random ops whose
seed is derived from the decode seed and the position being generated, so the
same seed gives the same tokens eagerly and inside ``tf.function``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import tensorflow as tf

from lmkit.decoding.checks import check_setting
from lmkit.decoding.sampler import Sampler

__all__ = ["GreedySampler", "RandomSampler", "TopKSampler", "TopPSampler"]


def _check_temperature(temperature: float) -> float:
    return float(check_setting("temperature", temperature))


class GreedySampler(Sampler):
    """Always the most likely token (the lowest id on ties)."""

    def get_next_token(self, logits: tf.Tensor, step: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        del step, seed  # greedy needs neither
        return tf.argmax(tf.cast(logits, tf.float32), axis=-1, output_type=tf.int32)  # [batch]


class RandomSampler(Sampler):
    """Samples from the full softmax distribution of ``logits / temperature``.

    Args:
      temperature: > 0; below 1 sharpens the distribution, above 1 flattens it.
    """

    def __init__(self, temperature: float = 1.0) -> None:
        self.temperature = _check_temperature(temperature)

    def get_config(self) -> Dict[str, Any]:
        return {"temperature": self.temperature}

    def get_next_token(self, logits: tf.Tensor, step: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        del step  # the seed is already specific to the step
        # Float32 so low-precision logits do not saturate after the division.
        scaled = tf.cast(logits, tf.float32) / self.temperature  # [batch, vocab]
        return _draw(scaled, seed)


class TopKSampler(Sampler):
    """Samples among the ``k`` most likely tokens (ties: lower id first).

    Args:
      k: number of candidates kept, >= 1; ``k = 1`` is greedy decoding.
      temperature: > 0, applied to the logits of the kept tokens.
    """

    def __init__(self, k: int = 10, temperature: float = 1.0) -> None:
        self.k = int(check_setting("top_k", 0 if k is None else k))
        self.temperature = _check_temperature(temperature)

    def get_config(self) -> Dict[str, Any]:
        return {"k": self.k, "temperature": self.temperature}

    def get_next_token(self, logits: tf.Tensor, step: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        del step
        logits = tf.cast(logits, tf.float32)
        # A k above the vocabulary keeps every token instead of failing.
        vocab = logits.shape[-1]
        k = min(self.k, vocab) if vocab is not None else tf.minimum(self.k, tf.shape(logits)[-1])
        top_logits, top_ids = tf.math.top_k(logits, k=k, sorted=True)  # [batch, k] each
        choice = _draw(top_logits / self.temperature, seed)  # [batch], index into the k
        return tf.gather(top_ids, choice, batch_dims=1)  # [batch]


class TopPSampler(Sampler):
    """Nucleus sampling: samples among the smallest set of most likely tokens
    whose total probability is at least ``p`` (Holtzman et al., 2020).

    The most likely token is always kept. Tokens are ranked by probability,
    equal probabilities by lower id, so the kept set is deterministic. With
    ``k`` the nucleus is taken among the ``k`` most likely tokens only, their
    probabilities renormalized first: ``transformers``' sampling (its
    temperature, then top-k, then top-p, then min-p), which Hugging Face
    folders ask for. With ``min_p`` a token stays only if its probability is
    at least ``min_p`` times the most likely token's (Nguyen et al., 2024).

    Args:
      p: in (0, 1]; ``p = 1`` keeps the full distribution (of the top ``k``).
      temperature: > 0, applied before the probabilities are computed.
      k: None (no limit) or >= 1: the candidates before the nucleus is taken.
      min_p: None or 0 (off), or in (0, 1]: the share of the top token's
        probability a token needs, among those the top-k and the nucleus kept.
    """

    def __init__(self, p: float = 0.9, temperature: float = 1.0, k: Optional[int] = None,
                 min_p: Optional[float] = None) -> None:
        check_setting("top_p", p)
        check_setting("top_k", k)
        check_setting("min_p", min_p)
        self.p = float(p)
        self.temperature = _check_temperature(temperature)
        self.k = None if k is None else int(k)
        self.min_p = float(min_p) if min_p else None

    def get_config(self) -> Dict[str, Any]:
        return {"p": self.p, "temperature": self.temperature, "k": self.k, "min_p": self.min_p}

    def candidates(self, logits: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        """The tokens a draw chooses among, most likely first: ``(ids, scaled logits)``, each ``[batch, n]``.

        A token outside the top ``k``, the nucleus or the ``min_p`` share has
        logit ``-inf``; the draw is the softmax of the rest.
        """
        scaled = tf.cast(logits, tf.float32) / self.temperature  # [batch, vocab]
        vocab = scaled.shape[-1]
        limited = self.k is not None and (vocab is None or self.k < vocab)
        if self.p >= 1.0 and not limited and self.min_p is None:  # the full distribution, in vocabulary order
            return tf.broadcast_to(tf.range(tf.shape(scaled)[-1]), tf.shape(scaled)), scaled
        if limited:
            # top_k ranks equal scores by lower id, as the stable sort below does.
            k = self.k if vocab is not None else tf.minimum(self.k, tf.shape(scaled)[-1])
            sorted_logits, order = tf.math.top_k(scaled, k=k, sorted=True)  # [batch, k] each
        else:
            # A stable descending sort ranks equal scores by lower id.
            order = tf.argsort(scaled, axis=-1, direction="DESCENDING", stable=True)  # [batch, vocab]
            sorted_logits = tf.gather(scaled, order, batch_dims=1)  # [batch, vocab]
        if self.p < 1.0:  # (at p = 1 rounding in the cumulative sum could drop the tail; p = 1 means all)
            sorted_probs = tf.nn.softmax(sorted_logits, axis=-1)  # [batch, n]
            # Keep a token while the mass of the tokens ranked above it is < p:
            # that is the smallest prefix reaching p, and always the top token.
            mass_before = tf.cumsum(sorted_probs, axis=-1, exclusive=True)  # [batch, n]
            keep = mass_before < self.p  # [batch, n]
            sorted_logits = tf.where(keep, sorted_logits, tf.fill(tf.shape(sorted_logits), -float("inf")))
        if self.min_p is not None:
            # p_i >= min_p * p_top over the tokens still kept, as transformers' MinPLogitsWarper compares
            # them (the top token, ranked first, always stays).
            probs = tf.nn.softmax(sorted_logits, axis=-1)  # [batch, n]
            keep = probs >= self.min_p * probs[:, :1]
            sorted_logits = tf.where(keep, sorted_logits, tf.fill(tf.shape(sorted_logits), -float("inf")))
        return order, sorted_logits

    def get_next_token(self, logits: tf.Tensor, step: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        del step
        ids, candidate_logits = self.candidates(logits)  # [batch, n] each
        choice = _draw(candidate_logits, seed)  # [batch], a rank
        return tf.gather(ids, choice, batch_dims=1)  # [batch]


def _mix(x: tf.Tensor) -> tf.Tensor:
    """MurmurHash3's 32-bit finalizer: every input bit flips about half the output bits."""
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 16))
    x = x * tf.constant(0x85EBCA6B, tf.uint32)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 13))
    x = x * tf.constant(0xC2B2AE35, tf.uint32)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 16))


def _uniform(shape: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """Uniform floats in (0, 1) of ``shape`` from an int64 ``[2]`` seed: a counter hashed with the seed.

    Plain integer arithmetic, so the XLA-compiled decode loop and the
    uncompiled one draw bit-identical numbers (TensorFlow's stateless random
    ops do not: XLA implements them with another stream, whatever ``alg``
    says). 24 random bits per number. A ``[batch, 3]`` seed gives each row its
    own: ``(seed, position word, row)`` draws the numbers of row ``row`` of a
    ``[2]`` seed's draw (a server's requests, each sampled as if alone).
    """
    if seed.shape.rank == 2:  # one seed a row: the counter restarts at the row's place in a batch
        n = tf.cast(shape[-1], tf.int64)
        counter = tf.cast(seed[:, 2:] * n + tf.range(n)[tf.newaxis, :], tf.uint32)  # [batch, n]
        first, second = seed[:, :1], seed[:, 1:2]  # [batch, 1] each
    else:
        counter = tf.cast(tf.range(tf.reduce_prod(shape)), tf.uint32)
        first, second = seed[0], seed[1]
    words = [tf.cast(tf.bitwise.bitwise_and(w, 0xFFFFFFFF), tf.uint32)  # the seed's four 32-bit words
             for w in (first, tf.bitwise.right_shift(first, 32), second, tf.bitwise.right_shift(second, 32))]
    x = counter * tf.constant(0x9E3779B9, tf.uint32)
    for i in range(4):
        x = _mix(x + words[i] + tf.constant(0x7F4A7C15 * (i + 1) & 0xFFFFFFFF, tf.uint32))
    u = (tf.cast(tf.bitwise.right_shift(x, 8), tf.float32) + 0.5) * (1.0 / 16777216.0)
    return tf.reshape(u, shape)


def _draw(logits: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """One stateless categorical draw per row of float32 `[batch, n]` logits (``seed``: int64 ``[2]``, or
    ``[batch, 3]`` for a seed a row, see :func:`_uniform`).

    The Gumbel-max draw, ``argmax(logits - log(-log(u)))``, with ``u`` from
    :func:`_uniform`: XLA compiles it and, compiled or not, the same seed gives
    the same sample.
    """
    u = _uniform(tf.shape(logits), seed)  # [batch, n]
    return tf.argmax(logits - tf.math.log(-tf.math.log(u)), axis=-1, output_type=tf.int32)  # [batch]
