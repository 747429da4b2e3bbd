"""lmkit.models.gemma.convert without transformers: Gemma's norm weights w load as lmkit's scale 1 + w and
export as w again, the config maps both ways, and a config lmkit does not compute is one clear error."""
import json
import os

import numpy as np
import pytest

from lmkit import distributed as dist
from lmkit.core.errors import UsageError
from lmkit.hub.export import config_json
from lmkit.hub.safetensors import save_tensors
from lmkit.models import build_model
from lmkit.models.gemma.convert import GemmaConverter

CONVERTER = GemmaConverter()

CONFIG = {"vocab_size": 13, "hidden_size": 12, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
          "head_dim": 8, "ffn_dim": 20, "max_positions": 32, "rope_theta": 500.0, "init_scale": 0.1}


def _folder(tmp_path, model, config=None):
    """A Gemma folder of ``model``'s sizes (its config.json) holding random tensors; returns (folder, tensors)."""
    folder = str(tmp_path / "gemma")
    os.makedirs(folder)
    rng = np.random.default_rng(0)
    tensors = {name: rng.normal(0.0, 0.3, value.shape).astype(np.float32)
               for name, value in CONVERTER.tensors(model).items()}
    save_tensors(tensors, os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config or _written(model), f)
    return folder, tensors


def _written(model):
    """The config.json of ``model`` as an export from scratch writes it."""
    return config_json(CONVERTER, CONVERTER.arguments(model))


def _norm_names(model):
    return [port.names[0] for port in CONVERTER.weights(model) if port.names[0].endswith("norm.weight")]


def test_norm_weights_load_as_one_plus_w_and_export_as_w(tmp_path):
    dist.init(backend="local")
    model = build_model(_keys("gemma", CONFIG))
    folder, tensors = _folder(tmp_path, model)
    names = _norm_names(model)
    assert sorted(names) == sorted(["model.norm.weight"] + [f"model.layers.{i}.{n}.weight" for i in range(2)
                                                            for n in ("input_layernorm", "post_attention_layernorm")])
    CONVERTER.load_weights(model, folder)
    scales = {"model.norm.weight": model.decoder.final_norm.scale,
              "model.layers.1.input_layernorm.weight": model.decoder.layers[1].attention_norm.scale,
              "model.layers.0.post_attention_layernorm.weight": model.decoder.layers[0].ffn_norm.scale}
    for name, scale in scales.items():
        np.testing.assert_array_equal(scale.numpy(), np.float32(1.0) + tensors[name])  # as Gemma adds, in float32
    np.testing.assert_array_equal(model.embedder.embeddings.numpy(), tensors["model.embed_tokens.weight"])
    back = CONVERTER.tensors(model)
    assert sorted(back) == sorted(tensors)
    for name in tensors:  # the other tensors as they were; the norms within the rounding of 1 + w
        if name in names:
            np.testing.assert_allclose(back[name], tensors[name], rtol=0, atol=1e-7)
            # what transformers computes from the export, 1 + w', is lmkit's scale exactly
            np.testing.assert_array_equal(np.float32(1.0) + back[name], np.float32(1.0) + tensors[name])
        else:
            np.testing.assert_array_equal(back[name], tensors[name])


def test_the_config_maps_both_ways():
    for changes in ({}, {"attention_bias": True, "tie_weights": False, "activation": "silu", "dropout": 0.1,
                         "rope_scaling": {"rope_type": "linear", "factor": 2.0}}):
        model = build_model(_keys("gemma", {**CONFIG, **changes}))
        written = _written(model)
        assert written["model_type"] == "gemma" and written["head_dim"] == 8
        assert written["architectures"] == ["GemmaForCausalLM"] and written["pad_token_id"] is None
        assert CONVERTER.model_config(written) == model.get_config()
    with pytest.raises(UsageError, match=r"embedding_scale = 1\.0: a Gemma folder multiplies the embeddings by "
                                         r"sqrt\(hidden_size\) = 3\.4641"):
        _written(build_model(_keys("gemma", {**CONFIG, "embedding_scale": 1.0})))


def test_gemmas_own_defaults_fill_the_keys_a_config_leaves_out():
    written = _written(build_model(_keys("gemma", CONFIG)))
    for key in ("head_dim", "tie_word_embeddings", "max_position_embeddings", "hidden_act", "hidden_activation"):
        del written[key]
    keys = CONVERTER.model_config(written)
    assert (keys["head_dim"], keys["tie_weights"], keys["max_positions"], keys["activation"]) == \
        (256, True, 8192, "gelu")
    assert CONVERTER.model_config({**written, "hidden_act": "gelu"})["activation"] == "gelu"  # the tanh form


@pytest.mark.parametrize("change, message", [
    ({"model_type": "llama"}, r"config\.json: model_type 'llama' is not one of gemma \(GemmaForCausalLM\)"),
    ({"hidden_size": 0}, r"config\.json: hidden_size = 0 must be a positive integer"),
    ({"hidden_act": "relu"}, r"config\.json: hidden_act 'relu' is not supported \(lmkit's gemma gates its "
                             r"feed-forward with gelu, gelu_new, gelu_pytorch_tanh, silu\)"),
    ({"hidden_activation": "gelu"}, r"config\.json: hidden_activation 'gelu' is not the gate of hidden_act "
                                    r"'gelu_pytorch_tanh'"),
    ({"use_bidirectional_attention": True}, r"config\.json: use_bidirectional_attention = true is not supported"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}},
     r"config\.json: rope type 'yarn' is not supported"),
    ({"rope_theta": -1.0}, r"config\.json: rope_theta = -1\.0 must be a number > 0"),
])
def test_a_setting_lmkit_does_not_compute_is_named(change, message, tmp_path):
    written = _written(build_model(_keys("gemma", CONFIG)))
    (tmp_path / "config.json").write_text(json.dumps({**written, **change}))
    with pytest.raises(UsageError, match=message):
        CONVERTER.read_config(str(tmp_path))


def test_weights_that_do_not_fit_are_named_and_nothing_is_assigned(tmp_path):
    dist.init(backend="local")
    folder, _ = _folder(tmp_path, build_model(_keys("gemma", CONFIG)))
    wrong = build_model(_keys("gemma", {**CONFIG, "head_dim": 4}))
    before = [v.numpy().copy() for v in wrong.variables]
    with pytest.raises(UsageError, match=r"model\.layers\.0\.self_attn\.(q|k|v|o)_proj\.weight has shape"):
        CONVERTER.load_weights(wrong, folder)
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, wrong.variables))  # the norms too


def _keys(name, arguments):
    """The mapping build_model takes: the registry name and the constructor's arguments."""
    return {"model": name, **arguments}
