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


def test_examples_are_scored_per_weighted_target_each_once():
    from lmkit.data.chat import Example
    from lmkit.models import build_model
    from lmkit.train.evaluation import ExampleEvaluator
    rng = np.random.default_rng(2)
    examples = []
    for _ in range(7):
        n = int(rng.integers(3, 12))
        examples.append(Example(rng.integers(1, 30, n).astype(np.int32), (rng.random(n) < 0.5).astype(np.uint8)))
    tf.random.set_seed(3)
    model = build_model(dict(model="gpt2", vocab_size=30, hidden_size=16, num_layers=1, num_heads=2,
                             max_positions=16, dropout=0.0))
    total = weight = 0.0
    for ids, w in examples:  # each example alone: sum of weight x loss over the weights' sum
        logits, _ = model(ids[None, :-1])
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ids[None, 1:], logits=logits)
        total += float(tf.reduce_sum(losses * w[None, 1:].astype(np.float32)))
        weight += float(w[1:].sum())
    calls = []
    evaluator = ExampleEvaluator(model, num_steps=16, batch_size=3)
    assert evaluator.mean_loss(examples, lambda: calls.append(1)) == pytest.approx(total / weight, rel=1e-5)
    assert len(calls) == 3  # 7 examples, 3 a batch
    assert ExampleEvaluator(_Uniform(10), 16, 2).mean_loss([Example(np.arange(5, dtype=np.int32), np.ones(
        5, np.uint8))]) == pytest.approx(math.log(10), rel=1e-6)
