"""The word and position embedders, eagerly and under tf.function."""

import numpy as np
import pytest
import tensorflow as tf

from lmkit.layers import PositionEmbedder, SinusoidsPositionEmbedder, WordEmbedder, uniform_initializer


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
