"""lmkit.cli.flags: the generation flags of lmkit generate and lmkit evaluate, mapped onto GenerationConfig."""
import argparse

import pytest

from lmkit.cli.flags import (
    add_beam_flags,
    add_sampling_flags,
    add_text_flags,
    config_of_flags,
    early_stopping,
    one_line,
)
from lmkit.core.errors import UsageError


def parse(*flags):
    p = argparse.ArgumentParser()
    add_sampling_flags(p)
    add_beam_flags(p)
    add_text_flags(p)
    return p.parse_args(list(flags))


def test_a_flag_is_the_configs_field_and_one_left_out_is_not_given():
    config = config_of_flags(parse("--top_p", "0.5", "--early_stopping", "never", "--stop", "\\n\\n",
                                   "--stop_at_eos"))
    assert config.given() == {"top_p": 0.5, "early_stopping": "never", "num_samples": 1, "stop": ("\n\n",),
                              "stop_at_eos": True}
    assert config_of_flags(parse(), max_length=50).given() == {"num_samples": 1, "max_length": 50}
    assert config_of_flags(parse("--no_start_token")).start_token is False
    with pytest.raises(UsageError, match="top_p = 2.0 must be in"):  # (flag-spelled inside flag_spelling)
        config_of_flags(parse("--top_p", "2"))
    assert [early_stopping(text) for text in ("true", "False", " never ")] == [True, False, "never"]
    with pytest.raises(argparse.ArgumentTypeError, match="'maybe' is not one of true, false, never"):
        early_stopping("maybe")


def test_one_line_keeps_a_sample_on_its_line():
    assert one_line("a\nb\x1ec\u2028d e") == "a\\nb\\x1ec\\u2028d e"
    assert len(("x" + one_line("1\r\n2\x85")).splitlines()) == 1


def test_stop_flags_read_backslash_escapes():
    import argparse

    from lmkit.cli.flags import unescape
    assert unescape("\\n\\n") == "\n\n" and unescape("ROMEO:") == "ROMEO:"
    assert unescape("caf\u00e9\\t") == "caf\u00e9\t"
    with pytest.raises(argparse.ArgumentTypeError, match="broken backslash escape"):
        unescape("\\x4")
