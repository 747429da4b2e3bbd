"""lmkit.decoding.registry: samplers by name, and a decode's settings resolved (given, a folder's, the defaults)."""

from __future__ import annotations

import pytest

from lmkit.decoding import (
    SAMPLER_NAMES,
    BeamSampler,
    GreedySampler,
    RandomSampler,
    TopKSampler,
    TopPSampler,
    get_sampler,
)
from lmkit.decoding.registry import DEFAULTS, resolve_settings, sampler_of_settings


def test_get_sampler_factory():
    assert SAMPLER_NAMES == ("greedy", "sample", "top_k", "top_p", "beam")
    assert get_sampler("greedy") == GreedySampler()
    assert get_sampler("sample", temperature=0.5) == RandomSampler(0.5)
    assert get_sampler("top_k", k=5) == TopKSampler(5)
    assert get_sampler("top_p", p=0.8, temperature=0.7) == TopPSampler(0.8, 0.7)
    beam = get_sampler("beam", beam_width=3, length_penalty=0.6)
    assert isinstance(beam, BeamSampler) and beam.beam_width == 3 and beam.length_penalty == 0.6
    with pytest.raises(ValueError, match="unknown sampler 'top-k'.*did you mean 'top_k'.*choices: greedy"):
        get_sampler("top-k")
    with pytest.raises(ValueError, match="does not accept"):
        get_sampler("greedy", k=3)


def test_resolve_settings_takes_given_then_preset_then_defaults():
    none = dict.fromkeys(DEFAULTS)
    # Nothing given, nothing preset: lmkit's top_p 0.9 over the whole nucleus.
    name, settings = resolve_settings(None, none)
    assert name == "top_p" and settings == {**DEFAULTS, "top_k": None, "early_stopping": "never"}
    assert sampler_of_settings(name, settings) == TopPSampler(0.9, 1.0)
    assert resolve_settings("top_k", none)[1]["top_k"] == 40  # top_k's own default
    # A folder's sampling preset fills what is not given; a given value wins.
    preset = {"strategy": "top_p", "temperature": 0.6, "top_k": 50, "top_p": 0.95, "repetition_penalty": 1.1}
    name, settings = resolve_settings(None, {**none, "top_p": 0.5}, preset)
    assert sampler_of_settings(name, settings) == TopPSampler(0.5, 0.6, k=50)
    assert settings["repetition_penalty"] == 1.1
    # A strategy given wins over the preset's; the preset's values still fill the gaps, as in transformers.
    name, settings = resolve_settings("top_k", none, preset)
    assert sampler_of_settings(name, settings) == TopKSampler(50, 0.6)
    # Beam search leaves out a preset repetition penalty (it refuses one), not a given one.
    assert resolve_settings("beam", none, preset)[1]["repetition_penalty"] == 1.0
    assert resolve_settings("beam", {**none, "repetition_penalty": 1.2}, preset)[1]["repetition_penalty"] == 1.2
    # Beam search's early stopping is its scoring's own unless given or preset.
    assert resolve_settings("beam", none)[1]["early_stopping"] == "never"
    assert resolve_settings("beam", {**none, "beam_scoring": "transformers"})[1]["early_stopping"] is False
    assert resolve_settings("beam", {**none, "early_stopping": True})[1]["early_stopping"] is True
    name, settings = resolve_settings(None, none, {"strategy": "beam", "beam_width": 5})
    assert name == "beam" and settings["beam_width"] == 5
    assert resolve_settings(None, none, default_strategy="greedy")[0] == "greedy"
