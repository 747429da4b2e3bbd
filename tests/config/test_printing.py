"""``lmkit train --print_config``: the resolved config as a config file, which loads back as the same config."""
import os
import sys

import pytest

from lmkit.cli import train
from lmkit.config import available_configs, format_config, load_config
from tests.helpers import run

PAIRS = {"data": "pairs", "source_file": "s.txt", "target_file": "t.txt"}


def _printed(capsys, *flags):
    assert train.main([*flags, "--print_config"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(set(available_configs()) - {"config_seq2seq", "config_seq2seq_rnn"}))
def test_every_shipped_config_prints_and_loads_back_the_same(name, tmp_path, capsys):
    text = _printed(capsys, "--config", name, "--set", "seed=5")
    path = tmp_path / "printed.py"
    path.write_text(text)
    again = load_config(str(path))
    assert again == load_config(name, {"seed": 5}) and again.run.seed == 5
    assert again.to_dict() == load_config(name, {"seed": 5}).to_dict()
    assert format_config(again) == format_config(load_config(name, {"seed": 5}))


def test_the_flags_and_set_are_in_the_printed_config(tmp_path, capsys):
    text = _printed(capsys, "--config", "config_seq2seq_rnn", "--source_file", "s.txt", "--target_file", "t.txt",
                    "--set", "model.attention=bahdanau", "--set", "optimization.learning_rate=0.5",
                    "--set", "batch_size=16", "--precision", "mixed_bfloat16", "--backend", "native")
    assert text.startswith('"""The config of `lmkit train --config config_seq2seq_rnn`')
    assert "model = dict(\n    name='rnn_seq2seq',\n" in text and "    attention='bahdanau',\n" in text
    assert "    dropout=0.1,\n" in text and "keep_prob" not in text and "model_params" not in text
    assert "data = dict(\n    kind='pairs',\n    batch_size=16," in text
    assert "    learning_rate=0.5,\n" in text and "    precision='mixed_bfloat16',\n" in text
    path = tmp_path / "printed.py"
    path.write_text(text)
    cfg = load_config(str(path))
    assert cfg == load_config("config_seq2seq_rnn", {**PAIRS, "model.attention": "bahdanau", "batch_size": 16,
                                                     "learning_rate": 0.5, "precision": "mixed_bfloat16",
                                                     "backend": "native"})
    assert cfg.model["attention"] == "bahdanau" and cfg.source_length_limit == 64


def test_the_model_section_holds_what_the_constructor_takes(capsys):
    lstm = _printed(capsys, "--config", "config_small")
    model = lstm.split("model = dict(")[1].split("\n)")[0]
    for key in ("vocab_size", "hidden_size", "num_layers", "init_scale", "dropout", "forget_bias"):
        assert f"    {key}=" in model
    for key in ("num_heads", "max_positions", "ffn_dim", "share_embeddings", "keep_prob"):  # a transformer's keys
        assert f"    {key}=" not in model, model
    bart = load_config("config_seq2seq", PAIRS)
    assert "    embedding_dim=" not in format_config(bart).split("\n)")[0]  # BART takes none


def test_print_config_exits_0_and_touches_nothing(tmp_path):
    res = run([sys.executable, "-m", "lmkit", "train", "--config", "config_transformer", "--train_file",
               "nope.txt", "--print_config"], timeout=120, cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "model = dict(\n    name='transformer'," in res.stdout and "    train_file='nope.txt'," in res.stdout
    assert os.listdir(tmp_path) == []  # no runs/, no data/


def test_print_config_reports_a_bad_flag_as_training_would(capsys):
    with pytest.raises(Exception, match=r"unknown key 'lerning_rate' in section optimization"):
        train.main(["--config", "config_small", "--set", "optimization.lerning_rate=1", "--print_config"])
