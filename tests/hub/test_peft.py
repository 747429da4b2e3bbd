"""LoRA adapters as PEFT folders (lmkit.hub.peft), without peft: the names and layouts PEFT reads, and a folder
read back onto a fresh model of the base computes what the run computed. (tests/models/gemma and llama load
the written folders with peft itself.)"""
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from safetensors.numpy import load_file, save_file

from lmkit import distributed as dist
from lmkit.core.errors import UsageError
from lmkit.hub.converters import converter_for
from lmkit.hub.peft import ADAPTER_CONFIG, ADAPTER_WEIGHTS, export_adapters, load_adapters
from lmkit.layers.lora import add_lora, lora_of
from lmkit.models import build_model

LLAMA = dict(model="llama", vocab_size=23, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1, ffn_dim=24,
             max_positions=16)
IDS = tf.constant([[1, 5, 7, 2, 9]])


def base():
    dist.init(backend="local")
    tf.random.set_seed(0)
    return build_model(LLAMA)


@pytest.fixture()
def written(tmp_path):
    """(the adapted model's logits, the PEFT folder of its adapters)."""
    model = base()
    add_lora(model, rank=2, alpha=4.0, targets=("query", "value", "down"))
    for i, adapter in enumerate(lora_of(model).adapters.values()):  # B starts at zero: moved
        adapter.b.assign(tf.random.stateless_normal(adapter.b.shape, [i, 1], stddev=0.5))
    out = str(tmp_path / "adapters")
    assert export_adapters(converter_for("llama"), model, "/base/folder", out) == [ADAPTER_CONFIG, ADAPTER_WEIGHTS]
    return model(IDS)[0].numpy(), out


def test_the_folder_holds_the_adapters_as_peft_names_and_lays_them_out(written):
    _, out = written
    with open(os.path.join(out, ADAPTER_CONFIG)) as f:
        config = json.load(f)
    assert (config["peft_type"], config["task_type"]) == ("LORA", "CAUSAL_LM")
    assert (config["r"], config["lora_alpha"]) == (2, 4.0)
    assert config["target_modules"] == ["down_proj", "q_proj", "v_proj"]
    assert config["base_model_name_or_path"] == "/base/folder"
    tensors = load_file(os.path.join(out, ADAPTER_WEIGHTS))
    assert len(tensors) == 2 * 3 * 2  # A and B of 3 layers in each of 2 blocks
    assert tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].shape == (2, 16)  # [rank, in]
    assert tensors["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"].shape == (16, 2)  # [out, rank]


def test_a_folder_read_back_onto_the_base_computes_the_runs_logits(written):
    logits, out = written
    model = base()
    before = model(IDS)[0].numpy()
    lora = load_adapters(converter_for("llama"), model, out)
    assert (lora.rank, lora.alpha, len(lora.adapters)) == (2, 4.0, 6)
    np.testing.assert_allclose(model(IDS)[0].numpy(), logits, rtol=1e-5, atol=1e-5)
    assert np.abs(logits - before).max() > 1e-3  # the adapters change the logits: the test tells them apart


def test_a_run_without_adapters_and_folders_lmkit_does_not_read_are_named(written, tmp_path):
    _, out = written
    with pytest.raises(UsageError, match=r"export --format peft writes LoRA adapters, and this run has none"):
        export_adapters(converter_for("llama"), base(), None, str(tmp_path / "none"))
    assert not (tmp_path / "none").exists()
    with open(os.path.join(out, ADAPTER_CONFIG)) as f:
        config = json.load(f)
    tensors = load_file(os.path.join(out, ADAPTER_WEIGHTS))
    cases = [({**config, "use_dora": True}, tensors, r"use_dora = True is not supported"),
             ({**config, "peft_type": "IA3"}, tensors, r"peft_type 'IA3' is not LORA"),
             (config, {**tensors, "base_model.model.model.layers.9.self_attn.q_proj.lora_A.weight": np.zeros(
                 [2, 16], np.float32)}, r"the adapters of model\.layers\.9\.self_attn\.q_proj fit no layer of lmkit's "
                                        r"llama"),
             ({**config, "r": 4}, tensors, r"model\.layers\.0\.mlp\.down_proj's lora_A / lora_B do not fit r = 4")]
    for i, (bad_config, bad_tensors, message) in enumerate(cases):
        bad = tmp_path / f"bad{i}"
        bad.mkdir()
        (bad / ADAPTER_CONFIG).write_text(json.dumps(bad_config))
        save_file(bad_tensors, str(bad / ADAPTER_WEIGHTS))
        model = base()
        with pytest.raises(UsageError, match=message):
            load_adapters(converter_for("llama"), model, str(bad))
        assert lora_of(model) is None  # nothing added
    with pytest.raises(UsageError, match=r"is not a PEFT adapter folder: \S+adapter_config\.json is missing"):
        load_adapters(converter_for("llama"), base(), str(tmp_path))
