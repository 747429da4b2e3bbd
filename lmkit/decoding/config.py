"""``GenerationConfig``: every knob of a generation in one frozen object that checks itself.

    from lmkit.decoding import GenerationConfig, generate
    config = GenerationConfig(strategy="top_k", top_k=20, max_new_tokens=40, seed=0)
    texts = generate("runs/plays", ["ROMEO:"], config)
    texts = generate("runs/plays", ["ROMEO:"], config, temperature=0.7)  # a keyword overrides its field

A field left at None was not given. :meth:`GenerationConfig.resolve` fills
each from three sources in order: the value given (a flag, a keyword), then
the model folder's ``generation_config.json`` (:meth:`GenerationConfig.from_hf`),
then lmkit's defaults (:data:`lmkit.decoding.registry.DEFAULTS` for the
sampler's settings, :data:`DEFAULTS` for the rest).

A config checks every field it holds when it is built, against the one
table of ranges (:data:`lmkit.decoding.checks.RANGES`, which the samplers and
the rules on tokens use too), and the combinations of fields
(:func:`check_combination`). An error names the setting, the value and the
fix, spelled as Python keywords (``top_p = 1.5 must be in (0, 1]``) or, inside
:func:`~lmkit.decoding.checks.flag_spelling`, as the command line's flags
(``--top_p 1.5 must be in (0, 1]``). No TensorFlow is imported here.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Mapping, Optional, Tuple

from lmkit.core.checks import check_known_keys
from lmkit.core.errors import UsageError
from lmkit.decoding.checks import check_setting, spelled
from lmkit.decoding.registry import DEFAULTS as SAMPLER_DEFAULTS
from lmkit.decoding.registry import RULE_KEYS, resolve_settings, sampler_of_settings

__all__ = ["DEFAULTS", "LENGTH_KEYS", "GenerationConfig", "check_combination", "rules_of_settings"]

#: lmkit's defaults of the settings outside the sampler's (those are :data:`lmkit.decoding.registry.DEFAULTS`).
DEFAULTS: Dict[str, Any] = {"min_new_tokens": 0, "num_samples": 1, "stop": (), "stop_at_eos": False,
                            "use_cache": True, "compiled": True, "batch_size": 32}
#: The lengths an encoder-decoder's ``generation_config.json`` gives (``min_length``, ``max_length``).
LENGTH_KEYS: Tuple[str, ...] = ("min_new_tokens", "max_new_tokens")

def check_combination(values: Mapping[str, Any], chosen_by: str = "") -> None:
    """The settings that cannot go together, among ``values`` (field -> value, None: not given).

    Args:
      chosen_by: who chose the strategy when the caller did not (``" (chosen by ...)"``), for messages.

    Raises:
      UsageError: naming both settings and the fix.
    """
    strategy, penalty = values.get("strategy"), values.get("repetition_penalty")
    if strategy == "beam" and penalty not in (None, 1, 1.0):
        raise UsageError(f"{spelled('repetition_penalty')} applies to the per-token strategies (greedy, sample, "
                         f"top_k, top_p), not to {spelled('strategy', 'beam')}{chosen_by}")
    num, width = values.get("num_samples"), values.get("beam_width")
    if strategy == "beam" and num is not None and width is not None and num > width:
        raise UsageError(f"{spelled('num_samples', num)} exceeds {spelled('beam_width', width)}: beam search keeps "
                         f"beam_width hypotheses; use {spelled('beam_width', num)}")
    if values.get("jit_compile") and (values.get("compiled") is False or values.get("use_cache") is False):
        raise UsageError("jit_compile=True needs compiled=True and use_cache=True (the uncached reference "
                         "grows its input every step, which XLA cannot compile once)")


def rules_of_settings(settings: Mapping[str, Any]):
    """The :class:`~lmkit.decoding.constraints.Constraints` of the rules on tokens among ``settings``
    (``decode(..., rules=)``; a setting left out is off)."""
    from lmkit.decoding.constraints import Constraints
    return Constraints(**{key: settings.get(key, SAMPLER_DEFAULTS[key]) for key in RULE_KEYS})


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """How to generate: lengths, the strategy and its settings, rules on tokens, ends, seed and compilation.

    Every field defaults to None, "not given"; :meth:`resolve` fills them in. Building one checks every
    field against :data:`lmkit.decoding.checks.RANGES` and the fields together (:func:`check_combination`).

    Attributes:
      strategy: ``greedy``, ``sample``, ``top_k``, ``top_p`` or ``beam`` (default ``top_p`` for a language
        model, ``greedy`` for an encoder-decoder).
      temperature, top_k, top_p, min_p: the sampling strategies' (``top_k`` with ``top_p``: the nucleus
        among the ``top_k`` most likely tokens; ``min_p`` is top_p's); repetition_penalty: > 1 makes
        tokens already in a sample less likely (per-token strategies).
      beam_width, beam_scoring, length_penalty, early_stopping: beam search's (:class:`lmkit.decoding.BeamSampler`).
      no_repeat_ngram_size, forced_first_id, forced_last_id: rules on tokens, for every strategy.
      min_new_tokens: new tokens before an end token may be chosen (default 0; :func:`lmkit.decoding.decode`
        also takes one per sequence); max_new_tokens: tokens to generate after the prompt (wins over
        ``max_length``; an encoder-decoder's default: its ``max_positions - 1``); max_length: a language
        model's tokens per sample, the prompt included (default: 50 new tokens).
      num_samples: samples per prompt or source (beam search: its best hypotheses; default 1).
      stop: strings that end a sample (not included); stop_at_eos: a language model's sample also ends at
        its first line break; start_token: put the start token before each prompt.
      eos_id, start_id, pad_id: token ids of :func:`lmkit.decoding.decode` (``generate`` takes the tokenizer's).
      seed: the random strategies' seed (None draws one, reported with the samples).
      context: positions a transformer reads before its window slides (default: what the run trained on).
      batch_size: an encoder-decoder's sources decoded side by side (default 32).
      use_cache, compiled, jit_compile: the decode loop's key/value cache, ``tf.function`` and XLA.
    """

    strategy: Optional[str] = None
    temperature: Optional[float] = None
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    beam_width: Optional[int] = None
    beam_scoring: Optional[str] = None
    length_penalty: Optional[float] = None
    early_stopping: Any = None
    no_repeat_ngram_size: Optional[int] = None
    forced_first_id: Optional[int] = None
    forced_last_id: Optional[int] = None
    min_new_tokens: Any = None
    max_new_tokens: Optional[int] = None
    max_length: Optional[int] = None
    num_samples: Optional[int] = None
    stop: Optional[Tuple[str, ...]] = None
    stop_at_eos: Optional[bool] = None
    start_token: Optional[bool] = None
    eos_id: Any = None
    start_id: Optional[int] = None
    pad_id: Optional[int] = None
    seed: Optional[int] = None
    context: Optional[int] = None
    batch_size: Optional[int] = None
    use_cache: Optional[bool] = None
    compiled: Optional[bool] = None
    jit_compile: Optional[bool] = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):  # one stop string, not its characters
            object.__setattr__(self, "stop", (self.stop,))
        elif self.stop is not None:
            object.__setattr__(self, "stop", tuple(self.stop))
        given = self.given()
        for key, value in given.items():
            check_setting(key, value)
        check_combination(given)

    @classmethod
    def keys(cls) -> Tuple[str, ...]:
        """The names of the fields, in order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str = "generation config") -> "GenerationConfig":
        """A config of ``values`` (field -> value).

        Raises:
          UsageError: a key that is not a field (``<source>: unknown key 'top_q'; did you mean 'top_p'?``), or
            a value out of range.
        """
        check_known_keys(source, values, cls.keys())
        return cls(**values)

    @classmethod
    def from_hf(cls, folder: str) -> "GenerationConfig":
        """What a Hugging Face folder's ``generation_config.json`` asks of ``transformers``' ``generate``
        (:func:`lmkit.hub.generation_config.generation_preset`); a folder without the file gives an empty config.

        Raises:
          UsageError: a value out of range, naming the file and the key.
        """
        from lmkit.hub.generation_config import generation_preset
        path = f"{folder}/generation_config.json"
        try:
            return cls.from_dict(generation_preset(os.fspath(folder)), path)
        except UsageError as exc:
            message = str(exc)
            raise UsageError(message if message.startswith(path) else f"{path}: {message}") from None

    def replace(self, **changes: Any) -> "GenerationConfig":
        """This config with ``changes`` (field -> value); an unknown field is a UsageError naming it."""
        check_known_keys("generation setting", changes, self.keys())
        return dataclasses.replace(self, **changes)

    def given(self) -> Dict[str, Any]:
        """The fields that are set (not None), in field order."""
        return {key: getattr(self, key) for key in self.keys() if getattr(self, key) is not None}

    def resolve(self, preset: Optional["GenerationConfig"] = None,
                default_strategy: str = "top_p") -> Tuple["GenerationConfig", Dict[str, Any]]:
        """Every setting filled in: this config's value, else the ``preset``'s (a model folder's
        :meth:`from_hf`), else lmkit's default; the strategy likewise, else ``default_strategy``.

        As :func:`lmkit.decoding.registry.resolve_settings` resolves a sampler's settings. A ``min_p`` given
        with another strategy than ``top_p``, or a ``repetition_penalty`` given for beam search, is an error.
        Resolving a resolved config changes nothing.

        Returns:
          ``(resolved, used)``: the config, and the preset's values it took (no value was given for
          them), in field order, for a note that says what the folder chose.
        """
        given = self.given()
        offered = preset.given() if preset is not None else {}
        strategy, settings = resolve_settings(self.strategy, given, offered, default_strategy)
        chosen_by = " (chosen by the model folder's generation_config.json; give the strategy to choose another)"
        check_combination({**given, "strategy": strategy}, "" if self.strategy else chosen_by)
        if given.get("min_p") and strategy != "top_p":
            raise UsageError(f"{spelled('min_p')} applies to {spelled('strategy', 'top_p')} (with "
                             f"{spelled('top_p', 1.0)} for min-p sampling alone), not to "
                             f"{spelled('strategy', strategy)}")
        used = {key: value for key, value in offered.items()
                if (key == "strategy" or key in SAMPLER_DEFAULTS) and given.get(key) is None
                and settings.get(key, value) == value}
        values: Dict[str, Any] = {**DEFAULTS, **settings, "strategy": strategy}
        for key in self.keys():
            if key in SAMPLER_DEFAULTS or key == "strategy":
                continue
            if key in given:
                values[key] = given[key]
            elif key in offered:  # an encoder-decoder folder's lengths
                values[key] = used[key] = offered[key]
        return dataclasses.replace(self, **values), used

    def sampler(self):
        """The :class:`~lmkit.decoding.sampler.Sampler` of the (resolved) strategy and its settings."""
        name, settings = resolve_settings(self.strategy, self.given())
        return sampler_of_settings(name, settings)

    def rules(self):
        """The :class:`~lmkit.decoding.constraints.Constraints` of the rules on tokens."""
        return rules_of_settings({key: value for key, value in self.given().items() if key in RULE_KEYS})

    def fit_decoder(self, max_positions: int, used: Dict[str, Any]) -> Tuple["GenerationConfig", Dict[str, Any]]:
        """An encoder-decoder's lengths, fitted to a decoder of ``max_positions`` (the start id included).

        A folder's ``max_length`` (in ``used``, :meth:`resolve`'s) past what the decoder holds becomes that;
        its ``min_length`` at or past the bound lets the end come only last (as in ``transformers``).

        Raises:
          UsageError: a ``max_new_tokens`` that was given past the decoder, or a given ``min_new_tokens``
            that leaves no room for the end.
        """
        limit, used, config = max_positions - 1, dict(used), self
        if used.get("max_new_tokens", 0) > limit:
            config, used["max_new_tokens"] = config.replace(max_new_tokens=limit), limit
        if config.max_new_tokens is not None and config.max_new_tokens > limit:
            raise UsageError(f"{spelled('max_new_tokens', config.max_new_tokens)} exceeds what the decoder holds: "
                             f"{limit} (max_positions {max_positions}, the start id included)")
        bound = limit if config.max_new_tokens is None else config.max_new_tokens
        if "min_new_tokens" in used and config.min_new_tokens >= bound:
            config, used["min_new_tokens"] = config.replace(min_new_tokens=bound - 1), bound - 1
        if config.min_new_tokens is not None and config.min_new_tokens >= bound:
            raise UsageError(f"{spelled('min_new_tokens', config.min_new_tokens)} leaves no room for the end id "
                             f"within {spelled('max_new_tokens', bound)}")
        return config, used
