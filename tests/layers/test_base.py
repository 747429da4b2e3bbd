"""The shared helpers of lmkit.layers.base: Linear, the initializers and dropout."""

import numpy as np
import tensorflow as tf

from lmkit.layers import Linear, dropout, uniform_initializer


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
