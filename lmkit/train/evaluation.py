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
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from lmkit.data.batching import BpttBatches
from lmkit.losses import window_loss
from lmkit.precision import scope as precision_scope
from lmkit.train.metrics import perplexity

__all__ = ["Evaluator", "word_perplexity"]


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
      precision: the compute precision (:mod:`lmkit.precision`; training's, by default float32).
      jit_compile: compile the step with XLA (the trainer passes its own decision, :mod:`lmkit.xla`).
    """

    def __init__(self, model: Any, num_steps: int, batch_size: int, precision: str = "float32",
                 jit_compile: bool = False) -> None:
        self.model = model
        self.num_steps = num_steps
        self.batch_size = batch_size

        def eval_step(x, y, state):
            with precision_scope(precision):
                logits, new_state = model(x, state, training=False)
                return window_loss(y, logits), new_state

        self._step = tf.function(eval_step, jit_compile=jit_compile)

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
