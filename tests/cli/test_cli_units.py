"""The lmkit command's own pieces, without training: dispatch, flags -> config, output lines."""
import subprocess
import sys

import pytest

from lmkit.cli.flags import one_line
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


def test_one_line_keeps_a_sample_on_its_line():
    assert one_line("a\nb\x1ec\u2028d e") == "a\\nb\\x1ec\\u2028d e"
    assert len(("x" + one_line("1\r\n2\x85")).splitlines()) == 1


def _generate(folder, *flags):
    """``lmkit generate`` in this process (a bad flag fails while the generation is planned, before any model)."""
    from lmkit.cli import generate
    return generate.main(["--model_dir", str(folder), *flags])


@pytest.fixture(scope="module")
def word_run(tmp_path_factory):
    """A run folder as far as planning reads it: its config.json and a word tokenizer (no checkpoint)."""
    from lmkit.data.tokenizers import train_tokenizer
    folder = tmp_path_factory.mktemp("run")
    (folder / "text.txt").write_text("the old cat sees a dog\n", encoding="utf-8")
    train_tokenizer("word", str(folder / "text.txt"), str(folder))
    config = load_config("config_small", {"data": "text", "train_file": str(folder / "text.txt"), "tokenizer": "word"})
    (folder / "config.json").write_text(config.to_json(), encoding="utf-8")
    return folder


@pytest.mark.parametrize("flags, match", [
    (["--stream", "--num_samples", "2"], "--stream writes one sample as it comes"),
    (["--stream", "--strategy", "beam"], "--stream writes one sample as it comes"),
    (["--strategy", "beam", "--repetition_penalty", "1.2"], "--repetition_penalty applies to the per-token strategies"),
    (["--repetition_penalty", "0"], r"--repetition_penalty 0.0 must be > 0 \(1 = off\)"),
    (["--min_new_tokens", "-1"], "--min_new_tokens -1 must be an integer >= 0"),
    (["--max_new_tokens", "0"], "--max_new_tokens 0 must be an integer >= 1"),
    (["--temperature", "0"], r"--temperature 0.0 must be > 0 \(use 1e-3 for near-greedy\)"),
    (["--min_p", "1.5"], r"--min_p 1.5 must be in \[0, 1\]"),
    (["--no_repeat_ngram_size", "-2"], "--no_repeat_ngram_size -2 must be an integer >= 0"),
    (["--min_p", "0.1", "--strategy", "greedy"], "--min_p applies to --strategy top_p"),
    (["--strategy", "beam", "--num_samples", "5"], "--num_samples 5 exceeds --beam_width 4: .*; use --beam_width 5"),
    (["--system", "be brief"], "--system gives a chat's system turn; add --chat"),
    (["--source_file", "s.txt"], "--source_file is for an encoder-decoder's run"),
    (["--prompt", "the old", "--max_length", "2"], "--prompt 'the old' has 2 tokens, .*; use --max_length 3"),
    (["--prompt", " "], r"--prompt ' ' is empty after tokenization; .* leave --prompt out"),
    (["--stop", ""], r"--stop '' must be non-empty strings"),
])
def test_generate_flag_errors_name_the_flag_before_any_model_is_built(word_run, flags, match):
    """Each error is a GenerationConfig's or the plan's, spelled as the flag; none needs TensorFlow or a checkpoint."""
    from lmkit.core.errors import UsageError
    with pytest.raises(UsageError, match=match):
        _generate(word_run, *flags)


@pytest.fixture(scope="module")
def pairs_run(tmp_path_factory):
    """An encoder-decoder's run folder as far as planning reads it (config.json, the word tokenizer)."""
    from lmkit.data.tokenizers import train_tokenizer
    folder = tmp_path_factory.mktemp("pairs")
    (folder / "text.txt").write_text("s1 s2 s3\n", encoding="utf-8")
    train_tokenizer("word", str(folder / "text.txt"), str(folder))
    config = load_config("config_seq2seq", {"data": "pairs", "source_file": str(folder / "text.txt"),
                                            "target_file": str(folder / "text.txt")})
    (folder / "config.json").write_text(config.to_json(), encoding="utf-8")
    return folder


@pytest.mark.parametrize("flags, match", [
    (["--batch_size", "0"], "--batch_size 0 must be an integer >= 1"),
    (["--temperature", "0"], r"--temperature 0.0 must be > 0 \(use 1e-3 for near-greedy\)"),
    (["--min_p", "0.1", "--strategy", "greedy"], "--min_p applies to --strategy top_p"),
    (["--num_samples", "2"], "--num_samples 2: greedy decoding writes one output per source; use --strategy"),
    (["--stop", "x"], "--stop applies to language models; .* holds an encoder-decoder"),
    (["--stream"], "--stream applies to language models|--stream writes a language model's sample"),
    (["--chat"], "--chat applies to language models; .* holds an encoder-decoder"),
])
def test_an_encoder_decoders_flags_are_checked_as_a_language_models(pairs_run, flags, match):
    """The sampling and length flags have one set of ranges for both kinds of model (GenerationConfig's)."""
    from lmkit.core.errors import UsageError
    with pytest.raises(UsageError, match=match):
        _generate(pairs_run, "--prompt", "s1 s2", *flags)


def test_stop_flags_read_backslash_escapes():
    import argparse

    from lmkit.cli.flags import unescape
    assert unescape("\\n\\n") == "\n\n" and unescape("ROMEO:") == "ROMEO:"
    assert unescape("caf\u00e9\\t") == "caf\u00e9\t"
    with pytest.raises(argparse.ArgumentTypeError, match="broken backslash escape"):
        unescape("\\x4")


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


def test_evaluate_refuses_the_data_cache_for_a_ptb_run(tmp_path):
    import json

    from lmkit.cli import evaluate
    from lmkit.core.errors import UsageError
    (tmp_path / "config.json").write_text(json.dumps(load_config("config_small").to_dict()), encoding="utf-8")
    with pytest.raises(UsageError, match=r"--data_cache is for runs on your own text, but .* trained on PTB"):
        evaluate.main(["--model_dir", str(tmp_path), "--data_cache", "/tmp/x"])


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
