"""lmkit.models.llama.model without a reference: the options that are plain arithmetic."""
import numpy as np
import tensorflow as tf

from lmkit.models import build_model

CONFIG = {"model": "llama", "vocab_size": 11, "hidden_size": 8, "num_layers": 1, "num_heads": 2, "ffn_dim": 12,
          "max_positions": 16, "tie_weights": True}


def test_embedding_scale_multiplies_the_decoders_inputs_not_the_tied_softmax():
    plain = build_model(CONFIG)
    scaled = build_model(dict(CONFIG, embedding_scale=3.0))
    for a, b in zip(scaled.variables, plain.variables):  # the same weights in both
        a.assign(b)
    ids = tf.constant([[1, 4, 2, 9]])
    got, _ = scaled(ids)
    outputs, _ = plain.decoder(plain.embedder(ids) * 3.0, None, False)  # [1, 4, hidden]
    np.testing.assert_allclose(got.numpy(), plain.projection(outputs).numpy(), rtol=1e-6, atol=1e-6)
    state = scaled.initial_state(1, 8)
    step_logits, _ = scaled.step(tf.constant([1]), state)
    np.testing.assert_allclose(step_logits.numpy(), got.numpy()[:, 0], rtol=1e-5, atol=1e-5)


def test_embedding_scale_is_kept_in_the_config_only_when_set():
    assert "embedding_scale" not in build_model(CONFIG).get_config()
    config = build_model(dict(CONFIG, embedding_scale=2.5)).get_config()
    assert config["embedding_scale"] == 2.5 and build_model(config).embedding_scale == 2.5
