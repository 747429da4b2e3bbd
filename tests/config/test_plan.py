"""A run's plan: epochs, steps or tokens, exactly one; its warmup in one unit; each mix is one clear error."""
import pytest

from lmkit.cli.train import build_parser, config_from_args
from lmkit.config import ConfigError, TrainConfig, load_config
from lmkit.core.errors import UsageError

BASE = dict(model="transformer", vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, max_positions=16,
            init_scale=0.02, dropout=0.0, batch_size=8, num_steps=16, learning_rate=1e-3, max_grad_norm=1.0,
            schedule="cosine")


def _cfg(**kw):
    return TrainConfig.from_dict({**BASE, **kw})


def test_a_plan_in_steps_or_tokens_counts_the_global_batch():
    assert _cfg(num_epochs=3).planned_steps is None and _cfg(num_epochs=3).epochs_to_run(10) == 3
    steps = _cfg(max_steps=25)
    assert steps.planned_steps == 25 and steps.epochs_to_run(10) == 3  # the third epoch cut short
    assert _cfg(max_tokens=8 * 16 * 4).planned_steps == 4  # whole steps of 128 tokens
    assert _cfg(max_tokens=8 * 16 * 4 + 1).planned_steps == 5  # a part of a step is a step


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


def _from_flags(*argv):
    return config_from_args(build_parser().parse_args(list(argv)))


def test_a_plan_flag_replaces_the_configs_plan_and_a_set_mixes_it():
    epochs = load_config("config_transformer", {}).optimization
    assert epochs.num_epochs > 0 and epochs.max_steps == 0
    steps = _from_flags("--config", "config_transformer", "--max_steps", "300", "--warmup_steps", "30",
                        "--min_lr", "1e-5", "--eval_every_steps", "50", "--eval_steps", "4")
    opt = steps.optimization
    assert (opt.num_epochs, opt.max_steps, opt.warmup_steps, opt.warmup_epochs) == (0, 300, 30, 0.0)
    assert (opt.min_lr, steps.run.eval_every_steps, steps.run.eval_steps) == (1e-5, 50, 4)
    back = _from_flags("--config", "config_transformer", "--set", "max_steps=5", "--num_epochs", "2").optimization
    assert (back.num_epochs, back.max_steps) == (2, 0)
    tokens = _from_flags("--config", "config_transformer", "--max_tokens", "1000000").optimization
    assert (tokens.num_epochs, tokens.max_tokens) == (0, 1000000)
    with pytest.raises(ConfigError, match="num_epochs = 10 and max_steps = 5 both plan"):
        _from_flags("--config", "config_transformer", "--set", "max_steps=5")
    with pytest.raises(UsageError, match="--num_epochs and --max_steps both plan the run's length; pass one"):
        _from_flags("--config", "config_transformer", "--num_epochs", "1", "--max_steps", "5")
