"""The range of every generation setting, in one table, and how an error spells a setting's name.

:data:`RANGES` says what each field of :class:`lmkit.decoding.GenerationConfig`
accepts; :func:`check_setting` checks one value against it. A config checks
every field with it when it is built, and the samplers and the rules on
tokens check their arguments with it, so a setting has one range and one
message wherever it is given. The message names the setting, the value and
the fix, spelled as Python keywords (``top_p = 1.5 must be in (0, 1]``) or,
inside :func:`flag_spelling` (the commands), as their flags (``--top_p 1.5
must be in (0, 1]``). No TensorFlow.
"""

from __future__ import annotations

import contextlib
import contextvars
import numbers
from typing import Any, Callable, Dict, Iterator, Tuple

from lmkit.core.errors import UsageError
from lmkit.decoding.registry import SAMPLER_NAMES, SCORINGS

__all__ = ["RANGES", "check_setting", "flag_spelling", "spelled"]

_FLAGS: contextvars.ContextVar = contextvars.ContextVar("lmkit_decoding_flag_spelling", default=False)
_UNSET = object()


def spelled(key: str, value: Any = _UNSET) -> str:
    """``key = value`` (Python's keywords), or ``--key value`` inside :func:`flag_spelling`."""
    if not _FLAGS.get():
        return key if value is _UNSET else f"{key} = {value!r}"
    if value is _UNSET:
        return f"--{key}"
    if isinstance(value, bool):
        value = str(value).lower()
    elif isinstance(value, (list, tuple)):
        value = " ".join(repr(v) if isinstance(v, str) else str(v) for v in value)
    return f"--{key} {value}"


@contextlib.contextmanager
def flag_spelling() -> Iterator[None]:
    """Inside it, the errors of generation settings name command-line flags (``--top_p 1.5``)."""
    token = _FLAGS.set(True)
    try:
        yield
    finally:
        _FLAGS.reset(token)


def _int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and v == v  # v == v: not NaN


def _ids(v: Any) -> bool:
    many = v if isinstance(v, (list, tuple)) else [v]
    return bool(many) and all(_int(i) and i >= 0 for i in many)


def _counts(v: Any) -> bool:  # decode() also takes one min_new_tokens per sequence
    many = list(v) if hasattr(v, "__len__") and not isinstance(v, str) else [v]
    return all(_int(i) and i >= 0 for i in many)


def _at_least(low: int) -> Callable[[Any], bool]:
    return lambda v: _int(v) and v >= low


def _boolean(v: Any) -> bool:
    return isinstance(v, bool)


#: setting -> (what it accepts, the words after the value when it does not). None is always "not given".
RANGES: Dict[str, Tuple[Callable[[Any], bool], str]] = {
    "strategy": (lambda v: v in SAMPLER_NAMES, f"is not one of {', '.join(SAMPLER_NAMES)}"),
    "temperature": (lambda v: _number(v) and v > 0, "must be > 0 (use 1e-3 for near-greedy)"),
    "top_k": (_at_least(1), "must be an integer >= 1 (top_k 1 is greedy)"),
    "top_p": (lambda v: _number(v) and 0 < v <= 1, "must be in (0, 1] (1.0 keeps every token)"),
    "min_p": (lambda v: _number(v) and 0 <= v <= 1, "must be in [0, 1] (0 or None: off)"),
    "repetition_penalty": (lambda v: _number(v) and v > 0, "must be > 0 (1 = off)"),
    "beam_width": (_at_least(1), "must be an integer >= 1"),
    "beam_scoring": (lambda v: v in SCORINGS, f"must be one of {', '.join(SCORINGS)}"),
    "length_penalty": (_number, "must be a number (gnmt: 0 = none, 0.6-1.0 favours longer outputs)"),
    "early_stopping": (lambda v: v is True or v is False or v == "never", 'must be true, false or "never"'),
    "no_repeat_ngram_size": (_at_least(0), "must be an integer >= 0 (0 = off)"),
    "forced_first_id": (_at_least(0), "must be a token id (an integer >= 0)"),
    "forced_last_id": (_at_least(0), "must be a token id (an integer >= 0)"),
    "min_new_tokens": (_counts, "must be an integer >= 0"),
    "max_new_tokens": (_at_least(1), "must be an integer >= 1"),
    "max_length": (_at_least(1), "must be an integer >= 1 (tokens per sample, the prompt included)"),
    "num_samples": (_at_least(1), "must be an integer >= 1"),
    "stop": (lambda v: all(isinstance(s, str) and s for s in v), "must be non-empty strings, e.g. '\\n\\n'"),
    "stop_at_eos": (_boolean, "must be true or false"),
    "start_token": (_boolean, "must be true or false"),
    "eos_id": (_ids, "must be a token id or a non-empty list of them"),
    "start_id": (_at_least(0), "must be a token id (an integer >= 0)"),
    "pad_id": (_at_least(0), "must be a token id (an integer >= 0)"),
    "seed": (lambda v: _int(v) and 0 <= v < 2 ** 63, "must be an integer in [0, 2**63)"),
    "context": (_at_least(2), "must be an integer >= 2 (positions the model reads before its window slides)"),
    "batch_size": (_at_least(1), "must be an integer >= 1"),
    "use_cache": (_boolean, "must be true or false"),
    "compiled": (_boolean, "must be true or false"),
    "jit_compile": (_boolean, "must be true or false (None: XLA whenever compiled with the cache)"),
}


def check_setting(key: str, value: Any, fix: str = "") -> Any:
    """``value`` when :data:`RANGES` accepts it for ``key`` (None: not given, always accepted).

    Raises:
      UsageError: ``key = value <what it must be>`` (flags inside :func:`flag_spelling`), then ``fix``.
    """
    if value is None:
        return value
    accepts, need = RANGES[key]
    if not accepts(value):
        hint = ""
        if key == "strategy" and hasattr(value, "get_next_token"):  # generate(strategy=<a Sampler>), 0.2's
            hint = "; pass a Sampler object as generate(sampler=...)"
        raise UsageError(f"{spelled(key, value)} {need}{hint}{fix}")
    return value
