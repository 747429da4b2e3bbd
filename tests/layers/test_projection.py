"""The output projection, with and without weight tying."""

import numpy as np
import pytest
import tensorflow as tf

from lmkit.layers import OutputProjection, WordEmbedder


def test_output_projection(run):
    projection = OutputProjection(dim=3, vocab_size=5)
    projection.bias.assign(np.arange(5, dtype=np.float32))
    x = np.random.RandomState(0).normal(size=(2, 4, 3)).astype(np.float32)
    want = x @ projection.kernel.numpy() + np.arange(5)
    np.testing.assert_allclose(run(projection, tf.constant(x)), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(projection(x[0]), want[0], rtol=1e-5, atol=1e-5)


def test_weight_tying_shares_one_variable(run):
    embedder = WordEmbedder(vocab_size=5, dim=3)
    projection = OutputProjection(dim=3, vocab_size=5, tied_embedder=embedder)
    assert projection.tied
    assert [v.name for v in projection.trainable_variables] == [
        "output_projection/bias:0", "word_embedder/embeddings:0"]
    assert projection.trainable_variables[1] is embedder.embeddings
    x = np.random.RandomState(0).normal(size=(2, 3)).astype(np.float32)
    want = x @ embedder.embeddings.numpy().T
    np.testing.assert_allclose(run(projection, tf.constant(x)), want, rtol=1e-5, atol=1e-5)

    # A change to the embeddings is seen by the projection.
    embedder.embeddings.assign_add(tf.ones([5, 3]))
    np.testing.assert_allclose(projection(x), x @ embedder.embeddings.numpy().T, rtol=1e-5, atol=1e-5)

    # The gradient of the shared table sums the lookup and the projection parts.
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(projection(embedder(tf.constant([1, 1]))))
    grad = tf.convert_to_tensor(tape.gradient(loss, embedder.embeddings)).numpy()
    table = embedder.embeddings.numpy()
    want_grad = np.tile(2 * table[1], (5, 1))  # d/dE of sum over 2 rows of (E[1] . E[v])
    want_grad[1] += 2 * table.sum(0)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-5)


def test_tied_shape_mismatch():
    with pytest.raises(ValueError, match=r"tied_embedder has shape \[5, 4\] but the projection needs"):
        OutputProjection(dim=3, vocab_size=5, tied_embedder=WordEmbedder(vocab_size=5, dim=4))
