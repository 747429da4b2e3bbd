"""lmkit.models.gemma.model without a reference: Gemma's defaults, its config, and that it is lmkit's Llama."""
import math

import numpy as np
import pytest
import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.models import build_model

CONFIG = {"model": "gemma", "vocab_size": 11, "hidden_size": 12, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
          "head_dim": 8, "ffn_dim": 20, "max_positions": 16}


def test_gemmas_defaults_and_a_head_size_of_its_own():
    model = build_model(CONFIG)
    assert model.tie_weights and model.embedding_scale == math.sqrt(12)
    assert model.decoder.layers[0].ffn.activation == "gelu"
    assert model.decoder.layers[0].attention.query.kernel.shape == [12, 2 * 8]  # heads * head_dim, not hidden
    assert model.decoder.layers[0].attention.key.kernel.shape == [12, 8]  # one key/value head
    assert build_model({**CONFIG, "ffn_dim": 0}).ffn_dim == 8 * 12  # Gemma's ratio


@pytest.mark.parametrize("changes", [{}, {"embedding_scale": 1.0}, {"attention_bias": True, "tie_weights": False,
                                                                      "activation": "silu", "dropout": 0.1}])
def test_the_config_rebuilds_the_same_model(changes):
    model = build_model({**CONFIG, **changes})
    config = model.get_config()
    assert config["model"] == "gemma" and type(model).__name__ == "GemmaLanguageModel"
    assert ("embedding_scale" in config) == ("embedding_scale" in changes)  # absent at Gemma's sqrt(hidden_size)
    assert not {"sliding_window", "layer_types", "qkv_bias", "attention_output_bias"} & set(config)
    again = build_model(config)
    assert again.get_config() == config and again.embedding_scale == model.embedding_scale
    assert [v.shape for v in again.variables] == [v.shape for v in model.variables]
    assert all(changes[k] == config[k] for k in changes)


def test_attention_bias_puts_a_bias_on_every_attention_projection():
    attention = build_model({**CONFIG, "attention_bias": True}).decoder.layers[1].attention
    assert all(layer.use_bias for layer in (attention.query, attention.key, attention.value, attention.output))
    attention = build_model(CONFIG).decoder.layers[1].attention
    assert not any(layer.use_bias for layer in (attention.query, attention.key, attention.value, attention.output))


def test_it_computes_what_lmkits_llama_computes_with_gemmas_settings():
    gemma = build_model({**CONFIG, "attention_bias": True})
    llama = build_model({**CONFIG, "model": "llama", "qkv_bias": True, "attention_output_bias": True,
                         "tie_weights": True, "activation": "gelu", "embedding_scale": math.sqrt(12)})
    def paths(model):  # the variables below the model's own scope (its class name)
        return [v.name.split("/", 1)[1] for v in model.variables]

    assert paths(gemma) == paths(llama)
    tf.random.set_seed(1)
    for a, b in zip(gemma.variables, llama.variables):
        b.assign(a + tf.random.normal(a.shape, stddev=0.1))  # norms and biases off their initial values
        a.assign(b)
    ids = tf.constant([[1, 4, 2, 9, 10], [0, 3, 3, 7, 5]])
    np.testing.assert_array_equal(gemma(ids)[0].numpy(), llama(ids)[0].numpy())


@pytest.mark.parametrize("key, value, message", [
    ("hidden_size", 0, r"hidden_size 0 must be a positive integer"),
    ("embedding_scale", -2.0, r"embedding_scale"),
    ("activation", "relu", r"activation 'relu' is not one of silu, gelu"),
])
def test_bad_settings_are_named(key, value, message):
    with pytest.raises(UsageError, match=message):
        build_model({**CONFIG, key: value})
