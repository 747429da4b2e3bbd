"""The config of a run: built from any spelling, read by section, its derived values (the plan's steps, the
tokens a step, the pairs' length limits) and its round trip through config.json."""
import pytest

from lmkit.config import ConfigError, TrainConfig, load_config
from lmkit.core.errors import UsageError

BASE = dict(model="transformer", vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, max_positions=16,
            init_scale=0.02, dropout=0.0, batch_size=8, num_steps=16, learning_rate=1e-3, max_grad_norm=1.0,
            schedule="cosine")
PAIRS = {"source_file": "s.txt", "target_file": "t.txt"}


def _cfg(**kw):
    return TrainConfig.from_dict({**BASE, **kw})


def test_a_plan_in_steps_or_tokens_counts_the_global_batch():
    assert _cfg(num_epochs=3).planned_steps is None and _cfg(num_epochs=3).epochs_to_run(10) == 3
    steps = _cfg(max_steps=25)
    assert steps.planned_steps == 25 and steps.epochs_to_run(10) == 3  # the third epoch cut short
    assert _cfg(max_tokens=8 * 16 * 4).planned_steps == 4  # whole steps of 128 tokens
    assert _cfg(max_tokens=8 * 16 * 4 + 1).planned_steps == 5  # a part of a step is a step


def test_config_error_is_a_usage_error_and_json_round_trips():
    assert issubclass(ConfigError, UsageError)
    cfg = load_config("config_transformer")
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.replace(batch_size=64).data.batch_size == 64
    with pytest.raises(ConfigError, match="hidden_size 256 is not divisible by num_heads 3; use a multiple of 3"):
        cfg.replace(num_heads=3)


def test_the_seq2seq_configs_train_on_pairs_with_the_flags():
    cfg = load_config("config_seq2seq", {"data": "pairs", **PAIRS})
    assert (cfg.model.name, cfg.data.share_vocab, cfg.model["share_embeddings"]) == ("transformer_seq2seq", True, True)
    assert (cfg.source_length_limit, cfg.target_length_limit) == (64, 63)  # 0: what the model holds
    assert cfg.model_config()["max_source_positions"] == 64
    rnn = load_config("config_seq2seq_rnn", {"data": "pairs", **PAIRS, "max_target_length": 20})
    assert rnn.target_length_limit == 20 and rnn.model_config()["attention"] == "luong"
