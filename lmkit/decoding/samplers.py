"""Token-selection strategies for the decode loop.

A sampler decides which token comes next from the model's logits; everything
else (feeding tokens, prompts, `<eos>`, padding, the model state) lives in the
one decode loop, :func:`lmkit.decoding.decode`. A new strategy overrides the
single method :meth:`Sampler.get_next_token` (the KerasHub design).

Random samplers are reproducible: they draw with stateless random ops whose
seed is derived from the decode seed and the position being generated, so the
same seed gives the same tokens eagerly and inside ``tf.function``.
"""

from __future__ import annotations

import difflib
from typing import Any, Dict, Tuple

import tensorflow as tf

__all__ = [
    "Sampler",
    "GreedySampler",
    "RandomSampler",
    "TopKSampler",
    "TopPSampler",
    "BeamSampler",
    "get_sampler",
    "SAMPLER_NAMES",
]


def _check_temperature(temperature: float) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature <= 0:
        raise ValueError(f"temperature = {temperature!r} must be a number > 0; "
                         f"use a small value such as 1e-3 for near-greedy output")
    return float(temperature)


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
            raise ValueError(f"k = {k!r} must be an integer >= 1; use k = 1 for greedy decoding")
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
            raise ValueError(f"p = {p!r} must be in (0, 1]; use p = 1.0 to keep every token")
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


class BeamSampler:
    """Settings for beam search, so ``get_sampler("beam", ...)`` has a value.

    Beam search keeps several hypotheses per sequence and is not a per-token
    strategy; :func:`lmkit.decoding.decode` hands a ``BeamSampler`` to
    :func:`lmkit.decoding.beam_search`.

    Args:
      beam_width: hypotheses kept per sequence, >= 1.
      length_penalty: GNMT alpha; scores are ``log_prob / ((5 + len) / 6) ** alpha``.
    """

    def __init__(self, beam_width: int = 4, length_penalty: float = 0.0) -> None:
        if isinstance(beam_width, bool) or not isinstance(beam_width, int) or beam_width < 1:
            raise ValueError(f"beam_width = {beam_width!r} must be an integer >= 1")
        if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)):
            raise ValueError(f"length_penalty = {length_penalty!r} must be a number "
                             f"(0 = none, 0.6-1.0 favours longer outputs)")
        self.beam_width = beam_width
        self.length_penalty = float(length_penalty)

    def get_config(self) -> Dict[str, Any]:
        return {"beam_width": self.beam_width, "length_penalty": self.length_penalty}

    def __repr__(self) -> str:
        return f"BeamSampler(beam_width={self.beam_width}, length_penalty={self.length_penalty})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BeamSampler) and self.get_config() == other.get_config()

    def __hash__(self) -> int:
        return hash(("BeamSampler", self.beam_width, self.length_penalty))


def _draw(logits: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """One stateless categorical draw per row of float32 `[batch, n]` logits."""
    sample = tf.random.stateless_categorical(logits, num_samples=1, seed=seed, dtype=tf.int32)
    return sample[:, 0]  # [batch]


_FACTORIES = {
    "greedy": GreedySampler,
    "sample": RandomSampler,
    "top_k": TopKSampler,
    "top_p": TopPSampler,
    "beam": BeamSampler,
}
SAMPLER_NAMES: Tuple[str, ...] = tuple(_FACTORIES)


def get_sampler(name: str, **kwargs: Any):
    """Builds a sampler by name.

    Args:
      name: one of ``"greedy"``, ``"sample"``, ``"top_k"``, ``"top_p"``, ``"beam"``.
      **kwargs: constructor arguments of that sampler (``temperature``, ``k``,
        ``p``, ``beam_width``, ``length_penalty``).

    Returns:
      A :class:`Sampler`, or a :class:`BeamSampler` for ``"beam"``.

    Raises:
      ValueError: unknown name, or an argument the sampler does not take.
    """
    if name not in _FACTORIES:
        close = difflib.get_close_matches(str(name), SAMPLER_NAMES, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(f"unknown sampler {name!r}; {hint}choices: {', '.join(SAMPLER_NAMES)}")
    factory = _FACTORIES[name]
    try:
        return factory(**kwargs)
    except TypeError as exc:
        raise ValueError(f"sampler {name!r} does not accept {sorted(kwargs)}: {exc}") from None
