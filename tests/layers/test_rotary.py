"""Rotary position embeddings against NumPy: Hugging Face's half-split rotation, its scaled variants, the errors."""
import math

import numpy as np
import pytest
import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.layers import RotaryEmbedding

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def _rotate(x, positions, inv_freq):
    """x [..., time, head_dim] turned by positions * inv_freq, the halves paired (rotate_half)."""
    angles = np.asarray(positions, np.float64)[:, None] * np.asarray(inv_freq, np.float64)[None, :]
    cos, sin = np.cos(np.concatenate([angles] * 2, -1)), np.sin(np.concatenate([angles] * 2, -1))
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def _apply(rotary, x, positions):
    cos, sin = rotary.cos_sin(tf.constant(positions))  # [time, head_dim]
    return rotary.rotate(tf.constant(x), cos, sin).numpy()


def test_the_rotation_is_hugging_faces_and_depends_on_the_distance_only():
    rotary = RotaryEmbedding(head_dim=8, theta=100.0)
    inv_freq = [100.0 ** (-2 * i / 8) for i in range(4)]
    np.testing.assert_allclose(rotary.inv_freq.numpy(), inv_freq, rtol=1e-6)
    x = np.random.RandomState(0).normal(size=(2, 3, 5, 8)).astype(np.float32)  # [batch, heads, time, head_dim]
    got = _apply(rotary, x, list(range(5)))
    np.testing.assert_allclose(got, _rotate(x.astype(np.float64), range(5), inv_freq), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
    # q . k of two positions depends on their distance alone: shifting both by 7 changes nothing
    q, k = x[:1, :1, :1], x[:1, :1, 1:2]
    def dot(a, b):
        return float(np.sum(_apply(rotary, q, [a]) * _apply(rotary, k, [b])))

    assert dot(3, 1) == pytest.approx(dot(10, 8), rel=1e-5) and dot(3, 1) != pytest.approx(dot(3, 2), rel=1e-3)
    bf16 = rotary.rotate(tf.constant(x, tf.bfloat16), *rotary.cos_sin(tf.range(5)))
    assert bf16.dtype == tf.bfloat16  # computed in float32, given back in the input's dtype


def test_linear_scaling_divides_the_frequencies_and_llama3_only_the_low_ones():
    plain = RotaryEmbedding(head_dim=16).inv_freq.numpy()
    linear = RotaryEmbedding(head_dim=16, scaling={"type": "linear", "factor": 4.0})
    np.testing.assert_allclose(linear.inv_freq.numpy(), plain / 4, rtol=1e-6)
    assert linear.scaling == {"rope_type": "linear", "factor": 4.0}  # "type" spelled as rope_type
    llama3 = RotaryEmbedding(head_dim=16, scaling=LLAMA3).inv_freq.numpy()
    wavelengths = 2 * math.pi / plain
    high, low = wavelengths < 64 / 4.0, wavelengths > 64 / 1.0
    assert high.any() and low.any()
    np.testing.assert_allclose(llama3[high], plain[high], rtol=1e-6)  # short wavelengths kept
    np.testing.assert_allclose(llama3[low], plain[low] / 8.0, rtol=1e-6)  # long ones stretched
    between = ~(high | low)
    assert np.all((llama3[between] <= plain[between]) & (llama3[between] >= plain[between] / 8.0))
    assert RotaryEmbedding(head_dim=16, scaling={"rope_type": "default"}).scaling is None


@pytest.mark.parametrize("kwargs, message", [
    (dict(head_dim=7), "head_dim 7 must be even"),
    (dict(head_dim=8, scaling={"rope_type": "yarn", "factor": 2.0}), "rope_scaling type 'yarn' is not supported"),
    (dict(head_dim=8, scaling={"rope_type": "linear", "factor": 0}), "rope_scaling factor 0 must be a number > 0"),
    (dict(head_dim=8, scaling={**LLAMA3, "high_freq_factor": 0.5}), "high_freq_factor must exceed low_freq_factor"),
    (dict(head_dim=8, scaling={"rope_type": "llama3", "factor": 8.0}), "llama3 needs low_freq_factor > 0"),
])
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(UsageError, match=message):
        RotaryEmbedding(**kwargs)
