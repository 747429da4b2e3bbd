"""lmkit.decoding.checks: one range per generation setting, checked when a GenerationConfig is built (and by the
samplers and rules), its errors spelled as keywords or as the command line's flags."""

from __future__ import annotations

import pytest

from lmkit.core.errors import UsageError
from lmkit.decoding.checks import RANGES, check_setting, flag_spelling, spelled
from lmkit.decoding.config import GenerationConfig


@pytest.mark.parametrize("values, message", [
    (dict(temperature=0), r"temperature = 0 must be > 0 \(use 1e-3 for near-greedy\)"),
    (dict(top_p=1.5), r"top_p = 1.5 must be in \(0, 1\]"),
    (dict(top_k=0), "top_k = 0 must be an integer >= 1"),
    (dict(min_p=True), r"min_p = True must be in \[0, 1\]"),
    (dict(beam_scoring="bleu"), "beam_scoring = 'bleu' must be one of gnmt, transformers"),
    (dict(early_stopping=1), 'early_stopping = 1 must be true, false or "never"'),
    (dict(max_new_tokens=0), "max_new_tokens = 0 must be an integer >= 1"),
    (dict(min_new_tokens=-1), "min_new_tokens = -1 must be an integer >= 0"),
    (dict(stop=[""]), r"stop = \('',\) must be non-empty strings"),
    (dict(seed=-1), r"seed = -1 must be an integer in \[0, 2\*\*63\)"),
    (dict(context=1), "context = 1 must be an integer >= 2"),
    (dict(eos_id=[]), r"eos_id = \[\] must be a token id or a non-empty list of them"),
    (dict(strategy="beam", num_samples=5, beam_width=4), "num_samples = 5 exceeds beam_width = 4: .*; use "
                                                         "beam_width = 5"),
    (dict(jit_compile=True, use_cache=False), "jit_compile=True needs compiled=True and use_cache=True"),
])
def test_a_config_checks_every_field_when_it_is_built(values, message):
    with pytest.raises(UsageError, match=message):
        GenerationConfig(**values)


def test_errors_name_flags_inside_flag_spelling_and_every_field_has_a_range():
    assert set(RANGES) == set(GenerationConfig.keys())
    with flag_spelling():
        with pytest.raises(UsageError, match=r"^--temperature 0.0 must be > 0 \(use 1e-3 for near-greedy\)$"):
            GenerationConfig(temperature=0.0)
        with pytest.raises(UsageError, match="^--num_samples 5 exceeds --beam_width 4: .*; use --beam_width 5$"):
            GenerationConfig(strategy="beam", num_samples=5, beam_width=4)
    with pytest.raises(UsageError, match="^temperature = 0.0 must be"):  # keywords again outside it
        GenerationConfig(temperature=0.0)
    assert check_setting("top_p", None) is None and check_setting("min_new_tokens", [0, 3]) == [0, 3]
    with pytest.raises(UsageError, match=r"min_new_tokens = \[0, -1\] must be an integer >= 0"):
        check_setting("min_new_tokens", [0, -1])  # decode() takes one per sequence
    with flag_spelling():
        assert (spelled("stop", ("a", "b")), spelled("stop_at_eos", True), spelled("strategy")) == \
            ("--stop 'a' 'b'", "--stop_at_eos true", "--strategy")
    assert spelled("top_p", 0.5) == "top_p = 0.5"
