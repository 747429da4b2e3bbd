"""The model section: the name and the stated constructor arguments; an unstated one reads the constructor's
default (not 0.x's shape defaults), through the registry, only when it is read."""
import subprocess
import sys

import pytest

from lmkit.config import ConfigError, ModelConfig, load_config

LLAMA = {"name": "llama", "vocab_size": 50, "hidden_size": 16, "num_layers": 1, "dropout": 0.0}


def test_a_stated_argument_reads_as_stated_an_unstated_one_as_the_constructors_default():
    model = ModelConfig.from_dict(LLAMA)
    assert model.name == "llama" and str(model) == "llama" and model["hidden_size"] == 16
    assert model["max_positions"] == 2048 and model["rope_theta"] == 10000.0  # LlamaLanguageModel's defaults
    assert model.get("max_positions", 1) == 2048 and model.get("forget_bias", "none") == "none"
    with pytest.raises(KeyError, match="the config states no 'forget_bias' and the constructor takes no such"):
        model["forget_bias"]
    seq2seq = ModelConfig.from_dict({"name": "rnn_seq2seq", "hidden_size": 8})
    with pytest.raises(KeyError, match="states no 'source_vocab_size' and the constructor has no default for it"):
        seq2seq["source_vocab_size"]
    assert seq2seq["max_source_positions"] == 256


def test_the_model_is_built_with_every_constructor_argument_and_nothing_else():
    model = ModelConfig.from_dict({**LLAMA, "forget_bias": 1.0, "attention_blocks": 2})  # a flat config's stray key
    built = model.model_config()
    assert built["model"] == "llama" and built["attention_blocks"] == 2 and built["max_positions"] == 2048
    assert "forget_bias" not in built and "name" not in built and "keep_prob" not in built
    resolved = model.resolved()  # as config.json and --print_config write it: the stray key kept
    assert resolved["name"] == "llama" and resolved["forget_bias"] == 1.0 and resolved["num_kv_heads"] == 0
    assert list(resolved)[:3] == ["name", "vocab_size", "hidden_size"]  # the stated arguments first
    # The arguments a name fixes are the name's (gpt2: GPT-2's architecture), not the section's to state.
    assert "tie_weights" not in ModelConfig.from_dict({"name": "gpt2", "hidden_size": 8}).model_config()


def test_two_sections_are_equal_when_the_model_is_the_same_a_default_stated_or_not():
    model = ModelConfig.from_dict(LLAMA)
    assert model == ModelConfig.from_dict({**LLAMA, "max_positions": 2048})
    assert model != ModelConfig.from_dict({**LLAMA, "max_positions": 512})
    assert model != ModelConfig.from_dict({**LLAMA, "name": "gemma"})
    assert model != "llama"  # a section is not its name: compare model.name


def test_the_flat_model_keys_are_type_checked_when_the_config_loads():
    with pytest.raises(ConfigError, match="num_layers = 2.5 must be an integer"):
        ModelConfig.from_dict({**LLAMA, "num_layers": 2.5})
    with pytest.raises(ConfigError, match="model = 3 must be a string"):
        ModelConfig.from_dict({**LLAMA, "name": 3})
    with pytest.raises(ConfigError, match="missing required key 'model'"):
        ModelConfig.from_dict({"hidden_size": 8})


def test_a_config_that_states_what_its_checks_read_loads_without_tensorflow():
    code = ("import sys\nfrom lmkit.config import load_config, names\n"
            "names.models(); names.tokenizers(); names.backends(); names.samplings()\n"
            "for name in ('config_small', 'config_transformer', 'config_tiny_transformer'):\n"
            "    load_config(name)\n"
            "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'\n"
            "load_config('config_small').model['tie_weights']  # unstated: the class is imported to read it\n"
            "assert 'tensorflow' in sys.modules\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert load_config("config_small").model["tie_weights"] is False
