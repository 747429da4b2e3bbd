"""LayerNorm and RMSNorm against NumPy, eagerly and under tf.function."""

import numpy as np
import pytest
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


def test_layer_norm_without_offset_matches_numpy_and_torch(run):
    """use_offset=False: scale only, nanoGPT's LayerNorm(bias=False) (F.layer_norm with bias None)."""
    norm = LayerNorm(dim=5, use_offset=False)
    assert norm.offset is None and [v.name for v in norm.variables] == ["layer_norm/scale:0"]
    norm.scale.assign(_random(5, seed=1))
    x = _random(2, 3, 5)
    x_mean = x - x.mean(-1, keepdims=True)
    want = x_mean / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * norm.scale.numpy()
    got = run(norm, tf.constant(x))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    torch = pytest.importorskip("torch")
    torch_out = torch.nn.functional.layer_norm(torch.tensor(x), (5,), torch.tensor(norm.scale.numpy()), None, 1e-5)
    np.testing.assert_allclose(got, torch_out.numpy(), rtol=1e-4, atol=1e-5)
    assert LayerNorm(**norm.get_config()).offset is None


def test_rms_norm_matches_numpy(run):
    norm = RMSNorm(dim=5, epsilon=1e-6)
    norm.scale.assign(_random(5, seed=1))
    x = _random(2, 3, 5)
    want = x / np.sqrt(np.mean(x ** 2, axis=-1, keepdims=True) + 1e-6) * norm.scale.numpy()
    np.testing.assert_allclose(run(norm, tf.constant(x)), want, rtol=1e-5, atol=1e-6)
