"""The feed-forward blocks against NumPy: the transformer's MLP and the gated one (SwiGLU, GeGLU)."""
import numpy as np
import pytest
import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.layers import GatedFeedForward, Linear
from lmkit.layers.feedforward import check_activation, feed_forward


def _silu(x):
    return x / (1 + np.exp(-x))


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


@pytest.mark.parametrize("activation, act", [("silu", _silu), ("gelu", _gelu_tanh)])
def test_the_gated_feed_forward_is_down_of_act_gate_times_up(activation, act):
    tf.random.set_seed(0)
    ffn = GatedFeedForward(dim=6, ffn_dim=10, activation=activation, init_scale=0.5)
    x = np.random.RandomState(1).normal(size=(2, 3, 6)).astype(np.float32)
    gate, up, down = (layer.kernel.numpy().astype(np.float64) for layer in (ffn.gate, ffn.up, ffn.down))
    want = (act(x @ gate) * (x @ up)) @ down
    np.testing.assert_allclose(ffn(tf.constant(x)).numpy(), want, rtol=1e-4, atol=1e-5)
    assert sorted(v.name for v in ffn.variables) == [f"{ffn.name}/{n}/kernel:0" for n in ("down", "gate", "up")]
    assert type(ffn)(**ffn.get_config()).get_config() == ffn.get_config()


def test_the_mlp_is_outer_of_act_inner():
    tf.random.set_seed(2)
    inner, outer = Linear(input_size=4, output_size=8, init_scale=0.5), Linear(input_size=8, output_size=4)
    x = np.random.RandomState(3).normal(size=(5, 4)).astype(np.float32)
    hidden = np.maximum(x @ inner.kernel.numpy() + inner.bias.numpy(), 0.0)
    want = hidden @ outer.kernel.numpy() + outer.bias.numpy()
    np.testing.assert_allclose(feed_forward(tf.constant(x), inner, outer, "relu").numpy(), want, rtol=1e-5,
                               atol=1e-6)


def test_an_unknown_activation_is_named_with_the_choices():
    assert check_activation("gelu_exact") == "gelu_exact"
    with pytest.raises(UsageError, match="activation 'swish' is not one of gelu, gelu_exact, relu"):
        check_activation("swish")
    with pytest.raises(UsageError, match="activation 'relu' is not one of silu, gelu"):
        GatedFeedForward(dim=4, ffn_dim=8, activation="relu")
