"""Perplexity of a text under a model, per token and per word, in one process."""
import math

import numpy as np
import pytest
import tensorflow as tf

from lmkit.train.evaluation import Evaluator, word_perplexity


class _Uniform(tf.Module):
    """A language model that gives every id the same probability."""

    stateful = False

    def __init__(self, vocab_size):
        super().__init__()
        self.vocab_size = vocab_size

    def __call__(self, ids, state=None, training=False):
        return tf.zeros(tf.concat([tf.shape(ids), [self.vocab_size]], 0)), state


def test_a_uniform_model_scores_ln_vocab_per_token_on_whole_batches():
    ids = np.arange(4 * 5 * 3 + 7, dtype=np.int32) % 10
    calls = []
    evaluator = Evaluator(_Uniform(10), num_steps=5, batch_size=4)
    assert evaluator.mean_loss(ids, lambda: calls.append(1)) == pytest.approx(math.log(10), rel=1e-6)
    assert len(calls) == 3  # one call a batch (the trainer's watchdog beats there)


def test_perplexity_per_word_scales_the_token_loss_by_tokens_per_word():
    assert word_perplexity(1.0, num_tokens=300, num_words=100) == pytest.approx(math.exp(3.0))
    assert word_perplexity(1.0, 300, 0) is None and word_perplexity(float("nan"), 300, 100) is None
