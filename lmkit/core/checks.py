"""Argument checks shared by every part of lmkit (no TensorFlow import).

Each check returns the value it accepted (converted to ``int`` or ``float``
where that is the point) or raises :class:`~lmkit.core.errors.UsageError`, a
``ValueError`` whose message names the argument, the bad value and the fix.
Bad input is bad input wherever it is found: the command-line tools print
one line and exit with status 2 for all of them.

:func:`did_you_mean` is the one place that phrases the "did you mean" hint
for an unknown name.
"""

from __future__ import annotations

import difflib
import math
import numbers
from typing import Any, Iterable, Mapping, Optional, Type

from lmkit.core.errors import UsageError

__all__ = [
    "did_you_mean",
    "check_choice",
    "check_known_keys",
    "check_bool",
    "check_number",
    "check_positive_int",
    "check_non_negative_int",
    "check_float",
    "check_positive_float",
    "check_non_negative_float",
    "check_rate",
    "check_divisible",
    "check_heads",
    "is_token_id",
]


def did_you_mean(name: Any, choices: Iterable[str], *, listing: str = "choices",
                 full: bool = True) -> str:
    """The hint after an unknown ``name``.

    Args:
      name: the unknown name as given.
      choices: the known names.
      listing: the word before the list of choices (``"choices"``,
        ``"known keys"``, ``"available"``).
      full: list every choice also when one is close (False for long lists).

    Returns:
      ``"did you mean 'x'? choices: a, b"`` (``"did you mean 'x'?"`` when not
      ``full``) when a known name is close, else ``"choices: a, b"``.
    """
    choices = [str(c) for c in choices]
    close = difflib.get_close_matches(str(name), choices, n=1)
    listed = f"{listing}: {', '.join(choices) if choices else 'none'}"
    if not close:
        return listed
    return f"did you mean {close[0]!r}? {listed}" if full else f"did you mean {close[0]!r}?"


def check_choice(what: str, value: Any, choices: Iterable[str],
                 error: Type[Exception] = UsageError) -> str:
    """Returns ``value`` when it is one of ``choices``.

    Raises:
      UsageError (or ``error``): ``unknown <what> 'x'; did you mean 'y'?``.
    """
    choices = list(choices)
    if not isinstance(value, str) or value not in choices:
        raise error(f"unknown {what} {value!r}; {did_you_mean(value, choices)}")
    return value


def check_known_keys(source: str, given: Mapping[str, Any] | Iterable[str], known: Iterable[str],
                     error: Type[Exception] = UsageError) -> None:
    """Rejects the first key of ``given`` that is not in ``known``.

    Raises:
      UsageError (or ``error``): ``<source>: unknown key 'x'; did you mean 'y'?``.
    """
    known = list(known)
    unknown = sorted(set(given) - set(known))
    if unknown:
        key = unknown[0]
        raise error(f"{source}: unknown key {key!r}; "
                    f"{did_you_mean(key, sorted(known), listing='known keys', full=False)}")


def is_token_id(value: Any) -> bool:
    """Whether ``value`` can be a token id: a non-negative ``int`` (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_real(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Real)


def check_number(name: str, value: object, *, low: Optional[float] = None,
                 high: Optional[float] = None, low_open: bool = False,
                 high_open: bool = False, fix: str = "") -> float:
    """Returns ``value`` as a float after checking its type and range.

    Args:
      name: argument name used in the error message.
      value: the value to check (int or float; bool is rejected).
      low: lower bound, or None.
      high: upper bound, or None.
      low_open: True when ``low`` itself is not allowed.
      high_open: True when ``high`` itself is not allowed.
      fix: advice appended to the error message.

    Returns:
      ``float(value)``.

    Raises:
      UsageError: the value is not a number, is NaN, or is out of range.
    """
    if not _is_real(value):
        raise UsageError(f"{name} = {value!r} must be a number{'; ' + fix if fix else ''}")
    v = float(value)  # type: ignore[arg-type]
    bad = ((low is not None and (v < low or (low_open and v == low)))
           or (high is not None and (v > high or (high_open and v == high))))
    if bad or v != v:  # v != v catches NaN
        lo = "" if low is None else ("(" if low_open else "[") + f"{low:g}"
        hi = "" if high is None else f"{high:g}" + (")" if high_open else "]")
        rng = f"in {lo or '(-inf'}, {hi or 'inf)'}"
        raise UsageError(f"{name} = {value!r} must be {rng}{'; ' + fix if fix else ''}")
    return v


def check_bool(name: str, value: Any) -> bool:
    """Returns ``value`` when it is True or False (not 0, 1 or "False")."""
    if not isinstance(value, bool):
        raise UsageError(f"{name} = {value!r} must be True or False")
    return value


def check_positive_int(name: str, value: Any) -> int:
    """Returns ``value`` when it is an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise UsageError(f"{name} {value!r} must be a positive integer; pass e.g. {name}=1")
    return int(value)


def check_non_negative_int(name: str, value: Any, meaning_of_zero: str = "") -> int:
    """Returns ``value`` when it is an int >= 0 (``meaning_of_zero`` goes into the message)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        zero = f" ({meaning_of_zero})" if meaning_of_zero else ""
        raise UsageError(f"{name} {value!r} must be an integer >= 0{zero}")
    return int(value)


def check_float(name: str, value: Any) -> float:
    """Returns ``value`` as float when it is a finite real number."""
    if not _is_real(value) or not math.isfinite(value):
        raise UsageError(f"{name} {value!r} must be a finite number")
    return float(value)


def check_positive_float(name: str, value: Any) -> float:
    """Returns ``value`` as float when it is a number > 0."""
    if not _is_real(value) or not value > 0:
        raise UsageError(f"{name} {value!r} must be a number > 0")
    return float(value)


def check_non_negative_float(name: str, value: Any) -> float:
    """Returns ``value`` as float when it is a number >= 0."""
    if not _is_real(value) or not value >= 0:
        raise UsageError(f"{name} {value!r} must be a number >= 0")
    return float(value)


def check_rate(name: str, value: Any) -> float:
    """Returns a dropout rate in [0, 1) as float."""
    if not _is_real(value) or not 0.0 <= value < 1.0:
        raise UsageError(f"{name} {value!r} must be in [0, 1) (it is 1 - keep_prob); "
                         f"use 0.0 to turn dropout off")
    return float(value)


def check_divisible(name: str, value: int, divisor: int, parts: str,
                    error: Type[Exception] = UsageError) -> int:
    """Returns ``value // divisor``; raises when ``divisor`` does not divide ``value``.

    Args:
      name: the argument (``"batch_size"``).
      value: its value.
      divisor: what it must split into.
      parts: what the parts are called (``"workers"``, ``"replicas"``).
      error: the exception type (``DataError`` in ``lmkit.data``).

    Raises:
      UsageError (or ``error``): ``batch_size 20 is not divisible by 3 workers;
      use a multiple of 3``.
    """
    if value % divisor:
        raise error(f"{name} {value} is not divisible by {divisor} {parts}; "
                    f"use a multiple of {divisor}")
    return value // divisor


def check_heads(name: str, dim: int, num_heads: int) -> int:
    """Returns the size of one attention head; ``dim`` must split evenly over the heads.

    Raises:
      UsageError: ``hidden_size 30 is not divisible by num_heads 4; use a multiple of 4``.
    """
    num_heads = check_positive_int("num_heads", num_heads)
    if dim % num_heads:
        raise UsageError(f"{name} {dim} is not divisible by num_heads {num_heads}; "
                         f"use a multiple of {num_heads}")
    return dim // num_heads
