"""The lmkit command's own pieces, without training: dispatch, flags -> config, output lines."""
import subprocess
import sys

import pytest

from lmkit.cli.generate import one_line
from lmkit.config import load_config
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


def test_one_line_keeps_a_sample_on_its_line():
    assert one_line("a\nb\x1ec\u2028d e") == "a\\nb\\x1ec\\u2028d e"
    assert len(("x" + one_line("1\r\n2\x85")).splitlines()) == 1


@pytest.mark.parametrize("flags, match", [
    (["--stream", "--num_samples", "2"], "--stream writes one sample as it comes"),
    (["--stream", "--strategy", "beam"], "--stream writes one sample as it comes"),
    (["--strategy", "beam", "--repetition_penalty", "1.2"], "--repetition_penalty applies to the per-token strategies"),
    (["--repetition_penalty", "0"], "--repetition_penalty 0.0 must be > 0"),
    (["--min_new_tokens", "-1"], "--min_new_tokens -1 must be >= 0"),
    (["--max_new_tokens", "0"], "--max_new_tokens 0 must be >= 1"),
])
def test_generate_flag_errors_name_the_flag(tmp_path, flags, match):
    from lmkit.cli import generate
    from lmkit.core.errors import UsageError
    args = generate.build_parser().parse_args(["--model_dir", str(tmp_path), *flags])
    with pytest.raises(UsageError, match=match):
        generate.check_args(args)


@pytest.mark.parametrize("flags, match", [
    (["--batch_size", "0"], "--batch_size 0 must be >= 1"),
    (["--temperature", "0"], r"--temperature 0.0 must be > 0 \(use 1e-3 for near-greedy\)"),
    (["--min_p", "1.5"], r"--min_p 1.5 must be in \[0, 1\]"),
    (["--no_repeat_ngram_size", "-2"], "--no_repeat_ngram_size -2 must be >= 0"),
    (["--min_p", "0.1", "--strategy", "greedy"], "--min_p applies to --strategy top_p"),
])
def test_an_encoder_decoders_flags_are_checked_as_a_language_models(tmp_path, flags, match):
    """The sampling and length flags have one set of ranges for both kinds of model (check_limits)."""
    from lmkit.cli import generate
    from lmkit.core.errors import UsageError
    args = generate.build_parser().parse_args(["--model_dir", str(tmp_path), "--source_file", "s.txt", *flags])
    with pytest.raises(UsageError, match=match):
        generate.check_transduction_args(args)
    if flags[0] != "--batch_size":  # the same error for a language model
        args = generate.build_parser().parse_args(["--model_dir", str(tmp_path), *flags])
        with pytest.raises(UsageError, match=match):
            generate.check_args(args)


def test_stop_flags_read_backslash_escapes():
    from lmkit.cli.generate import _unescape
    assert _unescape("\\n\\n") == "\n\n" and _unescape("ROMEO:") == "ROMEO:"
    assert _unescape("caf\u00e9\\t") == "caf\u00e9\t"


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
    assert "default 0, or an encoder-decoder folder's min_length - 1)" in text  # --min_new_tokens says its own
