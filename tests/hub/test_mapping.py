"""The shared pieces of the families' config mappings (lmkit.hub.mapping): renamed keys both ways, and rotary
settings in the spellings of transformers 4 and 5."""
import pytest

from lmkit.core.errors import UsageError
from lmkit.hub.mapping import renamed, renamed_back, rope_in, rope_out

PAIRS = (("n_embd", "hidden_size"), ("n_layer", "num_layers"))


def test_renamed_keys_go_both_ways():
    config = {"n_embd": 32, "n_layer": 2, "other": 1}
    arguments = renamed(config, PAIRS)
    assert arguments == {"hidden_size": 32, "num_layers": 2}
    assert renamed_back(arguments, PAIRS) == {"n_embd": 32, "n_layer": 2}
    with pytest.raises(KeyError):  # a required key (checked by the converter's sizes first)
        renamed({"n_embd": 32}, PAIRS)


LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


@pytest.mark.parametrize("config, expected", [
    ({}, (10000.0, None)),
    ({"rope_theta": 500}, (500.0, None)),
    ({"rope_theta": 500.0, "rope_scaling": {"rope_type": "llama3", **LLAMA3}}, (500.0, {"rope_type": "llama3",
                                                                                         **LLAMA3})),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, (10000.0, {"rope_type": "linear", "factor": 2.0})),
    ({"rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}}, (1e6, None)),  # transformers 5
    ({"rope_parameters": {"rope_theta": 1e4, "rope_type": "linear", "factor": 4.0}},
     (1e4, {"rope_type": "linear", "factor": 4.0})),
])
def test_rotary_settings_of_either_transformers_version(config, expected):
    theta, scaling = rope_in(config, "config.json")
    assert (theta, scaling) == expected
    assert rope_in(rope_out(theta, scaling), "config.json") == expected  # written back, read again


@pytest.mark.parametrize("config, message", [
    ({"rope_theta": -1.0}, r"config\.json: rope_theta = -1\.0 must be a number > 0"),
    ({"rope_theta": True}, r"config\.json: rope_theta = True must be a number > 0"),
    ({"rope_parameters": {"rope_theta": 1e4, "rope_type": "yarn", "factor": 4.0}},
     r"config\.json: rope type 'yarn' is not supported; lmkit computes default, linear, llama3"),
])
def test_rotary_settings_lmkit_does_not_compute_are_named(config, message):
    with pytest.raises(UsageError, match=message):
        rope_in(config, "config.json")
