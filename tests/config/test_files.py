"""Config files found by name or path and loaded: the shipped configs, a bad key in a file, a shadowed name."""
import os

import numpy as np
import pytest

from lmkit.config import ConfigError, TrainConfig, available_configs, load_config

ZAREMBA = {
    # name: (init_scale, epochs, hidden, dropout, num_steps, clip, decay, decay start)
    "config_small": (0.1, 13, 200, 0.0, 20, 5.0, 0.5, 4),
    "config_medium": (0.05, 39, 650, 0.5, 35, 5.0, 0.8, 6),
    "config_large": (0.04, 55, 1500, 0.65, 35, 10.0, 1 / 1.15, 15),
}


@pytest.mark.parametrize("name", sorted(ZAREMBA))
def test_ptb_configs_have_the_zaremba_values(name):
    cfg = load_config(name)
    model, opt = cfg.model, cfg.optimization
    init, epochs, hidden, dropout, steps, clip, decay, start = ZAREMBA[name]
    assert (model.name, model["num_layers"], model["forget_bias"], cfg.data.batch_size) == ("lstm", 2, 0.0, 20)
    assert (opt.optimizer, opt.learning_rate, model["vocab_size"]) == ("sgd", 1.0, 10000)
    assert model["init_scale"] == init and opt.num_epochs == epochs and model["hidden_size"] == hidden
    assert model["dropout"] == dropout and cfg.data.num_steps == steps and opt.max_grad_norm == clip
    assert opt.lr_decay == pytest.approx(decay) and opt.lr_decay_start_epoch == start


def test_every_shipped_config_loads():
    names = available_configs()
    assert {"config_small", "config_medium", "config_large", "config_transformer"} <= set(names)
    for name in names:
        assert isinstance(load_config(name), TrainConfig)


def _write(tmp_path, text):
    path = tmp_path / "cfg.py"
    path.write_text(text)
    return str(path)


BASE = open(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "config_small.py")).read()


def test_unknown_key_is_named_with_a_suggestion(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key 'hiden_size'; did you mean 'hidden_size'"):
        load_config(_write(tmp_path, BASE + "\nhiden_size = 3\n"))


def test_missing_key_is_named(tmp_path):
    text = "\n".join(line for line in BASE.splitlines() if not line.lstrip().startswith("num_steps"))
    with pytest.raises(ConfigError, match="missing required key 'num_steps'"):
        load_config(_write(tmp_path, text))


def test_unknown_config_name_lists_the_available_ones():
    with pytest.raises(ConfigError, match=r"unknown config 'config_smal'; did you mean 'config_small'"):
        load_config("config_smal")


def test_a_local_config_that_shadows_a_built_in_one_is_named_once(tmp_path, monkeypatch, capsys):
    """./configs/config_small.py of an untrusted checkout runs as code: lmkit says whose file it runs."""
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "config_small.py").write_text(
        open(os.path.join(os.path.dirname(__import__("lmkit").__file__), "configs", "config_small.py")).read()
        + "\nhidden_size = 7\n")
    monkeypatch.chdir(tmp_path)
    assert load_config("config_small").model["hidden_size"] == 7
    err = capsys.readouterr().err
    assert err.count("shadows lmkit's built-in config_small") == 1
    assert str(tmp_path / "configs" / "config_small.py") in err
    assert load_config("config_medium").model["hidden_size"] == 650  # lmkit's own: no note
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    load_config("config_small")
    assert capsys.readouterr().err == ""  # rank 0 alone says it


def test_config_gpt2_124m_is_gpt2_small_planned_as_nanogpt_plans_it():
    from lmkit.models import build_model
    cfg = load_config("config_gpt2_124m", {"data": "text", "train_file": "x.txt", "tokenizer": "hf:gpt2"})
    # Hugging Face's GPT-2 small has 124,439,808 parameters with 50,257 ids; 47 padded rows of 768 add 36,096.
    model = build_model(cfg.model_config())
    assert sum(int(np.prod(v.shape)) for v in model.trainable_variables) == 124_439_808 + 47 * 768
    opt = cfg.optimization
    assert (cfg.planned_steps, cfg.tokens_per_step, opt.warmup_steps, opt.min_lr) == (600_000, 491_520, 2000, 6e-5)
    assert cfg.data.batch_size // opt.grad_accum_steps == 12
    assert cfg.data.num_steps == cfg.model["max_positions"] == 1024
