"""``lmkit train``'s flags -> the run's config (no training), and what it says before it trains."""
import json

import pytest

from lmkit.cli.train import build_parser, config_from_args
from lmkit.config import ConfigError, load_config
from lmkit.core.errors import UsageError
from lmkit.optim import warmup_note


def test_train_file_switches_a_ptb_config_to_text():
    args = build_parser().parse_args(["--config", "config_transformer", "--train_file", "t.txt",
                                      "--tokenizer", "sentencepiece", "--vocab_size", "300",
                                      "--model", "my_pkg.lm:LM", "--use_horovod", "false"])
    config = config_from_args(args)
    data = config.data
    assert (data.kind, data.train_file, data.tokenizer, config.model["vocab_size"]) == (
        "text", "t.txt", "sentencepiece", 300)
    assert (config.model.name, config.distribution.backend) == ("my_pkg.lm:LM", "native")
    assert config.tokenizer_options == {"vocab_size": 300, "max_vocab": None, "min_count": 1,
                                        "model_type": "unigram", "source": ""}


def test_several_train_files_cache_and_sampling_flags_reach_the_config():
    args = build_parser().parse_args(["--config", "config_transformer", "--train_file", "a.txt", "shards/*.txt",
                                      "--valid_file", "v1.txt", "v2.txt", "--data_cache", "none",
                                      "--sampling", "random"])
    data = config_from_args(args).data
    assert (data.train_file, data.valid_file, data.test_file) == ("a.txt,shards/*.txt", "v1.txt,v2.txt", "")
    assert (data.data_cache, data.sampling) == ("none", "random")
    assert config_from_args(build_parser().parse_args(["--train_file", "t.txt"])).data.sampling == "windows"


def test_lora_flags_reach_the_config_with_a_pretrained_folder(tmp_path):
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 50, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 1024}))
    flags = ["--init_from", str(folder), "--train_file", "t.txt", "--lora_rank", "8", "--lora_alpha", "32",
             "--lora_dropout", "0.1", "--lora_targets", "query,key,down"]
    config = config_from_args(build_parser().parse_args(flags))
    assert (config.model.name, config.checkpoints.init_from) == ("llama", str(folder))
    adapters = config.adapters
    assert (adapters.lora_rank, adapters.lora_alpha, adapters.lora_dropout, adapters.lora_targets) == (
        8, 32.0, 0.1, "query,key,down")
    with pytest.raises(ConfigError, match="lora_rank = 4 adapts a pretrained model; pass --init_from"):
        config_from_args(build_parser().parse_args(["--train_file", "t.txt", "--lora_rank", "4"]))


def test_a_short_plan_under_a_long_warmup_trains_and_says_so_once():
    """nanoGPT's recipe (100 warmup steps) for 20 steps: no error; the run warms up over all 20 (at the
    recipe's slope, as nanoGPT's get_lr and Hugging Face's schedules do) and one line names the flag."""
    args = build_parser().parse_args(["--config", "config_tiny_transformer", "--max_steps", "20",
                                      "--train_file", "t.txt", "--tokenizer", "char"])
    config = config_from_args(args)
    assert (config.optimization.warmup_steps, config.planned_steps) == (100, 20)
    note = warmup_note(config)
    assert note == ("note: warmup_steps 100 >= the plan's 20 steps: warming up over the whole run, to 20/101 of "
                    "the peak learning rate at the last step, no decay; --set warmup_steps=N (N < 20) to warm up "
                    "and then decay")
    assert warmup_note(config.replace(warmup_steps=19)) == ""  # shorter than the plan: warmup, then the decay
    assert warmup_note(load_config("config_tiny_transformer", {"data": "text", "train_file": "t.txt"})) == ""
    assert warmup_note(load_config("config_small")) == ""  # a plan in epochs


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


def test_the_chat_flags_reach_the_data_section(tmp_path, monkeypatch):
    flags = ["--train_file", "chats.jsonl", "--data_format", "chat", "--chat_template", "t.jinja",
             "--train_on_prompt", "--packing", "--skip_bad_records", "--pack_windows", "2"]
    data = config_from_args(build_parser().parse_args(flags)).data
    assert (data.kind, data.data_format, data.chat_template) == ("text", "chat", str(tmp_path.cwd() / "t.jinja"))
    assert data.train_on_prompt and data.packing and data.skip_bad_records and data.pack_windows == 2
    data = config_from_args(build_parser().parse_args(["--train_file", "chats.jsonl"])).data
    assert (data.data_format, data.chat_template, data.packing) == ("", "", False)  # found from the records
    assert data.pack_windows == 3
    with pytest.raises(ConfigError, match=r"pack_windows = 0 must be a positive integer \(the window lengths"):
        config_from_args(build_parser().parse_args(["--train_file", "chats.jsonl", "--pack_windows", "0"]))
    # A bad flag leaves through os._exit (no atexit handler may wait on other ranks): caught here, so the
    # test's own process lives on (it once ended a pytest-xdist worker).
    def leave(code):
        raise SystemExit(code)
    monkeypatch.setattr("lmkit.cli.common._hard_exit", leave)
    with pytest.raises(SystemExit) as left:
        build_parser().parse_args(["--train_file", "c.jsonl", "--data_format", "messages"])
    assert left.value.code == 2
