"""The lmkit command's own pieces, without training: dispatch, flags -> config, output lines."""
import subprocess
import sys

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
