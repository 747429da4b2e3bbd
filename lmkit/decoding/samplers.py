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

from typing import Any, Dict

import tensorflow as tf

from lmkit.decoding.sampler import Sampler
from lmkit.errors import UsageError

__all__ = ["GreedySampler", "RandomSampler", "TopKSampler", "TopPSampler"]


def _check_temperature(temperature: float) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature <= 0:
        raise UsageError(f"temperature = {temperature!r} must be a number > 0; "
                         f"use a small value such as 1e-3 for near-greedy output")
    return float(temperature)


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
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise UsageError(f"k = {k!r} must be an integer >= 1; use k = 1 for greedy decoding")
        self.k = k
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
    equal probabilities by lower id, so the kept set is deterministic.

    Args:
      p: in (0, 1]; ``p = 1`` keeps the full distribution.
      temperature: > 0, applied before the probabilities are computed.
    """

    def __init__(self, p: float = 0.9, temperature: float = 1.0) -> None:
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
            raise UsageError(f"p = {p!r} must be in (0, 1]; use p = 1.0 to keep every token")
        self.p = float(p)
        self.temperature = _check_temperature(temperature)

    def get_config(self) -> Dict[str, Any]:
        return {"p": self.p, "temperature": self.temperature}

    def get_next_token(self, logits: tf.Tensor, step: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        del step
        scaled = tf.cast(logits, tf.float32) / self.temperature  # [batch, vocab]
        if self.p >= 1.0:
            # Rounding in the cumulative sum could drop the tail; p = 1 means all.
            return _draw(scaled, seed)
        # A stable descending sort ranks equal scores by lower id.
        order = tf.argsort(scaled, axis=-1, direction="DESCENDING", stable=True)  # [batch, vocab]
        sorted_logits = tf.gather(scaled, order, batch_dims=1)  # [batch, vocab]
        sorted_probs = tf.nn.softmax(sorted_logits, axis=-1)  # [batch, vocab]
        # Keep a token while the mass of the tokens ranked above it is < p:
        # that is the smallest prefix reaching p, and always the top token.
        mass_before = tf.cumsum(sorted_probs, axis=-1, exclusive=True)  # [batch, vocab]
        keep = mass_before < self.p  # [batch, vocab]
        masked = tf.where(keep, sorted_logits, tf.fill(tf.shape(sorted_logits), -float("inf")))
        choice = _draw(masked, seed)  # [batch], a rank
        return tf.gather(order, choice, batch_dims=1)  # [batch]


def _draw(logits: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """One stateless categorical draw per row of float32 `[batch, n]` logits."""
    sample = tf.random.stateless_categorical(logits, num_samples=1, seed=seed, dtype=tf.int32)
    return sample[:, 0]  # [batch]
