"""Every spelling of a setting, mapped onto its section.

A setting can be written three ways, in a config file, a ``--set`` flag,
``TrainConfig.from_dict`` or ``replace``:

* in its section: ``optimization = dict(learning_rate=0.5)``;
* dotted: ``--set optimization.learning_rate=0.5``;
* flat, as 0.x wrote every setting: ``learning_rate = 0.5``. Each field of
  each section keeps its flat name (:data:`FLAT_KEYS`), as do 0.x's model
  keys (:data:`lmkit.config.model.FLAT_MODEL_KEYS`); ``model = "<name>"``
  is the model's name and ``data = "text"`` the data's kind.

Flat spellings live here only, where files, flags and stored configs are
read: the rest of lmkit reads a config by section
(``cfg.optimization.learning_rate``, ``cfg.model["hidden_size"]``).

Three 0.x keys changed their spelling and still work: ``keep_prob`` (now
``model.dropout = 1 - keep_prob``) and ``model_params`` (now keys of the
model section) print one warning naming the new spelling where a person
wrote them (:func:`spell` with ``warn``; a run folder's ``config.json``
written by 0.2 is translated without a word); ``use_horovod = True/False``
(OpenSeq2Seq's) means ``backend = "horovod"/"native"``, as before.

:func:`spell` turns one source's keys into ``{section: {field: value}}``;
:func:`merge` lays a later source over an earlier one, field by field.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Dict, Mapping, Set, Tuple

from lmkit.config import names
from lmkit.config.base import ConfigError, check_type
from lmkit.config.model import FLAT_MODEL_KEYS, ModelConfig, dropout_of
from lmkit.config.sections import (
    AdapterConfig,
    CheckpointConfig,
    ComputeConfig,
    DataConfig,
    DistributionConfig,
    OptimizationConfig,
    RunConfig,
)
from lmkit.core.checks import did_you_mean

__all__ = ["DEPRECATED", "FLAT_KEYS", "LEGACY_BACKEND_KEY", "SECTIONS", "Sections", "merge", "spell"]

#: section name -> its class, in the order a config file lists them
SECTIONS: Dict[str, Any] = {cls.SECTION: cls for cls in (
    ModelConfig, DataConfig, OptimizationConfig, ComputeConfig, DistributionConfig, CheckpointConfig,
    AdapterConfig, RunConfig)}

#: ``{section: {field: value}}``: one source's settings, spelled out
Sections = Dict[str, Dict[str, Any]]


def _flat_keys() -> Dict[str, Tuple[str, str]]:
    keys = {"model": ("model", "name"), "data": ("data", "kind")}
    keys.update({key: ("model", key) for key in FLAT_MODEL_KEYS})
    for section, cls in SECTIONS.items():
        if cls is not ModelConfig:
            keys.update({f.name: (section, f.name) for f in dataclasses.fields(cls)
                         if (section, f.name) != ("data", "kind")})
    return keys


#: flat key -> (section, field): every field of every section, under its flat name
FLAT_KEYS: Dict[str, Tuple[str, str]] = _flat_keys()
#: 0.x keys spelled another way now -> their new spelling (the warning names it)
DEPRECATED: Dict[str, str] = {"keep_prob": "model.dropout", "model_params": "keys of the model section"}
# OpenSeq2Seq's spelling of the backend, still accepted: True -> "horovod" (mpirun/horovodrun), False -> "native".
LEGACY_BACKEND_KEY = "use_horovod"

_warned: Set[str] = set()


def _warn_once(key: str, text: str) -> None:
    """One warning line on stderr per key and process, from rank 0 only."""
    if key in _warned:
        return
    _warned.add(key)
    if names.launcher_rank() == 0:
        sys.stderr.write(f"warning: {text}\n")
        sys.stderr.flush()


def _unknown(key: str, source: str) -> ConfigError:
    known = sorted({*FLAT_KEYS, *SECTIONS, LEGACY_BACKEND_KEY, *DEPRECATED})
    return ConfigError(f"{source}: unknown key {key!r}; "
                       f"{did_you_mean(key, known, listing='known keys', full=False)}")


def _keep_prob(out: Sections, value: Any, source: str, warn: bool) -> None:
    """0.x's ``keep_prob`` -> ``model.dropout = 1 - keep_prob``."""
    keep_prob = check_type(source, "keep_prob", value, float)
    if not 0.0 < keep_prob <= 1.0:
        raise ConfigError(f"{source}: keep_prob = {value!r} must be in (0, 1]")
    dropout = dropout_of(keep_prob)
    out["model"]["dropout"] = dropout
    if warn:
        _warn_once("keep_prob", f"{source}: keep_prob is deprecated; write the model's dropout = 1 - keep_prob: "
                   f"dropout={dropout!r} in model = dict(...), or --set model.dropout={dropout!r}")


def _model_params(out: Sections, value: Any, source: str, warn: bool) -> None:
    """0.x's ``model_params`` -> keys of the model section."""
    params = check_type(source, "model_params", value, dict)
    out["model"].update(params)
    if warn:
        example = next(iter(params), "attention_blocks")
        _warn_once("model_params", f"{source}: model_params is deprecated; its keys are arguments of the model: "
                   f"write them in model = dict(...), or --set model.{example}=...")


def _set(out: Sections, section: str, key: str, value: Any, source: str, warn: bool) -> None:
    """One field; the model section's ``keep_prob`` and ``model_params`` are mapped too."""
    if section == "model" and key == "keep_prob":
        _keep_prob(out, value, source, warn)
    elif section == "model" and key == "model_params":
        _model_params(out, value, source, warn)
    else:
        out[section][key] = value


def _spell_key(out: Sections, key: str, value: Any, source: str, warn: bool) -> None:
    """One flat, dotted or deprecated key of a source."""
    if key in FLAT_KEYS:
        section, field = FLAT_KEYS[key]
        out[section][field] = value
    elif key == "keep_prob":
        _keep_prob(out, value, source, warn)
    elif key == "model_params":
        _model_params(out, value, source, warn)
    elif "." in key:
        section, _, field = key.partition(".")
        if section not in SECTIONS:
            raise ConfigError(f"{source}: unknown section {section!r} in {key!r}; "
                              f"{did_you_mean(section, SECTIONS, listing='sections')}")
        _set(out, section, field, value, source, warn)
    elif key != LEGACY_BACKEND_KEY:
        raise _unknown(key, source)


def _legacy_backend(values: Mapping[str, Any], out: Sections, source: str) -> None:
    """``use_horovod = True/False`` -> ``backend = "horovod"/"native"``; both given must agree."""
    if LEGACY_BACKEND_KEY not in values:
        return
    flag = values[LEGACY_BACKEND_KEY]
    if not isinstance(flag, bool):
        raise ConfigError(f"{source}: {LEGACY_BACKEND_KEY} = {flag!r} must be True or False "
                          "(or set backend = 'horovod' | 'native' | 'local')")
    mapped = "horovod" if flag else "native"
    given = out["distribution"].get("backend", "auto")
    if given not in ("auto", mapped):
        raise ConfigError(f"{source}: {LEGACY_BACKEND_KEY} = {flag} means backend = {mapped!r}, but "
                          f"backend = {given!r}; keep one of the two keys")
    out["distribution"]["backend"] = mapped


def spell(values: Mapping[str, Any], source: str, warn: bool = False) -> Sections:
    """One source's settings (a config file's names, ``--set`` keys, a stored config.json) by section.

    Sections written whole (``model = dict(...)``) come first; flat and dotted
    keys then set single fields, so ``hidden_size = 7`` after ``model =
    dict(hidden_size=200, ...)`` wins.

    Args:
      values: the settings, spelled any way.
      source: where they come from, for messages (``"config 'config_small'"``).
      warn: print one warning (rank 0, once a process) for each deprecated 0.x key.

    Raises:
      ConfigError: an unknown key (with the closest known one), a section that
        is not a dict, a bad ``keep_prob`` or ``use_horovod``.
    """
    out: Sections = {section: {} for section in SECTIONS}
    for key, value in values.items():
        if key in SECTIONS and isinstance(value, Mapping):
            for field, item in value.items():
                _set(out, key, str(field), item, source, warn)
        elif key in SECTIONS and key not in FLAT_KEYS:
            raise ConfigError(f"{source}: {key} = {value!r} must be a dict of its settings: {key} = dict(...)")
    for key, value in values.items():
        if not (key in SECTIONS and isinstance(value, Mapping)):
            _spell_key(out, key, value, source, warn)
    _legacy_backend(values, out, source)
    return out


def merge(base: Sections, later: Sections) -> Sections:
    """``base`` with ``later``'s fields laid over it (a new copy)."""
    merged = {section: dict(fields) for section, fields in base.items()}
    for section, fields in later.items():
        merged.setdefault(section, {}).update(fields)
    return merged
