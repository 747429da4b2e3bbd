"""The lmkit command's own pieces, without training: dispatch, flags -> config, output lines."""
import subprocess
import sys

import pytest

from lmkit.cli.train import build_parser, config_from_args
from lmkit.config import ConfigError, load_config
from tests.helpers import run


def test_dispatch_version_help_and_unknown_command():
    from lmkit import __version__
    version = run([sys.executable, "-m", "lmkit", "--version"], timeout=60)
    assert (version.returncode, version.stdout) == (0, f"lmkit {__version__}\n")
    usage = run([sys.executable, "-m", "lmkit", "--help"], timeout=60)
    assert usage.returncode == 0 and all(c in usage.stdout for c in ("train", "generate", "evaluate"))
    bad = run([sys.executable, "-m", "lmkit", "trian"], timeout=60)
    assert bad.returncode == 2 and "unknown command 'trian'; did you mean 'train'?" in bad.stderr
    empty = run([sys.executable, "-m", "lmkit"], timeout=60)
    assert empty.returncode == 2 and "usage: lmkit" in empty.stderr


def test_help_answers_without_tensorflow():
    code = ("import sys\nfrom lmkit.cli import train, generate, evaluate\n"
            "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'\n"
            "for m in (train, generate, evaluate):\n"
            "    m.build_parser().format_help()\n"
            "assert 'tensorflow' not in sys.modules\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


def test_train_file_switches_a_ptb_config_to_text():
    args = build_parser().parse_args(["--config", "config_transformer", "--train_file", "t.txt",
                                      "--tokenizer", "sentencepiece", "--vocab_size", "300",
                                      "--model", "my_pkg.lm:LM", "--use_horovod", "false"])
    config = config_from_args(args)
    assert (config.data, config.train_file, config.tokenizer, config.vocab_size) == (
        "text", "t.txt", "sentencepiece", 300)
    assert (config.model, config.backend) == ("my_pkg.lm:LM", "native")
    assert config.tokenizer_options == {"vocab_size": 300, "max_vocab": None, "min_count": 1,
                                        "model_type": "unigram", "source": ""}


def test_several_train_files_cache_and_sampling_flags_reach_the_config():
    args = build_parser().parse_args(["--config", "config_transformer", "--train_file", "a.txt", "shards/*.txt",
                                      "--valid_file", "v1.txt", "v2.txt", "--data_cache", "none",
                                      "--sampling", "random"])
    config = config_from_args(args)
    assert (config.train_file, config.valid_file, config.test_file) == ("a.txt,shards/*.txt", "v1.txt,v2.txt", "")
    assert (config.data_cache, config.sampling) == ("none", "random")
    assert config_from_args(build_parser().parse_args(["--train_file", "t.txt"])).sampling == "windows"


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


def test_a_closed_output_ends_a_command_quietly_with_the_sigpipe_status():
    # `lmkit generate ... | head`: the reader leaves; no traceback, status 141 as after SIGPIPE.
    code = ("from lmkit.cli.common import OutputClosed, run_main\n"
            "def main(argv):\n"
            "    print('one line', flush=True)\n"
            "    raise OutputClosed()\n"
            "run_main(main, [])\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 141 and res.stdout == "one line\n" and res.stderr == ""


def test_lora_flags_reach_the_config_with_a_pretrained_folder(tmp_path):
    import json
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 50, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 1024}))
    flags = ["--init_from", str(folder), "--train_file", "t.txt", "--lora_rank", "8", "--lora_alpha", "32",
             "--lora_dropout", "0.1", "--lora_targets", "query,key,down"]
    config = config_from_args(build_parser().parse_args(flags))
    assert (config.model, config.init_from) == ("llama", str(folder))
    assert (config.lora_rank, config.lora_alpha, config.lora_dropout, config.lora_targets) == (
        8, 32.0, 0.1, "query,key,down")
    with pytest.raises(ConfigError, match="lora_rank = 4 adapts a pretrained model; pass --init_from"):
        config_from_args(build_parser().parse_args(["--train_file", "t.txt", "--lora_rank", "4"]))


def test_help_shows_defaults_but_not_absent_ones():
    """--help writes each flag's default, but no "(default: None)" where the help says what leaving it out
    does (generate's sampling flags, which a Hugging Face folder's generation_config.json may fill)."""
    from lmkit.cli.evaluate import build_parser as evaluate_parser
    from lmkit.cli.generate import build_parser as generate_parser
    from lmkit.cli.train import build_parser as train_parser
    for parser in (generate_parser(), evaluate_parser(), train_parser()):
        text = " ".join(parser.format_help().split())
        assert "(default: None)" not in text and "(default: False)" not in text
    text = " ".join(generate_parser().format_help().split())
    assert "top_p's p (default 0.9)" in text and "(default: 32)" in text  # --batch_size keeps its default
    assert "(default: 1)" in text  # --num_samples
    assert "default 0, or an encoder-decoder folder's min_length - 1)" in text  # --min_new_tokens says its own
