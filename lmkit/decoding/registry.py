"""The sampler registry: a strategy name -> its class, and a strategy's settings (no TensorFlow import).

``lmkit generate --strategy NAME`` and :func:`get_sampler` both read
:data:`SAMPLERS`; adding a strategy is one file and one line here.
:func:`resolve_settings` fills a sampler's settings (given, a folder's, the
:data:`DEFAULTS`), as :meth:`lmkit.decoding.config.GenerationConfig.resolve` does for a whole generation.
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, Mapping, Optional, Tuple

from lmkit.core.errors import UsageError
from lmkit.core.registry import import_object, lookup

__all__ = ["SAMPLERS", "SAMPLER_NAMES", "DEFAULTS", "RULE_KEYS", "SCORED_BY", "SCORINGS", "get_sampler",
           "resolve_settings", "sampler_from_flags", "sampler_of_settings"]

SAMPLERS: Dict[str, str] = {
    "greedy": "lmkit.decoding.samplers:GreedySampler",
    "sample": "lmkit.decoding.samplers:RandomSampler",
    "top_k": "lmkit.decoding.samplers:TopKSampler",
    "top_p": "lmkit.decoding.samplers:TopPSampler",
    "beam": "lmkit.decoding.beam:BeamSampler",
}
SAMPLER_NAMES: Tuple[str, ...] = tuple(SAMPLERS)

#: How beam search scores a finished hypothesis: GNMT's length normalization (lmkit's) or ``transformers``'.
SCORINGS: Tuple[str, ...] = ("gnmt", "transformers")
#: Beam search's ``early_stopping`` where none is given or preset: lmkit's search stops only when nothing can
#: improve (``"never"``, the canonical search), ``transformers``' as ``transformers`` does (False).
EARLY_STOPPING: Dict[str, Any] = {"gnmt": "never", "transformers": False}

#: The settings a caller leaves out (None) and a model folder does not give. ``top_k`` is the
#: ``top_k`` strategy's; lmkit's ``top_p`` takes the whole nucleus unless a ``top_k`` is given;
#: ``early_stopping`` is the scoring's own (:data:`EARLY_STOPPING`).
DEFAULTS: Dict[str, Any] = {"temperature": 1.0, "top_k": 40, "top_p": 0.9, "min_p": None, "beam_width": 4,
                            "length_penalty": 0.6, "repetition_penalty": 1.0, "beam_scoring": "gnmt",
                            "early_stopping": None, "no_repeat_ngram_size": 0, "forced_first_id": None,
                            "forced_last_id": None}
#: What a beam search's ``length_penalty`` and ``early_stopping`` mean depends on its scoring: a preset's
#: values of these are taken only for the preset's own scoring.
SCORED_BY: Tuple[str, ...] = ("length_penalty", "early_stopping")
#: The settings that are rules on tokens, for every strategy (:class:`lmkit.decoding.constraints.Constraints`).
RULE_KEYS: Tuple[str, ...] = ("no_repeat_ngram_size", "forced_first_id", "forced_last_id")


def get_sampler(name: str, **kwargs: Any):
    """Builds a sampler by name.

    Args:
      name: one of :data:`SAMPLER_NAMES` (``"greedy"``, ``"sample"``,
        ``"top_k"``, ``"top_p"``, ``"beam"``).
      **kwargs: constructor arguments of that sampler (``temperature``, ``k``,
        ``p``, ``beam_width``, ``length_penalty``).

    Returns:
      A :class:`~lmkit.decoding.sampler.Sampler`.

    Raises:
      UsageError: unknown name, or an argument the sampler does not take.
    """
    cls = lookup(SAMPLERS, name, "sampler")
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise UsageError(f"sampler {name!r} does not accept {sorted(kwargs)}: {exc}") from None


def resolve_settings(strategy: Optional[str], given: Mapping[str, Any],
                     preset: Optional[Mapping[str, Any]] = None,
                     default_strategy: str = "top_p") -> Tuple[str, Dict[str, Any]]:
    """The strategy and the :data:`DEFAULTS` settings of a decode, from three sources in order.

    Each setting ``given`` (not None) wins, then the ``preset``'s (a Hugging
    Face folder's ``generation_config.json``, :func:`lmkit.hub.generation_config.generation_preset`),
    then :data:`DEFAULTS`; so does the strategy (``strategy``, the preset's
    ``"strategy"``, ``default_strategy``). ``top_k`` limits ``top_p`` only where it
    is given or preset (``transformers`` samples with temperature, top-k and
    top-p together). A preset's ``repetition_penalty`` is left out of beam search,
    which scores whole hypotheses, and its ``length_penalty`` and
    ``early_stopping`` when the search scores otherwise than the preset's
    (``beam_scoring``; :data:`SCORED_BY`).

    Returns:
      ``(strategy, settings)``: every key of :data:`DEFAULTS`; ``top_k`` None
      for a ``top_p`` decode without one.
    """
    preset = dict(preset or {})
    name = strategy or preset.pop("strategy", None) or default_strategy
    if name == "beam":
        preset.pop("repetition_penalty", None)
    scoring = given.get("beam_scoring") or preset.get("beam_scoring") or DEFAULTS["beam_scoring"]
    if scoring != (preset.get("beam_scoring") or DEFAULTS["beam_scoring"]):
        for key in SCORED_BY:
            preset.pop(key, None)
    settings: Dict[str, Any] = {}
    for key, default in DEFAULTS.items():
        value = given.get(key)
        if value is None:
            value = preset.get(key)
        if value is None and not (key == "top_k" and name == "top_p"):
            value = default
        settings[key] = value
    if settings["early_stopping"] is None:
        settings["early_stopping"] = EARLY_STOPPING.get(settings["beam_scoring"], False)
    return name, settings


def sampler_from_flags(name: str, **flags: Any):
    """The sampler ``name`` built from those of ``flags`` its constructor takes.

    For callers that hold every strategy's settings at once (``lmkit generate``'s
    flags, :func:`lmkit.generate`'s keywords): ``k`` reaches ``top_k`` only, and so on.

    Raises:
      UsageError: an unknown name.
    """
    if name not in SAMPLERS:
        raise UsageError(f"strategy {name!r} is not one of {', '.join(SAMPLER_NAMES)}")
    cls = import_object(SAMPLERS[name], "sampler")
    takes = inspect.signature(cls.__init__).parameters
    return cls(**{k: v for k, v in flags.items() if k in takes})


def sampler_of_settings(name: str, settings: Mapping[str, Any]):
    """The sampler ``name`` with :func:`resolve_settings`' ``settings`` (``top_k`` reaches top_k's ``k`` and
    top_p's limit, ``top_p`` its ``p``, ``min_p`` top_p's ``min_p``)."""
    return sampler_from_flags(name, temperature=settings["temperature"], k=settings["top_k"], p=settings["top_p"],
                              min_p=settings["min_p"], beam_width=settings["beam_width"],
                              length_penalty=settings["length_penalty"], scoring=settings["beam_scoring"],
                              early_stopping=settings["early_stopping"])
