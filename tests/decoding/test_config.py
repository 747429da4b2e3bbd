"""lmkit.decoding.config: GenerationConfig checks itself (one table of ranges, errors spelled as keywords or flags),
resolves a flag, then the folder's generation_config.json, then lmkit's defaults; unknown keys are named; a
resolved config builds its sampler and rules."""

from __future__ import annotations

import json

import pytest

from lmkit.core.errors import UsageError
from lmkit.decoding.config import DEFAULTS, GenerationConfig, rules_of_settings
from lmkit.decoding.registry import DEFAULTS as SAMPLER_DEFAULTS

# Llama 3 Instruct's generation_config.json, as lmkit reads it (lmkit.hub.generation_config.generation_preset).
SAMPLING = GenerationConfig(strategy="top_p", temperature=0.6, top_k=50, top_p=0.9, repetition_penalty=1.1)
# bart-large-cnn's: transformers' beam search, its rules on tokens and its lengths in new tokens.
SUMMARIZER = GenerationConfig(strategy="beam", beam_width=4, beam_scoring="transformers", length_penalty=2.0,
                              early_stopping=True, no_repeat_ngram_size=3, forced_first_id=0, forced_last_id=2,
                              min_new_tokens=55, max_new_tokens=141)


def test_nothing_given_nothing_preset_is_lmkits_defaults():
    resolved, used = GenerationConfig().resolve()
    assert used == {}
    assert resolved.strategy == "top_p" and resolved.top_k is None  # top_p takes the whole nucleus
    assert {key: getattr(resolved, key) for key in SAMPLER_DEFAULTS if key not in ("top_k", "early_stopping")} == \
        {key: value for key, value in SAMPLER_DEFAULTS.items() if key not in ("top_k", "early_stopping")}
    assert resolved.early_stopping == "never"  # gnmt's own: the search stops when nothing can improve
    assert {key: getattr(resolved, key) for key in DEFAULTS} == DEFAULTS
    assert (resolved.max_new_tokens, resolved.seed, resolved.context) == (None, None, None)
    assert GenerationConfig().resolve(default_strategy="greedy")[0].strategy == "greedy"
    assert GenerationConfig(strategy="top_k").resolve()[0].top_k == 40  # top_k's own default


def test_a_flag_wins_over_the_folder_which_wins_over_the_defaults():
    given = GenerationConfig(top_p=0.5, max_new_tokens=20)
    resolved, used = given.resolve(SAMPLING)
    assert (resolved.strategy, resolved.top_p, resolved.temperature, resolved.top_k, resolved.repetition_penalty) == \
        ("top_p", 0.5, 0.6, 50, 1.1)
    assert (resolved.beam_width, resolved.max_new_tokens, resolved.min_new_tokens) == (4, 20, 0)  # defaults, given
    assert used == {"strategy": "top_p", "temperature": 0.6, "top_k": 50, "repetition_penalty": 1.1}
    # A strategy given wins over the folder's; the folder's values still fill the gaps, as in transformers.
    resolved, used = GenerationConfig(strategy="top_k").resolve(SAMPLING)
    assert (resolved.strategy, resolved.top_k, resolved.temperature) == ("top_k", 50, 0.6) and "strategy" not in used
    # Beam search leaves the folder's repetition penalty out (it refuses one); a given one is an error.
    assert GenerationConfig(strategy="beam").resolve(SAMPLING)[0].repetition_penalty == 1.0
    with pytest.raises(UsageError, match="repetition_penalty applies to the per-token strategies .* not to "
                                         "strategy = 'beam'$"):
        GenerationConfig(strategy="beam", repetition_penalty=1.2)
    with pytest.raises(UsageError, match=r"not to strategy = 'beam' \(chosen by the model folder's"):
        GenerationConfig(repetition_penalty=1.2).resolve(GenerationConfig(strategy="beam"))
    with pytest.raises(UsageError, match=r"min_p applies to strategy = 'top_p' .* not to strategy = 'top_k'"):
        GenerationConfig(strategy="top_k", min_p=0.1).resolve(SAMPLING)
    assert GenerationConfig(strategy="greedy").resolve(GenerationConfig(min_p=0.1))[0].min_p == 0.1  # unused


def test_an_encoder_decoder_folder_gives_its_search_rules_and_lengths():
    resolved, used = GenerationConfig(max_new_tokens=30).resolve(SUMMARIZER, default_strategy="greedy")
    assert (resolved.strategy, resolved.beam_width, resolved.beam_scoring, resolved.length_penalty,
            resolved.early_stopping, resolved.no_repeat_ngram_size, resolved.min_new_tokens,
            resolved.max_new_tokens) == ("beam", 4, "transformers", 2.0, True, 3, 55, 30)
    assert "max_new_tokens" not in used and used["min_new_tokens"] == 55
    # The note of what the folder chose lists its values in this order.
    assert list(GenerationConfig().resolve(SUMMARIZER)[1]) == [
        "strategy", "beam_width", "beam_scoring", "length_penalty", "early_stopping", "no_repeat_ngram_size",
        "forced_first_id", "forced_last_id", "min_new_tokens", "max_new_tokens"]
    # lmkit's own search scores otherwise: the folder's length_penalty and early_stopping are not its.
    gnmt = GenerationConfig(beam_scoring="gnmt").resolve(SUMMARIZER)[0]
    assert (gnmt.length_penalty, gnmt.early_stopping, gnmt.no_repeat_ngram_size) == (0.6, "never", 3)
    # Fitted to a decoder of 24 positions: the folder's max_length becomes 23, its min_length lets the end come last.
    fitted, used = GenerationConfig().resolve(SUMMARIZER)[0].fit_decoder(24, GenerationConfig().resolve(SUMMARIZER)[1])
    assert (fitted.max_new_tokens, fitted.min_new_tokens, used["max_new_tokens"], used["min_new_tokens"]) == \
        (23, 22, 23, 22)
    kept, _ = GenerationConfig(min_new_tokens=1).resolve(SUMMARIZER)[0].fit_decoder(24, {"max_new_tokens": 141})
    assert (kept.max_new_tokens, kept.min_new_tokens) == (23, 1)  # a given value stays as given


def test_resolving_twice_changes_nothing_and_builds_the_sampler_and_rules():
    for given, preset in ((GenerationConfig(), SAMPLING), (GenerationConfig(beam_scoring="gnmt"), SUMMARIZER),
                          (GenerationConfig(strategy="sample", seed=3), None)):
        resolved, _ = given.resolve(preset)
        assert resolved.resolve(preset)[0] == resolved
    from lmkit.decoding import BeamSampler, TopPSampler
    assert SAMPLING.resolve()[0].sampler() == TopPSampler(0.9, 0.6, k=50)
    resolved = GenerationConfig().resolve(SUMMARIZER)[0]
    assert resolved.sampler() == BeamSampler(4, 2.0, scoring="transformers", early_stopping=True)
    rules = resolved.rules()
    assert (rules.no_repeat_ngram_size, rules.forced_first_id, rules.forced_last_id) == (3, 0, 2)
    assert not GenerationConfig().rules().active


def test_unknown_keys_and_strategies_are_named():
    with pytest.raises(UsageError, match="generation config: unknown key 'top_q'; did you mean 'top_p'"):
        GenerationConfig.from_dict({"top_q": 0.9})
    with pytest.raises(UsageError, match="unknown key 'num_beams'"):
        GenerationConfig().replace(num_beams=4)
    with pytest.raises(UsageError, match="strategy = 'nucleus' is not one of greedy, sample, top_k, top_p, beam"):
        GenerationConfig(strategy="nucleus")
    assert GenerationConfig.from_dict({"top_p": 0.8, "stop": ["\n\n"]}).given() == {"top_p": 0.8, "stop": ("\n\n",)}
    assert GenerationConfig(stop="x").stop == ("x",)


def test_from_hf_reads_a_folders_generation_config(tmp_path):
    folder = tmp_path / "llama"
    folder.mkdir()
    assert GenerationConfig.from_hf(str(folder)) == GenerationConfig()  # no file: nothing asked
    (folder / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.1, "eos_token_id": 0}))
    assert GenerationConfig.from_hf(str(folder)) == SAMPLING
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0}))
    with pytest.raises(UsageError, match="generation_config.json: temperature = 0 must be > 0"):
        GenerationConfig.from_hf(str(folder))


def test_the_rules_of_settings_are_constraints():
    rules = rules_of_settings({"no_repeat_ngram_size": 3, "forced_last_id": 2})
    assert (rules.no_repeat_ngram_size, rules.forced_first_id, rules.forced_last_id) == (3, None, 2)
    assert not rules_of_settings({}).active
    with pytest.raises(UsageError, match="no_repeat_ngram_size = -1 must be an integer >= 0"):
        rules_of_settings({"no_repeat_ngram_size": -1})
