"""The checks of a whole config: each bad value or mix of settings is one clear error naming the key and the fix.

The run's plan (epochs, steps or tokens, exactly one; its warmup in one unit), the data's kind, files and
tokenizer, pairs, LoRA. What a model's family checks is in tests/models (its CONFIG_CHECK).
"""
import pytest

from lmkit.config import ConfigError, TrainConfig, load_config

BASE = dict(model="transformer", vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, max_positions=16,
            init_scale=0.02, dropout=0.0, batch_size=8, num_steps=16, learning_rate=1e-3, max_grad_norm=1.0,
            schedule="cosine")


def _cfg(**kw):
    return TrainConfig.from_dict({**BASE, **kw})


@pytest.mark.parametrize("keys, message", [
    (dict(num_epochs=2, max_steps=100), r"num_epochs = 2 and max_steps = 100 both plan the run's length"),
    (dict(max_steps=100, max_tokens=10**6), r"max_steps = 100 and max_tokens = 1000000 both plan"),
    (dict(), r"the run has no length: set num_epochs .*, max_steps .* or max_tokens"),
    (dict(max_steps=100, warmup_steps=10, warmup_epochs=0.5), r"warmup_steps = 10 and warmup_epochs = 0.5 both"),
    (dict(max_steps=100, schedule_params={"total_epochs": 3}), r"drop schedule_params total_epochs = 3"),
    (dict(max_steps=100, min_lr=1e-4, schedule_params={"end_lr": 0.0}), r"min_lr = 0.0001 and schedule_params"),
    (dict(max_steps=-1), r"max_steps = -1 must be >= 0"),
    (dict(num_epochs=1, eval_every_steps=-5), r"eval_every_steps = -5 must be >= 0"),
])
def test_each_mix_or_bad_value_is_one_clear_error(keys, message):
    with pytest.raises(ConfigError, match=message):
        _cfg(**keys)


def test_tokens_plan_a_language_model_not_pairs():
    with pytest.raises(ConfigError, match="max_tokens = 1000 plans a language model's run"):
        _cfg(model="transformer_seq2seq", data="pairs", source_file="s", target_file="t", max_tokens=1000)


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


@pytest.mark.parametrize("overrides, message", [
    (dict(data="text"), "train_file = '' is empty but data = 'text' needs one"),
    (dict(train_file="a.txt"), "train_file = 'a.txt' is set but data = 'ptb'"),
    (dict(tokenizer="char"), "tokenizer = 'char' applies to data = 'text'"),
    (dict(data="text", train_file="a", tokenizer="bpe"), "tokenizer = 'bpe' is not one of word"),
    (dict(data="csv"), "data = 'csv' is not one of ptb, text"),
    (dict(data="text", train_file="a", spm_model_type="wordpiece"), "spm_model_type = 'wordpiece'"),
    (dict(data="text", train_file="a", sampling="offsets"), "sampling = 'offsets' is not one of windows, random"),
    (dict(use_horovod=True, backend="native"), "use_horovod = True means backend = 'horovod'"),
])
def test_bad_data_keys_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("config_small", overrides)
