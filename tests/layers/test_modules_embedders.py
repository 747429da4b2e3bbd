"""Embedders, the output projection (with weight tying) and the shared helpers."""

import numpy as np
import pytest
import tensorflow as tf

from lmkit.layers import (Linear, OutputProjection, PositionEmbedder, SinusoidsPositionEmbedder, WordEmbedder,
                           dropout, uniform_initializer)


def test_word_embedder_looks_up_rows(run):
    embedder = WordEmbedder(vocab_size=7, dim=3)
    ids = np.array([[0, 6, 2], [2, 2, 1]], np.int32)
    np.testing.assert_array_equal(run(embedder, tf.constant(ids)), embedder.embeddings.numpy()[ids])


def test_word_embedder_gradient_is_indexed_slices(run):
    embedder = WordEmbedder(vocab_size=7, dim=3)
    ids = tf.constant([[1, 4], [4, 5]])

    def grad(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(embedder(ids))
        return tape.gradient(loss, embedder.embeddings)

    if run.mode == "eager":
        g = grad(ids)
        assert isinstance(g, tf.IndexedSlices)
        assert sorted(g.indices.numpy().tolist()) == [1, 4, 4, 5]
    else:
        outputs = tf.function(grad).get_concrete_function(tf.TensorSpec([2, 2], tf.int32)).structured_outputs
        assert isinstance(outputs, tf.IndexedSlices)
    dense = tf.convert_to_tensor(grad(ids)).numpy()
    np.testing.assert_array_equal(dense[:, 0], [0, 1, 0, 0, 2, 1, 0])


def test_word_embedder_initializer_and_dropout():
    embedder = WordEmbedder(vocab_size=5, dim=4, initializer=lambda shape, dtype: tf.ones(shape, dtype),
                            dropout=0.5)
    ids = tf.zeros([200], tf.int32)
    np.testing.assert_array_equal(embedder(ids), np.ones([200, 4]))
    dropped = embedder(ids, training=True).numpy()
    assert set(np.unique(dropped)) <= {0.0, 2.0}
    assert 0.3 < np.mean(dropped == 0) < 0.7


def test_position_embedders(run):
    learned = PositionEmbedder(max_positions=6, dim=4)
    np.testing.assert_array_equal(learned(3), learned.embeddings.numpy()[:3])
    positions = np.array([[5, 0], [2, 2]], np.int32)
    np.testing.assert_array_equal(run(learned, tf.constant(positions)), learned.embeddings.numpy()[positions])

    sinusoids = SinusoidsPositionEmbedder(dim=6)
    assert not sinusoids.variables
    p = np.arange(40, dtype=np.float32)[:, None]
    inv = 1.0e4 ** (-np.arange(3) / 2.0)  # timescales 1, 100, 10000
    want = np.concatenate([np.sin(p * inv), np.cos(p * inv)], axis=1)
    np.testing.assert_allclose(run(sinusoids, tf.range(40)), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sinusoids(40), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="length 7 exceeds max_positions 6"):
        learned(7)
    with pytest.raises(ValueError, match="dim 5 must be even"):
        SinusoidsPositionEmbedder(dim=5)


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


def test_linear_matches_numpy(run):
    linear = Linear(input_size=3, output_size=2, use_bias=False)
    assert [v.name for v in linear.variables] == ["linear/kernel:0"]
    x = np.ones((4, 5, 3), np.float32)
    np.testing.assert_allclose(run(linear, tf.constant(x)), x @ linear.kernel.numpy(), rtol=1e-6)


def test_uniform_initializer_range():
    values = uniform_initializer(0.05)([1000], tf.float32).numpy()
    assert values.min() >= -0.05 and values.max() <= 0.05 and values.std() > 0.02


def test_dropout_helper():
    x = tf.ones([1000])
    np.testing.assert_array_equal(dropout(x, 0.5, training=False), x)
    np.testing.assert_array_equal(dropout(x, 0.0, training=True), x)
    dropped = dropout(x, 0.25, training=True).numpy()
    assert set(np.unique(dropped)) <= {0.0, np.float32(1.0 / 0.75)}
    assert 0.15 < np.mean(dropped == 0) < 0.35
    # A bool tensor picks the branch at run time.
    np.testing.assert_array_equal(dropout(x, 0.5, training=tf.constant(False)), x)
    assert np.any(dropout(x, 0.5, training=tf.constant(True)).numpy() == 0)
    # A stateless seed reproduces the mask.
    seed = tf.constant([1, 2])
    np.testing.assert_array_equal(dropout(x, 0.5, True, seed=seed), dropout(x, 0.5, True, seed=seed))


def test_bad_arguments():
    with pytest.raises(ValueError, match="vocab_size 0 must be a positive integer"):
        WordEmbedder(vocab_size=0, dim=3)
    with pytest.raises(ValueError, match="dim 2.5 must be a positive integer"):
        WordEmbedder(vocab_size=3, dim=2.5)
    with pytest.raises(ValueError, match="dropout -0.1 must be in"):
        WordEmbedder(vocab_size=3, dim=2, dropout=-0.1)
    with pytest.raises(ValueError, match="max_positions True must be a positive integer"):
        PositionEmbedder(max_positions=True, dim=2)
    with pytest.raises(ValueError, match="init_scale 0 must be a number > 0"):
        uniform_initializer(0)


def test_dropout_draws_from_the_global_generator():
    x = tf.ones([64])
    masks = []
    for _ in range(2):
        tf.random.set_global_generator(tf.random.Generator.from_seed(7))
        eager = dropout(x, 0.5, training=True).numpy()
        traced = tf.function(lambda x: dropout(x, 0.5, training=True))(x).numpy()
        masks.append((eager, traced))
    # The same generator state gives the same masks, eagerly and traced ...
    np.testing.assert_array_equal(masks[0][0], masks[1][0])
    np.testing.assert_array_equal(masks[0][1], masks[1][1])
    # ... and every draw advances it.
    assert not np.array_equal(masks[0][0], masks[0][1])
