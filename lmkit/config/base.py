"""What every section of the config shares: the error, the type check and ``from_dict``.

A section is a small frozen dataclass (nanoGPT's ``GPTConfig``); its
:meth:`Section.from_dict` rejects a key it does not know, naming the key and
the section, and checks each value against the field's annotation without
coercing it (``2.7`` is not an int, ``"False"`` is not a bool).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Dict, Mapping, Tuple, Union, get_type_hints

from lmkit.core.checks import did_you_mean
from lmkit.core.errors import UsageError

__all__ = ["ConfigError", "Section", "check_type"]


class ConfigError(UsageError):
    """A config that cannot be used; the message names the key and the fix."""


def _check_union(source: str, key: str, value: Any, members: list) -> Any:
    """``value`` against each type of a ``Union``; the message lists what each would have needed."""
    errors = []
    for member in members:
        try:
            return check_type(source, key, value, member)
        except ConfigError as exc:
            errors.append(str(exc).rsplit(" must be ", 1)[-1])
    raise ConfigError(f"{source}: {key} = {value!r} must be {' or '.join(errors)}")


def check_type(source: str, key: str, value: Any, hint: Any) -> Any:
    """Checks ``value`` against a field's annotation without coercing it.

    Returns:
      ``value`` (an int given for a float field as a float, a mapping as a dict).

    Raises:
      ConfigError: ``<source>: <key> = <value> must be <what>``.
    """
    origin = getattr(hint, "__origin__", None)
    if origin is Union:  # Optional[...] or a choice of types
        args = getattr(hint, "__args__", ())
        if value is None and type(None) in args:
            return None
        members = [a for a in args if a is not type(None)]
        if len(members) > 1:
            return _check_union(source, key, value, members)
        hint = members[0]
        origin = getattr(hint, "__origin__", None)
    if hint is bool:
        ok, want = isinstance(value, bool), "True or False"
    elif hint is int:
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif hint is float:
        ok, want = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
        value = float(value) if ok else value
    elif hint is str:
        ok, want = isinstance(value, str), "a string"
    elif origin is dict or hint is dict:
        ok, want = isinstance(value, Mapping), "a dict"
        value = dict(value) if ok else value
    else:
        ok, want = True, str(hint)
    if not ok:
        raise ConfigError(f"{source}: {key} = {value!r} must be {want}")
    return value


class Section:
    """Base of the config's sections (frozen dataclasses): built and checked by :meth:`from_dict`."""

    #: the section's name in a config file (``optimization = dict(...)``) and after ``cfg.``
    SECTION: ClassVar[str] = ""

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str = "config") -> Any:
        """The section of ``values`` (its field names), type-checked; the other fields take their defaults.

        Raises:
          ConfigError: an unknown key (named with the section), or a value of the wrong type.
        """
        fields = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        unknown = sorted(set(values) - set(fields))
        if unknown:
            key = unknown[0]
            raise ConfigError(f"{source}: unknown key {key!r} in section {cls.SECTION}; "
                              f"{did_you_mean(key, fields, listing='known keys')}")
        missing = [name for name in cls.required() if name not in values]
        if missing:
            raise ConfigError(f"{source}: missing required key {missing[0]!r} in section {cls.SECTION}; "
                              f"add {missing[0]}=... to {cls.SECTION} = dict(...)")
        hints = get_type_hints(cls)
        return cls(**{k: check_type(source, k, v, hints[k]) for k, v in values.items()})

    @classmethod
    def required(cls) -> Tuple[str, ...]:
        """The fields without a default, which every config states."""
        return tuple(f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                     if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)

    def to_dict(self) -> Dict[str, Any]:
        """Every field, by name (dicts copied)."""
        return {f.name: _copied(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore


def _copied(value: Any) -> Any:
    return dict(value) if isinstance(value, dict) else value
