"""lmkit's transformer language model (``transformer``, ``gpt2``): its options from a config's model section
(attention dropout and blocks, GPT-2's initialisation, no biases, nanoGPT's recipe), the cache, the errors."""

import numpy as np
import pytest
import tensorflow as tf

from lmkit.models import TransformerLanguageModel, build_model
from tests.models.test_protocols import VOCAB, _config, _ids


def test_attention_dropout_from_a_config_keeps_the_rest_of_the_dropout():
    """attention_dropout=0.0 in the model section: no dropout on the attention probabilities (what lets a fused
    attention kernel take training windows), the model's other dropout as dropout says; stored with the run."""
    config = _config("transformer", dropout=0.2, **{"model.attention_dropout": 0.0})
    model = build_model(config.model_config())
    assert model.dropout == pytest.approx(0.2) and model.attention_dropout == 0.0
    for layer in model.decoder.layers:
        assert (layer.attention_dropout, layer.attention.dropout) == (0.0, 0.0)
        assert layer.dropout == pytest.approx(0.2)
    assert model.get_config()["attention_dropout"] == 0.0
    assert build_model(model.get_config()).decoder.layers[1].attention.dropout == 0.0
    plain = build_model(_config("transformer", dropout=0.2).model_config())
    assert "attention_dropout" not in plain.get_config() and plain.attention_dropout is None
    assert plain.decoder.layers[0].attention.dropout == pytest.approx(0.2)  # None: the model's dropout
    with pytest.raises(Exception, match="attention_dropout"):
        build_model(_config("transformer", **{"model.attention_dropout": 1.5}).model_config())


def test_attention_blocks_from_a_config_train_the_same_model():
    # attention_blocks=4 in the model section: stored with the run, and the same logits and gradients.
    blocked = build_model(_config("transformer", **{"model.attention_blocks": 4}).model_config())
    assert blocked.get_config()["attention_blocks"] == 4
    assert build_model(blocked.get_config()).decoder.layers[1].attention.attention_blocks == 4
    plain = build_model(_config("transformer").model_config())
    assert "attention_blocks" not in plain.get_config()  # "auto", the default
    assert plain.decoder.layers[0].attention.attention_blocks == "auto"
    # A run that opted out of the automatic blocks keeps its choice when it is loaded again.
    one = build_model(_config("transformer", **{"model.attention_blocks": 1}).model_config())
    assert one.get_config()["attention_blocks"] == 1
    assert build_model(one.get_config()).decoder.layers[0].attention.attention_blocks == 1
    for a, b in zip(plain.variables, blocked.variables):
        a.assign(b)
    ids = _ids(3, 6)
    results = []
    for model in (plain, blocked):
        with tf.GradientTape() as tape:
            logits, _ = model(ids, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(ids, logits))
        results.append([logits] + [tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)])
    # The same products (skipped keys add exact zeros) summed in another order: float32 rounding, a few
    # eps (1.2e-7) of each value, through a 2-layer model; 1e-5 relative, 1e-6 absolute.
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_transformer_call_without_state_returns_none():
    model = build_model(_config("transformer").model_config())
    _, state = model(_ids(2, 4), training=True)
    assert state is None


def test_transformer_prefill_then_step_equals_full_pass(run):
    model = build_model(_config("transformer").model_config())
    ids = _ids(2, 6)
    want, _ = model(ids)

    def prefill(ids):
        logits, state = model(ids[:, :4], model.initial_state(2, max_length=6))
        a, state = model.step(ids[:, 4], state)
        b, state = model.step(ids[:, 5], state)
        return tf.concat([logits, a[:, None], b[:, None]], axis=1)

    np.testing.assert_allclose(run(prefill, ids), want, rtol=1e-4, atol=1e-5)


def test_gpt2_initialization_draws_normal_kernels_and_scales_the_residual_projections():
    """initialization = "gpt2": normal(0, init_scale) kernels and tables, normal(0, init_scale / sqrt(2 * layers))
    for the projections into the residual stream (GPT-2's and nanoGPT's init), biases 0 and norm scales 1."""
    tf.random.set_seed(0)
    options = dict(vocab_size=65, hidden_size=128, num_layers=4, num_heads=4, max_positions=64, init_scale=0.02)
    model = TransformerLanguageModel(initialization="gpt2", **options)
    residual_kernels = ("attention/output/kernel", "ffn_outer/kernel")
    drawn = 0
    for variable in model.variables:
        values = variable.numpy().astype(np.float64)
        if variable.shape.rank < 2:  # biases, layer-norm offsets and scales
            np.testing.assert_array_equal(values, 1.0 if variable.name.endswith("scale:0") else 0.0)
            continue
        want = 0.02 / np.sqrt(2 * 4) if any(name in variable.name for name in residual_kernels) else 0.02
        assert values.std() == pytest.approx(want, rel=0.05), variable.name
        assert abs(values.mean()) < 5 * want / np.sqrt(values.size), variable.name
        beyond = np.mean(np.abs(values) > 2 * want)  # a normal's 4.55%; a uniform of this spread has none
        assert 0.036 < beyond < 0.056, (variable.name, beyond)
        drawn += 1
    assert drawn == 2 + 4 * 4 + 1  # the two tables, four kernels a layer, the untied softmax kernel
    assert model.get_config()["initialization"] == "gpt2"
    assert build_model(model.get_config()).initialization == "gpt2"
    uniform = TransformerLanguageModel(**options)  # the default: uniform(-init_scale, init_scale)
    assert "initialization" not in uniform.get_config()
    assert max(float(np.abs(v.numpy()).max()) for v in uniform.variables if v.shape.rank == 2) <= 0.02
    with pytest.raises(ValueError, match="initialization 'normal' is not one of uniform, gpt2"):
        TransformerLanguageModel(initialization="normal", **options)


def test_without_biases_the_model_has_nanogpts_parameters_and_computes_as_with_zero_biases():
    """use_bias=False (with output_bias=False): nanoGPT's bias=False model, its 27 tensors and 804,096
    weights for the CPU recipe's shape; the outputs equal those of a model with biases at zero and the same
    other weights."""
    options = dict(vocab_size=65, hidden_size=128, num_layers=4, num_heads=4, max_positions=64, init_scale=0.02,
                   tie_weights=True, output_bias=False)
    bare = TransformerLanguageModel(use_bias=False, **options)
    names = [v.name for v in bare.trainable_variables]
    assert not [n for n in names if n.endswith(("bias:0", "offset:0"))]
    assert len(names) == 27 and sum(v.shape.num_elements() for v in bare.trainable_variables) == 804_096
    assert bare.get_config()["use_bias"] is False and not bare.is_gpt2
    assert not build_model(bare.get_config()).decoder.layers[3].ffn_outer.use_bias
    full = TransformerLanguageModel(**options)
    kept = {v.name: v for v in bare.variables}
    for variable in full.variables:
        variable.assign(kept[variable.name] if variable.name in kept else tf.zeros_like(variable))
    ids = _ids(2, 7)
    np.testing.assert_allclose(bare(ids)[0], full(ids)[0], rtol=1e-5, atol=1e-6)
    assert "use_bias" not in full.get_config()


def test_config_tiny_transformer_builds_nanogpts_model():
    """Every model key of nanoGPT's CPU recipe reaches the model (an ignored activation would train tanh GELU)."""
    from lmkit.config import load_config
    model = build_model(load_config("config_tiny_transformer").model_config())
    layer = model.decoder.layers[0]
    assert (layer.activation, layer.use_bias, model.initialization, model.projection.bias) == (
        "gelu_exact", False, "gpt2", None)
    config = model.get_config()
    assert (config["activation"], config["use_bias"], config["initialization"]) == ("gelu_exact", False, "gpt2")
    assert build_model(config).decoder.layers[3].activation == "gelu_exact"
    with pytest.raises(ValueError, match="activation 'swish' is not one of gelu, gelu_exact, relu"):
        TransformerLanguageModel(vocab_size=VOCAB, hidden_size=8, num_heads=2, activation="swish")
