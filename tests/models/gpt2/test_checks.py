"""The transformer family's checks of a training config (its CONFIG_CHECK), called when a config is built."""
import dataclasses

import pytest

from lmkit.config import ConfigError, load_config
from lmkit.models.gpt2.checks import check_config
from tests.models.test_protocols import _config


def test_the_heads_the_window_and_the_embeddings_are_checked():
    with pytest.raises(ConfigError, match="hidden_size 8 is not divisible by num_heads 3; use a multiple of 3"):
        _config("transformer", num_heads=3)
    with pytest.raises(ConfigError, match="num_steps = 20 exceeds max_positions = 16; raise max_positions"):
        _config("transformer", num_steps=20)
    with pytest.raises(ConfigError, match="embedding_dim = 5 must be 0 or hidden_size = 8"):
        _config("gpt2", embedding_dim=5)
    assert _config("transformer", embedding_dim=8).model["embedding_dim"] == 8
    assert _config("llama", num_steps=20).data.num_steps == 20  # another family: rotary positions, no window check


def test_a_config_that_passes_passes_the_check_called_alone():
    cfg = load_config("config_transformer")
    assert check_config(cfg, "config") is None
    longer = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, num_steps=256))  # built unchecked
    with pytest.raises(ConfigError, match=r"^mine: num_steps = 256 exceeds max_positions = 128"):
        check_config(longer, "mine")
