"""What every rank checks before the first step, and the model directory rank 0 fills."""
import os

import pytest

from lmkit.core.errors import CheckpointError, UsageError
from lmkit.models import build_model
from lmkit.train import Trainer
from tests.train.support import small_config as _config
from tests.train.support import stream as _ids
from tests.train.support import train as _train


def test_model_dir_with_another_model_shape_is_refused(tmp_path):
    model_dir = str(tmp_path / "m")
    _train(_config(keep_prob=1.0), model_dir, 1)
    before = open(os.path.join(model_dir, "config.json")).read()
    cfg = _config(keep_prob=1.0, hidden_size=24)
    with pytest.raises(CheckpointError, match="hidden_size = 16, but the config says 24"):
        _train(cfg, model_dir, 1)
    assert open(os.path.join(model_dir, "config.json")).read() == before


def test_unwritable_model_dir_and_bad_batch_are_usage_errors(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UsageError, match="is not writable"):
        _train(_config(), str(blocker / "sub"), 1)
    with pytest.raises(UsageError, match="20 ids are too few for one batch"):
        Trainer(build_model(_config().model_config()), _config(batch_size=4)).fit(_ids(20))


def test_a_stored_run_with_model_params_resumes_and_changed_adapters_are_named(tmp_path):
    """model_params (every Llama run's) compare as model_config() merges them; LoRA keys must not change."""
    from lmkit.config import load_config
    from lmkit.core.errors import CheckpointError
    from lmkit.core.fileio import atomic_write_text
    from lmkit.core.layout import CONFIG_FILE
    from lmkit.train.startup import _check_stored

    config = load_config("config_transformer", {"model_params": {"position_embedding": "sinusoid"}})
    atomic_write_text(str(tmp_path / CONFIG_FILE), config.to_json())
    _check_stored(str(tmp_path), config, None)  # the same run: no error
    for change, message in (({"model_params": {"position_embedding": "learned"}},
                             "position_embedding = 'sinusoid', but the config says 'learned'"),
                            ({"lora_alpha": 32.0}, "lora_alpha = 16.0, but the config says 32.0")):
        with pytest.raises(CheckpointError, match=message):
            _check_stored(str(tmp_path), config.replace(**change), None)
