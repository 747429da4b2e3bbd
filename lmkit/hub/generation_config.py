"""A Hugging Face folder's ``generation_config.json``: how ``transformers``' ``generate`` decodes its model.

:func:`generation_preset` turns the file into lmkit's decoding settings
(the strategy and its knobs, the rules on tokens, an encoder-decoder's
lengths); :func:`model_generation_preset` finds the file for a model folder
(a Hugging Face folder, or a run fine-tuned from one); :func:`end_token_ids`
gives the ids that end a text. ``lmkit generate`` and ``lmkit evaluate``
read them, so a folder decodes as its authors set it up.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Tuple

from lmkit.core.checks import is_token_id
from lmkit.core.errors import UsageError
from lmkit.hub.folders import GENERATION_CONFIG, HF_CONFIG, is_hf_folder, read_json

__all__ = ["end_token_ids", "generation_preset", "model_generation_preset"]


def end_token_ids(folder: str) -> Optional[List[int]]:
    """The ids that end a text of the folder's model, as ``transformers``' ``generate`` stops at them.

    ``generation_config.json``'s ``eos_token_id`` (one id, or a list: Llama 3's instruct models end a
    text with ``<|end_of_text|>`` and a turn with ``<|eot_id|>``), else ``config.json``'s; None when
    neither names one.

    Raises:
      UsageError: an ``eos_token_id`` that is not a token id or a list of them (naming the file).
    """
    for name in (GENERATION_CONFIG, HF_CONFIG):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        value = read_json(path).get("eos_token_id")
        if value is None:
            continue
        ids = value if isinstance(value, list) else [value]
        if not ids or not all(is_token_id(i) for i in ids):
            raise UsageError(f"{path}: eos_token_id = {value!r} must be a token id or a list of them")
        return list(dict.fromkeys(ids))
    return None


class _Reader:
    """The values of one ``generation_config.json``, each checked, with the file and the key in messages."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.config = read_json(path)

    def get(self, key: str, default: Any = None) -> Any:
        return self.config.get(key, default)

    def number(self, key: str, default: Any, ok: Callable[[Any], bool], need: str) -> Any:
        value = self.config.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
            raise UsageError(f"{self.path}: {key} = {value!r} {need}")
        return value

    def count(self, key: str) -> int:
        return self.number(key, 0, lambda v: isinstance(v, int) and v >= 0, "must be an integer >= 0")

    def token(self, key: str) -> Optional[int]:
        value = self.config.get(key)
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if value is not None and not is_token_id(value):
            raise UsageError(f"{self.path}: {key} = {value!r} must be a token id")
        return value


def generation_preset(folder: str) -> Dict[str, Any]:
    """How the folder's ``generation_config.json`` asks ``transformers``' ``generate`` to choose tokens.

    ``do_sample: true`` gives ``{"strategy": "top_p"}`` with its ``temperature``,
    ``top_k`` and ``top_p``, each at ``transformers``' default where the file has
    none (1.0, 50, 1.0; a ``top_k`` of 0 is no limit), its ``min_p`` (where set
    above 0) and its ``repetition_penalty``. ``num_beams`` above 1 without sampling gives
    ``transformers``' beam search (``{"strategy": "beam", "beam_width":
    num_beams, "beam_scoring": "transformers"}``) with the file's
    ``length_penalty`` (default 1.0) and ``early_stopping`` (default false).
    Whatever the strategy, the rules on tokens it sets come too
    (``no_repeat_ngram_size``, ``forced_bos_token_id`` as ``forced_first_id``,
    ``forced_eos_token_id`` as ``forced_last_id``; :func:`lmkit.decoding.config.rules_of_settings`),
    and an encoder-decoder's folder (BART's) also gives its
    ``min_length`` and ``max_length`` as ``min_new_tokens`` and
    ``max_new_tokens`` (its decoder starts from one token, which
    ``transformers`` counts). A folder that asks for neither sampling nor beams
    (GPT-2's, or none at all) gives no strategy: ``transformers`` would decode
    greedily there, and lmkit keeps its own default.

    Raises:
      UsageError: a value out of range, naming the file and the key.
    """
    path = os.path.join(folder, GENERATION_CONFIG)
    if not os.path.isfile(path):
        return {}
    config = _Reader(path)
    common = {**_lengths(config, folder), **_rules(config)}  # what every strategy takes
    sample = config.get("do_sample")
    if sample not in (None, True, False):
        raise UsageError(f"{path}: do_sample = {sample!r} must be true or false")
    beams = config.number("num_beams", 1, lambda v: isinstance(v, int) and v >= 1, "must be an integer >= 1")
    if sample:  # transformers' sampling (beam sampling, which lmkit lacks, samples too)
        return {**_sampling(config), **common}
    if beams == 1:
        return common
    stopping = config.get("early_stopping", False)
    if stopping not in (True, False, "never"):
        raise UsageError(f"{path}: early_stopping = {stopping!r} must be true, false or \"never\"")
    preset = {"strategy": "beam", "beam_width": beams, "beam_scoring": "transformers",
              "length_penalty": float(config.number("length_penalty", 1.0, lambda v: True, "must be a number")),
              "early_stopping": stopping}
    return {**preset, **common}


def _lengths(config: _Reader, folder: str) -> Dict[str, Any]:
    """An encoder-decoder's ``min_length``/``max_length`` as new tokens (transformers counts the decoder's
    start token in them); nothing for a language model."""
    if not _is_encoder_decoder(folder):
        return {}
    lengths: Dict[str, Any] = {}
    min_length = config.count("min_length")
    max_length = config.number("max_length", None, lambda v: isinstance(v, int) and v >= 2,
                               "must be an integer >= 2")
    max_new = config.number("max_new_tokens", None, lambda v: isinstance(v, int) and v >= 1,
                            "must be an integer >= 1")
    if min_length > 1:
        lengths["min_new_tokens"] = min_length - 1
    if max_new is not None or max_length is not None:
        lengths["max_new_tokens"] = max_new if max_new is not None else max_length - 1
    return lengths


def _rules(config: _Reader) -> Dict[str, Any]:
    """The rules on tokens, for every strategy (as transformers applies its logits processors)."""
    rules: Dict[str, Any] = {}
    no_repeat = config.count("no_repeat_ngram_size")
    if no_repeat:
        rules["no_repeat_ngram_size"] = no_repeat
    for key, name in (("forced_first_id", "forced_bos_token_id"), ("forced_last_id", "forced_eos_token_id")):
        forced = config.token(name)
        if forced is not None:
            rules[key] = forced
    return rules


def _sampling(config: _Reader) -> Dict[str, Any]:
    """``do_sample``'s settings, at transformers' defaults where the file has none."""
    top_k = config.number("top_k", 50, lambda v: isinstance(v, int) and v >= 0,
                          "must be an integer >= 0 (0: no limit)")
    preset = {"strategy": "top_p",
              "temperature": float(config.number("temperature", 1.0, lambda v: v > 0, "must be > 0 when do_sample")),
              "top_k": top_k or None,
              "top_p": float(config.number("top_p", 1.0, lambda v: 0 < v <= 1, "must be in (0, 1]"))}
    min_p = config.number("min_p", None, lambda v: 0 <= v <= 1, "must be in [0, 1] (0 or null: off)")
    if min_p:
        preset["min_p"] = float(min_p)
    penalty = float(config.number("repetition_penalty", 1.0, lambda v: v > 0, "must be > 0 (1 = off)"))
    if penalty != 1.0:
        preset["repetition_penalty"] = penalty
    return preset


def _is_encoder_decoder(folder: str) -> bool:
    from lmkit.hub.converters import converter_of
    try:
        return converter_of(folder).conditional
    except UsageError:
        return False


def model_generation_preset(model_dir: str) -> Tuple[Dict[str, Any], Optional[str]]:
    """``(preset, folder)``: the :func:`generation_preset` a model folder samples with, and the folder whose
    ``generation_config.json`` gave it.

    A Hugging Face folder's own; a run fine-tuned from one (``checkpoints.init_from``), that folder's, while
    it is there (its chat template is read from it too); else ``({}, None)``: lmkit's defaults.
    (:meth:`lmkit.decoding.source.ModelFolder.generation_config` answers the same for generation.)
    """
    if is_hf_folder(model_dir):
        return generation_preset(model_dir), model_dir
    from lmkit.config import stored_setting
    from lmkit.core.layout import read_config_dict
    try:
        source = stored_setting(read_config_dict(model_dir), "init_from")
    except (UsageError, OSError, ValueError):
        return {}, None
    if isinstance(source, str) and is_hf_folder(source):
        return generation_preset(source), source
    return {}, None
