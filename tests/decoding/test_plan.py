"""lmkit.decoding.plan: a generation planned and checked before any model is built (no TensorFlow needed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lmkit.core.errors import UsageError
from lmkit.decoding.config import GenerationConfig
from lmkit.decoding.plan import plan_generation
from lmkit.decoding.source import Generator, ModelFolder


class Words:
    """The least of a word tokenizer: each word its index in ``WORDS`` (unknown: 1), line breaks id 0."""

    WORDS = ["\n", "<unk>", "the", "old", "cat"]
    name, eos_id, bos_id, vocab_size = "word", 0, None, 5

    def encode(self, text):
        return [self.WORDS.index(w) if w in self.WORDS else 1 for w in text.split()]

    def decode(self, ids):
        return " ".join(self.WORDS[i] for i in ids)


class LanguageModel:
    vocab_size, max_positions, conditional = 5, 16, False


class EncoderDecoder:
    vocab_size, max_positions, conditional = 5, 8, True


def test_a_language_models_prompts_are_encoded_and_their_budgets_checked():
    plan = plan_generation((LanguageModel(), Words()), ["the old", None, [2, 4]], max_length=6, strategy="greedy")
    assert plan.ids == [[2, 3], [], [2, 4]] and plan.budgets == [4, 6, 4] and not plan.conditional
    assert (plan.settings.strategy, plan.settings.seed, plan.single, plan.streams) == ("greedy", None, False, False)
    assert plan_generation((LanguageModel(), Words()), "the", max_new_tokens=3).budgets == [3]  # wins over max_length
    assert plan_generation((LanguageModel(), Words()), "the").budgets == [50]  # the default: 50 new tokens
    with pytest.raises(UsageError, match="prompt 'the old cat' has 3 tokens, leaving none to generate within "
                                         "max_length = 3 .*; use max_length = 4 or more, or max_new_tokens"):
        plan_generation((LanguageModel(), Words()), ["the old cat"], max_length=3)
    with pytest.raises(UsageError, match="prompt '  ' is empty after tokenization"):
        plan_generation((LanguageModel(), Words()), "  ")
    with pytest.raises(UsageError, match="no prompts: give at least one"):
        plan_generation((LanguageModel(), Words()), [])


def test_a_random_strategy_gets_its_seed_when_planned_and_streaming_is_checked():
    plan = plan_generation((LanguageModel(), Words()), "the", strategy="top_k")
    assert isinstance(plan.settings.seed, int) and plan.streams and plan.single
    assert plan_generation((LanguageModel(), Words()), "the", strategy="top_k", seed=7).settings.seed == 7
    assert plan_generation((LanguageModel(), Words()), "the", strategy="beam").settings.seed is None
    with pytest.raises(UsageError, match="stream writes one sample as it comes"):
        plan_generation((LanguageModel(), Words()), "the", num_samples=2, stream=True)
    with pytest.raises(UsageError, match="stream writes one sample as it comes"):
        plan_generation((LanguageModel(), Words()), "the", strategy="beam", stream=True)


def test_unknown_words_of_a_word_vocabulary_are_warned_about():
    class Vocabulary(dict):
        unk_id = 1

        def id_to_token(self, i):
            return "<unk>"
    tokenizer = Words()
    tokenizer.vocab = Vocabulary.fromkeys(Words.WORDS)
    plan = plan_generation((LanguageModel(), tokenizer), ["the zzz", "The cat"])
    assert plan.warnings == ["prompt 0: 'zzz' not in the vocabulary (5 words); read as <unk>",
                             "prompt 1: 'The' (try 'the') not in the vocabulary (5 words); read as <unk>"]


def test_an_encoder_decoders_sources_and_settings_are_checked():
    generator = Generator(EncoderDecoder(), Words(), Words())
    plan = plan_generation(generator, ["the old", "cat"], min_new_tokens=2)
    assert plan.conditional and plan.inputs == ["the old", "cat"] and plan.settings.strategy == "greedy"
    assert plan.settings.max_new_tokens is None and plan.settings.min_new_tokens == 2  # fitted: loaded already
    for options, message in [(dict(stop=["x"]), "stop applies to language models; the model holds an "
                                                "encoder-decoder"),
                             (dict(max_length=5), "max_length applies to language models"),
                             (dict(num_samples=2), "num_samples = 2: greedy decoding writes one output per source"),
                             (dict(max_new_tokens=9), r"max_new_tokens = 9 exceeds what the decoder holds: 7"),
                             (dict(min_new_tokens=7), "min_new_tokens = 7 leaves no room for the end id"),
                             (dict(stream=True), "an encoder-decoder's outputs come a batch at a time")]:
        with pytest.raises(UsageError, match=message):
            plan_generation(generator, ["the"], **options)
    with pytest.raises(UsageError, match="source 1 = \\[2, 3\\]: an encoder-decoder decodes texts"):
        plan_generation(generator, [[2, 3]])
    with pytest.raises(UsageError, match="chat conversations are for language models"):
        plan_generation(generator, [[{"role": "user", "content": "hi"}]])


def write(folder, name, content):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(content), encoding="utf-8")


@pytest.fixture
def folder_with_preset(tmp_path, monkeypatch):
    """A Hugging Face folder (looked at, never loaded) whose generation_config.json samples at temperature 0.6."""
    write(tmp_path, "config.json", {"model_type": "llama"})
    write(tmp_path, "generation_config.json", {"do_sample": True, "temperature": 0.6, "top_k": 20,
                                               "no_repeat_ngram_size": 3})
    monkeypatch.setattr(ModelFolder, "tokenizer", lambda self, checkpoint=None: Words())
    return str(tmp_path)


def test_a_folders_preset_fills_what_is_not_given_and_the_note_names_what_it_used(folder_with_preset):
    plan = plan_generation(folder_with_preset, "the", max_new_tokens=4)
    assert (plan.settings.strategy, plan.settings.temperature, plan.settings.top_k) == ("top_p", 0.6, 20)
    assert plan.note() == (f"{folder_with_preset}/generation_config.json: strategy top_p, temperature 0.6, top_k 20, "
                           "top_p 1.0, no_repeat_ngram_size 3 (as transformers' generate; a value given overrides "
                           "each)")
    greedy = plan_generation(folder_with_preset, "the", strategy="greedy")
    assert greedy.note().endswith(": no_repeat_ngram_size 3 (as transformers' generate; a value given overrides each)")
    # Deterministic (lmkit evaluate's BLEU): the folder's sampling is left out, its rules stay.
    plain = plan_generation(folder_with_preset, "the", deterministic=True)
    assert (plain.settings.strategy, plain.settings.no_repeat_ngram_size, plain.settings.temperature) == \
        ("top_p", 3, 1.0)


def test_a_sampler_of_the_callers_own_is_used_and_the_folder_is_not_read(folder_with_preset):
    plan = plan_generation(folder_with_preset, "the", sampler=_Own())
    assert plan.sampler is not None and plan.strategy == "sample" and plan.used == {} and plan.note() is None
    with pytest.raises(UsageError, match="sampler = 'greedy' is not an lmkit.decoding Sampler"):
        plan_generation(folder_with_preset, "the", sampler="greedy")
    with pytest.raises(UsageError, match="tokenizer= is for a model object"):
        plan_generation(folder_with_preset, "the", tokenizer=Words())


def _Own():
    from lmkit.decoding.samplers import RandomSampler
    return RandomSampler(0.5)


def test_planning_a_folder_starts_no_tensorflow(tmp_path):
    write(tmp_path / "run", "config.json", {"data": "pairs"})
    code = ("import sys\nfrom lmkit.decoding.plan import plan_generation\nfrom lmkit.decoding.config import "
            "GenerationConfig\nfrom lmkit.decoding import source\n"
            "source.ModelFolder.tokenizer = lambda self, checkpoint=None: None\n"
            f"plan = plan_generation({str(tmp_path / 'run')!r}, ['a b'], GenerationConfig(strategy='beam'))\n"
            "assert plan.conditional and plan.settings.beam_width == 4\n"
            "assert 'tensorflow' not in sys.modules, sorted(sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_the_config_keywords_and_0_2s_spellings():
    plan = plan_generation((LanguageModel(), Words()), "the", GenerationConfig(top_k=5), top_k=9, strategy="top_k")
    assert plan.settings.top_k == 9  # a keyword wins over the config
    with pytest.raises(UsageError, match=r"generate\(prompts=...\) was removed in lmkit 0.3"):
        plan_generation((LanguageModel(), Words()), prompts=["the"])
