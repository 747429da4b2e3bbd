"""Perplexity of a text under a model, per token and per word, in one process.

Evaluation reads the id stream in order as ``batch_size`` rows of windows
(:func:`lmkit.data.bptt_arrays`), carrying a recurrent model's state from
window to window, and averages the cross entropy over every predicted token.
It runs in one process with no collective operation, so rank 0 can evaluate
while the other ranks wait.

Per-word perplexity makes runs with different tokenizers comparable: the
total negative log-likelihood of a text divided by its number of words
(``lmkit.data.count_words``), not of its tokens. The evaluated tokens are the
stream's first ``num_batches * batch_size * num_steps``; the per-word figure
scales their mean loss by the whole stream's tokens per word, i.e. it treats
the few tokens of the last partial batch as average ones.

Examples with loss weights (conversations, completions: :class:`ExampleEvaluator`)
are read one a row, each once, and their loss is per weighted target: per
assistant token.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from lmkit.core.xla import use_autograph
from lmkit.data.batching import BpttBatches
from lmkit.layers import kernels as attention_kernels
from lmkit.layers.precision import scope as precision_scope
from lmkit.train.losses import sequence_softmax_cross_entropy, window_loss
from lmkit.train.metrics import perplexity

__all__ = ["Evaluator", "ExampleEvaluator", "PairEvaluator", "word_perplexity"]


def word_perplexity(mean_token_loss: float, num_tokens: int, num_words: int) -> Optional[float]:
    """``exp(total NLL / words)`` from the mean loss per token; None without words.

    Args:
      mean_token_loss: average negative log-likelihood of a token (nats).
      num_tokens: tokens of the text.
      num_words: whitespace-separated words of the same text.
    """
    if not num_words or not num_tokens or not math.isfinite(mean_token_loss):
        return None
    return perplexity(mean_token_loss * num_tokens / num_words)


class Evaluator:
    """Mean loss per token of id streams under ``model`` (compiled once).

    Args:
      model: a language model (``docs/design.md``).
      num_steps: the window length.
      batch_size: rows read side by side.
      precision: the compute precision (:mod:`lmkit.layers.precision`; training's, by default float32).
      jit_compile: compile the step with XLA (the trainer passes its own decision, :mod:`lmkit.core.xla`).
      attention_kernel: the kernel of causal attention, as resolved by the trainer
        (:func:`lmkit.layers.kernels.resolve`; ``"matmul"`` by default).
    """

    def __init__(self, model: Any, num_steps: int, batch_size: int, precision: str = "float32",
                 jit_compile: bool = False, attention_kernel: str = "matmul") -> None:
        self.model = model
        self.num_steps = num_steps
        self.batch_size = batch_size

        def eval_step(x, y, state):
            with precision_scope(precision), attention_kernels.scope(attention_kernel):
                logits, new_state = model(x, state, training=False)
                return window_loss(y, logits), new_state

        self._step = tf.function(eval_step, jit_compile=jit_compile, autograph=use_autograph(model))

    def mean_loss(self, ids: np.ndarray, on_batch: Optional[Callable[[], None]] = None) -> float:
        """Average cross entropy (nats) of the tokens of ``ids`` that fill whole batches.

        Args:
          ids: the id stream.
          on_batch: called after every batch (the trainer's watchdog).

        Raises:
          DataError: too few ids for one batch of ``batch_size`` x ``num_steps``.
        """
        batches = BpttBatches(ids, self.batch_size, self.num_steps)  # read batch by batch
        stateful = getattr(self.model, "stateful", False)
        state = self.model.initial_state(self.batch_size) if stateful else None
        total = 0.0
        for inputs, targets in batches:
            loss, state = self._step(tf.constant(inputs), tf.constant(targets), state)
            total += float(loss)
            if on_batch is not None:
                on_batch()
        return total / (len(batches) * self.num_steps)


class _PerTarget:
    """``mean_loss`` from ``total_loss``: the targets' summed loss over their number (or weight)."""

    def total_loss(self, data: Any, on_batch: Optional[Callable[[], None]] = None) -> "tuple[float, float]":
        raise NotImplementedError

    def mean_loss(self, data: Any, on_batch: Optional[Callable[[], None]] = None) -> float:
        """Average cross entropy (nats) per target (per weighted target) of ``data``."""
        total, tokens = self.total_loss(data, on_batch)
        return total / max(tokens, 1)


class PairEvaluator(_PerTarget):
    """Mean loss per target token of source/target pairs under an encoder-decoder (one process).

    Every pair is read once (:func:`lmkit.data.paired.eval_pair_batches`:
    ``batch_size`` rows sorted by length, the last batch filled up with
    masked rows); the loss sums over target tokens (the end id included) and
    divides by their number.

    Args:
      model: a conditional model (``encode`` and ``condition=``).
      batch_size: pairs read side by side.
      special: the target side's :class:`~lmkit.data.paired.SpecialIds`.
      precision, jit_compile, attention_kernel: as :class:`Evaluator`.
    """

    def __init__(self, model: Any, batch_size: int, special: Any, precision: str = "float32",
                 jit_compile: bool = False, attention_kernel: str = "matmul") -> None:
        self.model, self.batch_size, self.special = model, batch_size, special

        def eval_step(source, source_mask, target_inputs, target_outputs, mask):
            with precision_scope(precision), attention_kernels.scope(attention_kernel):
                condition = model.encode(source, source_mask, training=False)
                logits, _ = model(target_inputs, condition=condition, training=False)
                return sequence_softmax_cross_entropy(target_outputs, logits, mask=mask, average_across_batch=False,
                                                      sum_over_batch=True)

        self._step = tf.function(eval_step, jit_compile=jit_compile, reduce_retracing=True,
                                 autograph=use_autograph(model))

    def total_loss(self, pairs: Any, on_batch: Optional[Callable[[], None]] = None) -> "tuple[float, int]":
        """``(sum of the target tokens' losses, number of target tokens)`` over every pair."""
        from lmkit.data.paired import eval_pair_batches

        total, tokens = 0.0, 0
        for (source, source_mask, target_inputs), (target_outputs, mask) in eval_pair_batches(
                pairs, self.batch_size, self.special):
            total += float(self._step(tf.constant(source), tf.constant(source_mask), tf.constant(target_inputs),
                                      tf.constant(target_outputs), tf.constant(mask)))
            tokens += int(mask.sum())
            if on_batch is not None:
                on_batch()
        return total, tokens



class ExampleEvaluator(_PerTarget):
    """Mean loss per weighted target (per assistant token, for conversations) of examples, in one process.

    Every example is read once, one a row (:func:`lmkit.data.packing.eval_rows`: sorted by length,
    ``batch_size`` rows padded to a length bucket, the last batch filled up with empty rows); the loss sums
    each target's loss times its weight, in float32 per batch, and divides by the weights' sum.

    Args:
      model: a language model (``docs/design.md``).
      num_steps: the longest row (the examples are cut to ``num_steps + 1`` ids).
      batch_size: rows read side by side.
      precision, jit_compile, attention_kernel: as :class:`Evaluator`.
    """

    def __init__(self, model: Any, num_steps: int, batch_size: int, precision: str = "float32",
                 jit_compile: bool = False, attention_kernel: str = "matmul") -> None:
        self.model, self.num_steps, self.batch_size = model, num_steps, batch_size

        def eval_step(ids, targets, weights):
            with precision_scope(precision), attention_kernels.scope(attention_kernel):
                logits, _ = model(ids, training=False)
                return sequence_softmax_cross_entropy(targets, logits, mask=weights, average_across_batch=False,
                                                      sum_over_batch=True)

        self._step = tf.function(eval_step, jit_compile=jit_compile, reduce_retracing=True,
                                 autograph=use_autograph(model))

    def total_loss(self, examples: Any, on_batch: Optional[Callable[[], None]] = None) -> "tuple[float, float]":
        """``(sum of the targets' weighted losses, sum of their weights)`` over every example."""
        from lmkit.data.packing import eval_rows

        total, weight = 0.0, 0.0
        for rows in eval_rows(examples, self.batch_size, self.num_steps):
            total += float(self._step(tf.constant(rows.inputs), tf.constant(rows.targets), tf.constant(rows.weights)))
            weight += float(rows.weights.sum())
            if on_batch is not None:
                on_batch()
        return total, weight

