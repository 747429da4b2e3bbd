"""Argument checks (lmkit.core.checks): each returns what it accepted or one UsageError naming the argument,
the bad value and the fix; "did you mean" is phrased in one place."""
import math

import pytest

from lmkit.core import checks
from lmkit.core.errors import UsageError


def test_did_you_mean_names_the_closest_choice_and_lists_them():
    assert checks.did_you_mean("horovd", ["horovod", "native"]) == "did you mean 'horovod'? choices: horovod, native"
    assert checks.did_you_mean("horovd", ["horovod"], full=False) == "did you mean 'horovod'?"
    assert checks.did_you_mean("zzz", ["a", "b"], listing="known keys") == "known keys: a, b"
    assert checks.did_you_mean("x", []) == "choices: none"


def test_choices_and_keys():
    assert checks.check_choice("backend", "native", ["horovod", "native"]) == "native"
    with pytest.raises(UsageError, match=r"^unknown backend 'nativ'; did you mean 'native'\? choices: horovod, "
                                         r"native$"):
        checks.check_choice("backend", "nativ", ["horovod", "native"])
    with pytest.raises(KeyError):  # another error type when asked
        checks.check_choice("backend", 3, ["native"], error=KeyError)
    checks.check_known_keys("config", {"a": 1}, ["a", "b"])
    with pytest.raises(UsageError, match=r"^config: unknown key 'bb'; did you mean 'b'\?$"):
        checks.check_known_keys("config", ["bb", "zz"], ["a", "b"])


@pytest.mark.parametrize("check, good, bad, message", [
    (checks.check_bool, True, 1, "x = 1 must be True or False"),
    (checks.check_positive_int, 3, 0, "x 0 must be a positive integer; pass e.g. x=1"),
    (checks.check_positive_int, 3, True, "x True must be a positive integer"),
    (checks.check_non_negative_int, 0, -1, "x -1 must be an integer >= 0"),
    (checks.check_float, 0.5, math.inf, "x inf must be a finite number"),
    (checks.check_positive_float, 0.5, 0.0, "x 0.0 must be a number > 0"),
    (checks.check_non_negative_float, 0.0, -0.5, "x -0.5 must be a number >= 0"),
    (checks.check_rate, 0.1, 1.0, r"x 1.0 must be in \[0, 1\) \(it is 1 - keep_prob\); use 0.0 to turn dropout off"),
])
def test_each_check_returns_what_it_accepts_and_names_what_it_refuses(check, good, bad, message):
    assert check("x", good) == good
    with pytest.raises(UsageError, match=f"^{message}"):
        check("x", bad)


def test_numbers_in_ranges():
    assert checks.check_number("lr", 1, low=0, low_open=True) == 1.0
    with pytest.raises(UsageError, match=r"^lr = 0 must be in \(0, inf\); give a rate$"):
        checks.check_number("lr", 0, low=0, low_open=True, fix="give a rate")
    with pytest.raises(UsageError, match=r"^p = 2 must be in \[0, 1\]$"):
        checks.check_number("p", 2, low=0, high=1)
    with pytest.raises(UsageError, match=r"^p = nan must be in"):
        checks.check_number("p", float("nan"), low=0)
    with pytest.raises(UsageError, match=r"^p = '1' must be a number$"):
        checks.check_number("p", "1")
    assert checks.is_token_id(0) and not checks.is_token_id(-1) and not checks.is_token_id(True)


def test_divisible_and_heads():
    assert checks.check_divisible("batch_size", 20, 4, "workers") == 5
    with pytest.raises(UsageError, match=r"^batch_size 20 is not divisible by 3 workers; use a multiple of 3$"):
        checks.check_divisible("batch_size", 20, 3, "workers")
    assert checks.check_heads("hidden_size", 32, 4) == 8
    with pytest.raises(UsageError, match=r"^hidden_size 30 is not divisible by num_heads 4; use a multiple of 4$"):
        checks.check_heads("hidden_size", 30, 4)
