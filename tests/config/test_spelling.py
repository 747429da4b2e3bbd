"""Every spelling of a setting: sections, dotted keys, 0.x's flat keys and its deprecated ones."""
import os

import pytest

import lmkit
from lmkit.config import ConfigError, TrainConfig, load_config, spelling

# config_small as lmkit 0.2 wrote it: every key flat.
FLAT_SMALL = """
model = "lstm"
vocab_size = 10000
hidden_size = 200
num_layers = 2
forget_bias = 0.0
init_scale = 0.1
keep_prob = 1.0
batch_size = 20
num_steps = 20
num_epochs = 13
optimizer = "sgd"
learning_rate = 1.0
max_grad_norm = 5.0
lr_decay = 0.5
lr_decay_start_epoch = 4
"""

SMALL = dict(model="lstm", vocab_size=50, hidden_size=8, num_layers=1, init_scale=0.1, keep_prob=0.8,
             batch_size=4, num_steps=5, num_epochs=1, learning_rate=1.0, max_grad_norm=5.0)


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    """Each test sees its own first warning (they come once a process)."""
    monkeypatch.setattr(spelling, "_warned", set())


def _write(tmp_path, text, name="cfg.py"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_flat_0_2_config_file_is_the_sectioned_config(tmp_path, capsys):
    flat = load_config(_write(tmp_path, FLAT_SMALL))
    sectioned = load_config("config_small")
    assert flat == sectioned and flat.to_dict() == sectioned.to_dict()
    assert flat.model_config() == sectioned.model_config()
    assert "keep_prob is deprecated; write the model's dropout = 1 - keep_prob: dropout=0.0" in capsys.readouterr().err


def test_flat_dotted_and_sectioned_keys_give_the_same_config():
    flat = TrainConfig.from_dict(dict(SMALL, lr_scaling="sqrt", seed=3, precision="mixed_bfloat16"))
    sectioned = TrainConfig.from_dict({
        "model": {"name": "lstm", "vocab_size": 50, "hidden_size": 8, "num_layers": 1, "init_scale": 0.1,
                  "dropout": 0.2},
        "data": {"batch_size": 4, "num_steps": 5},
        "optimization": {"num_epochs": 1, "learning_rate": 1.0, "max_grad_norm": 5.0, "lr_scaling": "sqrt"},
        "compute": {"precision": "mixed_bfloat16"},
        "run": {"seed": 3}})
    dotted = TrainConfig.from_dict({**{k: v for k, v in SMALL.items() if k not in ("keep_prob", "seed")},
                                    "model.dropout": 0.2, "optimization.lr_scaling": "sqrt", "run.seed": 3,
                                    "compute.precision": "mixed_bfloat16"})
    assert flat == sectioned == dotted
    assert flat.to_dict() == sectioned.to_dict() == dotted.to_dict()
    # Code reads the sections; the flat names are spellings of files and flags only.
    assert sectioned.optimization.lr_scaling == "sqrt" and sectioned.model["dropout"] == 0.2
    assert (sectioned.compute.precision, sectioned.run.seed) == ("mixed_bfloat16", 3)
    for flat in ("lr_scaling", "keep_prob", "dropout", "seed", "model_params", "hidden_size"):
        assert not hasattr(sectioned, flat), flat
    # The model section is its name and arguments (no comparison with a string); the data section keeps its kind.
    assert sectioned.model.name == "lstm" and str(sectioned.model) == "lstm" and sectioned.model != "lstm"
    assert sectioned.data == "ptb" and sectioned.data != "text" and sectioned.data.kind == "ptb"


def test_replace_takes_every_spelling():
    cfg = TrainConfig.from_dict(SMALL)
    assert cfg.replace(learning_rate=0.5) == cfg.replace(optimization={"learning_rate": 0.5}) \
        == cfg.replace(**{"optimization.learning_rate": 0.5})
    assert cfg.replace(learning_rate=0.5).optimization.learning_rate == 0.5 and cfg.optimization.learning_rate == 1.0
    assert cfg.replace(keep_prob=0.5).model["dropout"] == 0.5 == cfg.replace(**{"model.dropout": 0.5}).model["dropout"]
    gru = cfg.replace(model="gru").model
    assert gru.name == "gru" and gru["hidden_size"] == 8
    with pytest.raises(ConfigError, match="unknown key 'lerning_rate'; did you mean 'learning_rate'"):
        cfg.replace(lerning_rate=0.5)


@pytest.mark.parametrize("values, message", [
    ({"optimization": {"lerning_rate": 0.5}},
     r"unknown key 'lerning_rate' in section optimization; did you mean 'learning_rate'\?"),
    ({"optimization.lerning_rate": 0.5}, r"unknown key 'lerning_rate' in section optimization"),
    ({"data": {"batch_sise": 4}}, r"unknown key 'batch_sise' in section data; did you mean 'batch_size'\?"),
    ({"adapters": {"rank": 4}}, r"unknown key 'rank' in section adapters; did you mean 'lora_rank'\?"),
    ({"optimisation.learning_rate": 0.5}, r"unknown section 'optimisation' in 'optimisation.learning_rate'; "
                                          r"did you mean 'optimization'\?"),
    ({"compute": "float32"}, r"compute = 'float32' must be a dict of its settings: compute = dict\(\.\.\.\)"),
    ({"model": {"name": 3}}, r"model = 3 must be a string"),
    ({"model": {"name": "lstm", "num_layers": 2.5}}, r"num_layers = 2.5 must be an integer"),
])
def test_an_unknown_or_bad_key_names_the_key_and_its_section(values, message):
    with pytest.raises(ConfigError, match=message):
        load_config("config_small", values)


def test_a_sectioned_config_missing_a_required_key_names_it(tmp_path):
    text = "model = dict(name='lstm', vocab_size=10, hidden_size=8, init_scale=0.1, dropout=0.0)\n" \
           "data = dict(batch_size=4, num_steps=5)\n" \
           "optimization = dict(num_epochs=1, learning_rate=1.0, max_grad_norm=5.0)\n"
    with pytest.raises(ConfigError, match=r"missing required key 'num_layers'; add `num_layers = \.\.\.` "
                                          r"\(or num_layers=\.\.\. in model = dict\(\.\.\.\)"):
        load_config(_write(tmp_path, text))


def test_a_flat_key_after_a_section_sets_that_field(tmp_path):
    text = open(os.path.join(os.path.dirname(lmkit.__file__), "configs", "config_small.py")).read()
    cfg = load_config(_write(tmp_path, text + "\nhidden_size = 7\nlearning_rate = 0.25\n"))
    assert (cfg.model["hidden_size"], cfg.optimization.learning_rate, cfg.model["num_layers"]) == (7, 0.25, 2)


def test_a_deprecated_key_is_named_once_with_its_new_spelling(tmp_path, capsys):
    path = _write(tmp_path, FLAT_SMALL.replace("keep_prob = 1.0", "keep_prob = 0.9")
                  + "model_params = {'embedding_dim': 0}\n")
    first = load_config(path, {"keep_prob": 0.8})
    load_config(path)
    err = capsys.readouterr().err
    assert err.count("keep_prob is deprecated") == 1, err
    assert "dropout=0.1 in model = dict(...), or --set model.dropout=0.1" in err
    assert err.count("model_params is deprecated") == 1
    assert "its keys are arguments of the model: write them in model = dict(...)" in err
    assert first.model["dropout"] == pytest.approx(0.2)  # the override's keep_prob, 0.8


def test_deprecated_keys_warn_only_where_a_person_wrote_them(capsys):
    """from_dict and replace (a stored config.json, lmkit's own code) take 0.x's keys without a word."""
    cfg = TrainConfig.from_dict(dict(SMALL, model_params={"embedding_dim": 0}))
    cfg.replace(keep_prob=0.5)
    assert capsys.readouterr().err == ""


def test_a_deprecated_key_warns_on_rank_0_only(monkeypatch, capsys):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    load_config("config_small", {"keep_prob": 0.9})
    assert capsys.readouterr().err == ""


def test_keep_prob_and_dropout_convert_both_ways_exactly():
    for keep_prob in (1.0, 0.9, 0.8, 0.7, 0.65, 0.5, 0.35, 0.1):
        cfg = TrainConfig.from_dict(dict(SMALL, keep_prob=keep_prob))
        dropout = cfg.model_config()["dropout"]
        assert dropout == cfg.model["dropout"] and round(1.0 - dropout, 12) == keep_prob  # back exactly
        assert "keep_prob" not in cfg.model_config() and "keep_prob" not in cfg.to_json()
    assert TrainConfig.from_dict(dict(SMALL, keep_prob=0.9)).model["dropout"] == 0.1
    with pytest.raises(ConfigError, match=r"dropout = 1.0 must be in \[0, 1\)"):
        TrainConfig.from_dict({**{k: v for k, v in SMALL.items() if k != "keep_prob"}, "model.dropout": 1.0})


def test_use_horovod_is_still_the_backend():
    assert load_config("config_small", {"use_horovod": True}).distribution.backend == "horovod"
    assert load_config("config_small", {"use_horovod": False}).distribution.backend == "native"
