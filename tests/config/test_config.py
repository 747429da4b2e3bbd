"""Config loading: the shipped configs and every kind of bad key."""
import os

import numpy as np
import pytest

from lmkit.config import ConfigError, TrainConfig, available_configs, load_config
from lmkit.core.errors import UsageError

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


@pytest.mark.parametrize("override, message", [
    ({"num_layers": 2.7}, "num_layers = 2.7 must be an integer"),
    ({"tie_weights": "False"}, "tie_weights = 'False' must be True or False"),
    ({"keep_prob": 1.5}, r"keep_prob = 1.5 must be in \(0, 1\]"),
    ({"model": "rnn"}, "model = 'rnn' is not one of lstm, gru, transformer"),  # the registry's names
    ({"lr_scaling": "cubic"}, "lr_scaling = 'cubic' is not one of none, linear, sqrt"),
    ({"lora_rank": 8}, "lora_rank = 8 adapts a pretrained model; pass --init_from"),
    ({"lora_rank": -1}, "lora_rank = -1 must be >= 0"),
    ({"lora_alpha": 0.0}, "lora_alpha = 0.0 must be > 0"),
    ({"lora_dropout": 1.0}, r"lora_dropout = 1.0 must be in \[0, 1\)"),
    ({"loss_reduction": "average"}, "loss_reduction = 'average' is not one of sum, mean"),
])
def test_bad_values_are_rejected_not_coerced(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("config_small", overrides=override)


def test_unknown_config_name_lists_the_available_ones():
    with pytest.raises(ConfigError, match=r"unknown config 'config_smal'; did you mean 'config_small'"):
        load_config("config_smal")


def test_config_error_is_a_usage_error_and_json_round_trips():
    assert issubclass(ConfigError, UsageError)
    cfg = load_config("config_transformer")
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.replace(batch_size=64).data.batch_size == 64
    with pytest.raises(ConfigError, match="hidden_size 256 is not divisible by num_heads 3; use a multiple of 3"):
        cfg.replace(num_heads=3)


def test_usage_errors_keep_their_type_through_tf_function():
    import tensorflow as tf

    from lmkit.core.checks import check_positive_int

    @tf.function
    def traced(x):
        check_positive_int("num_layers", 0)
        return x

    with pytest.raises(UsageError, match="num_layers 0 must be a positive integer"):
        traced(tf.constant(1))


PAIRS = {"source_file": "s.txt", "target_file": "t.txt"}


@pytest.mark.parametrize("override, message", [
    ({"data": "pairs"}, "source_file = '' is empty but data = 'pairs' needs both sides; pass --source_file"),
    ({"data": "pairs", "source_file": "s.txt"}, "target_file = '' is empty but data = 'pairs' needs both sides"),
    ({"data": "pairs", **PAIRS, "train_file": "x.txt"}, "train_file = 'x.txt' is set but data = 'pairs' reads"),
    ({"data": "pairs", **PAIRS, "valid_source_file": "v.txt"},
     "valid_target_file = '' is empty but valid_source_file is set; give both sides"),
    ({"data": "pairs", **PAIRS, "share_vocab": False}, "share_embeddings = True needs one vocabulary"),
    ({"data": "pairs", **PAIRS, "max_target_length": 64},
     r"max_target_length = 64 exceeds what the model holds: max_positions - 1 \(the start or end id\) = 63"),
    ({"data": "pairs", **PAIRS, "max_source_length": 65},
     "max_source_length = 65 exceeds what the model holds: max_source_positions = 64"),
    ({"data": "text", "train_file": "x.txt", **PAIRS}, "source_file = 's.txt' is set but data = 'text'"),
])
def test_paired_data_keys_are_checked(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("config_seq2seq", override)


def test_the_seq2seq_configs_train_on_pairs_with_the_flags():
    cfg = load_config("config_seq2seq", {"data": "pairs", **PAIRS})
    assert (cfg.model.name, cfg.data.share_vocab, cfg.model["share_embeddings"]) == ("transformer_seq2seq", True, True)
    assert (cfg.source_length_limit, cfg.target_length_limit) == (64, 63)  # 0: what the model holds
    assert cfg.model_config()["max_source_positions"] == 64
    rnn = load_config("config_seq2seq_rnn", {"data": "pairs", **PAIRS, "max_target_length": 20})
    assert rnn.target_length_limit == 20 and rnn.model_config()["attention"] == "luong"


def test_text_data_takes_every_tokenizer_and_ptb_only_words():
    for tokenizer in ("word", "sentencepiece", "char", "byte"):
        assert load_config("config_transformer", {"data": "text", "train_file": "x.txt",
                                                  "tokenizer": tokenizer}).data.tokenizer == tokenizer
        assert load_config("config_seq2seq", {"data": "pairs", **PAIRS,
                                              "tokenizer": tokenizer}).data.tokenizer == tokenizer
    with pytest.raises(ConfigError, match="tokenizer = 'char' applies to data = 'text'"):
        load_config("config_small", {"tokenizer": "char"})
    # A pretrained tokenizer for a language model trained from scratch: a folder or a Hub name.
    for tokenizer in ("hf:gpt2", "hf:/models/tokenizer", "hf:owner/name"):
        assert load_config("config_transformer", {"data": "text", "train_file": "x.txt",
                                                  "tokenizer": tokenizer}).data.tokenizer == tokenizer


TEXT = {"data": "text", "train_file": "x.txt"}


@pytest.mark.parametrize("config, override, message", [
    ("config_transformer", {**TEXT, "tokenizer": "hf"},
     r"tokenizer = 'hf' comes with a pretrained model; pass --init_from <a Hugging Face model folder>, or "
     r"--tokenizer hf:<a tokenizer folder or Hub name> to train a model from scratch"),
    ("config_transformer", {**TEXT, "tokenizer": "hf:"},
     r"tokenizer = 'hf:' is not one of word, sentencepiece, char, byte, hf, nor hf:<a Hugging Face tokenizer folder "
     r"or Hub name>"),
    ("config_transformer", {**TEXT, "tokenizer": "bpe"}, r"tokenizer = 'bpe' is not one of word, "),
    ("config_gpt2_finetune", {**TEXT, "tokenizer": "hf:gpt2", "init_from": "/models/gpt2"},
     r"tokenizer = 'hf:gpt2' trains a model from scratch, but init_from = '/models/gpt2' brings the pretrained "
     r"model's own tokenizer; drop one of them"),
    ("config_seq2seq", {"data": "pairs", **PAIRS, "tokenizer": "hf:gpt2"},
     r"tokenizer = 'hf:gpt2' is for language models; .* pairs from scratch use word, sentencepiece, char or byte"),
])
def test_a_pretrained_tokenizer_is_checked(config, override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(config, override)


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
