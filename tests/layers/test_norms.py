"""LayerNorm and RMSNorm against NumPy, eagerly and under tf.function."""

import numpy as np
import tensorflow as tf

from lmkit.layers import LayerNorm, RMSNorm

from .reference import np_layer_norm


def _random(*shape, seed=0):
    return np.random.RandomState(seed).normal(size=shape).astype(np.float32)


def test_layer_norm_matches_numpy(run):
    norm = LayerNorm(dim=5)
    norm.scale.assign(_random(5, seed=1))
    norm.offset.assign(_random(5, seed=2))
    x = _random(2, 3, 5)
    np.testing.assert_allclose(run(norm, tf.constant(x)), np_layer_norm(norm, x), rtol=1e-4, atol=1e-5)


def test_rms_norm_matches_numpy(run):
    norm = RMSNorm(dim=5, epsilon=1e-6)
    norm.scale.assign(_random(5, seed=1))
    x = _random(2, 3, 5)
    want = x / np.sqrt(np.mean(x ** 2, axis=-1, keepdims=True) + 1e-6) * norm.scale.numpy()
    np.testing.assert_allclose(run(norm, tf.constant(x)), want, rtol=1e-5, atol=1e-6)
