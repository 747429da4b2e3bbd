"""The recurrent family's checks of a training config (its CONFIG_CHECK), called when a config is built."""
import pytest

from lmkit.config import ConfigError, load_config
from tests.models.test_protocols import _config


def test_a_stated_embedding_dim_must_fit_tied_weights():
    with pytest.raises(ConfigError, match="embedding_dim = 5 must equal hidden_size = 8 when tie_weights = True"):
        _config("lstm", embedding_dim=5, tie_weights=True)
    with pytest.raises(ConfigError, match="embedding_dim = 5 must equal hidden_size = 8 when tie_weights = True"):
        _config("gru", embedding_dim=5, tie_weights=True)
    assert _config("lstm", embedding_dim=5).model["embedding_dim"] == 5  # untied: any size
    assert _config("lstm", embedding_dim=8, tie_weights=True).model["tie_weights"] is True


def test_the_shipped_configs_pass_without_importing_the_model():
    """config_small states no tie_weights: the check reads it only when a stated embedding_dim needs it."""
    assert load_config("config_small").model.arguments.get("tie_weights") is None
