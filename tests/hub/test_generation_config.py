"""A Hugging Face folder's generation_config.json chooses how lmkit samples, as it chooses for transformers."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf  # noqa: E402
import torch  # noqa: E402  (a test dependency of the main environment: make setup)
from transformers import GenerationConfig, LlamaForCausalLM  # noqa: E402
from transformers.generation.logits_process import (  # noqa: E402
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from lmkit.core.errors import UsageError  # noqa: E402
from lmkit.decoding import TopPSampler  # noqa: E402
from lmkit.hub.generation_config import generation_preset  # noqa: E402
from tests.decoding.fakes import check_decidable_nucleus  # noqa: E402
from tests.helpers import decidable_greedy  # noqa: E402
from tests.models.llama.test_convert import _lmkit, make_llama_folder  # noqa: E402

pytestmark = pytest.mark.transformers


def warped(logits, temperature, top_k, top_p):
    """transformers' sampling scores of ``logits``: its temperature, then top-k, then top-p warpers."""
    scores = torch.tensor(logits)
    warpers = [TemperatureLogitsWarper(temperature)]
    if top_k is not None:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    for warper in warpers:
        scores = warper(None, scores)
    return scores


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.6, 50, 0.9), (1.0, 50, 1.0), (1.3, 4, 0.7), (0.8, 1, 0.9),
                                                        (0.7, None, 0.8)])
def test_top_p_with_k_keeps_what_transformers_warpers_keep(temperature, top_k, top_p):
    """transformers samples from temperature, then top-k, then top-p (that order in its generate): lmkit's
    TopPSampler(p, temperature, k) draws among the same tokens with the same probabilities."""
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 3.0, (5, 257)).astype(np.float32)
    check_decidable_nucleus(logits, top_p, temperature, top_k)
    expected = torch.softmax(warped(logits, temperature, top_k, top_p), dim=-1).numpy()
    ids, candidate_logits = TopPSampler(p=top_p, temperature=temperature, k=top_k).candidates(tf.constant(logits))
    got = np.zeros_like(expected)
    np.put_along_axis(got, ids.numpy(), tf.nn.softmax(candidate_logits, axis=-1).numpy(), axis=-1)
    np.testing.assert_array_equal(got > 0, expected > 0)  # the same tokens kept
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("temperature, top_k, top_p, min_p", [(1.0, None, 1.0, 0.05), (0.7, 20, 0.8, 0.1),
                                                               (1.3, 50, 1.0, 0.2), (0.9, None, 0.85, 0.5)])
def test_min_p_keeps_what_transformers_min_p_keeps(temperature, top_k, top_p, min_p):
    """transformers' min-p comes after its top-k and top-p: a token stays when its probability is at least
    min_p times the top token's. lmkit's TopPSampler(..., min_p) keeps the same tokens, with the same
    probabilities, and fewer than without min_p."""
    rng = np.random.default_rng(11)
    logits = rng.normal(0, 3.0, (6, 257)).astype(np.float32)
    check_decidable_nucleus(logits, top_p, temperature, top_k)
    scores = warped(logits, temperature, top_k, top_p)
    # Decidable: no kept token's probability within 1e-4 (relative) of the threshold, where float32 rounding
    # of either framework could move it across. The ratio to the top token is exp of the logits' difference.
    scaled = scores.double().numpy()
    ratio = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
    assert np.min(np.abs(ratio[np.isfinite(scaled)] - min_p)) > 1e-4 * min_p, "min-p boundary within rounding"
    expected = torch.softmax(MinPLogitsWarper(min_p)(None, scores), dim=-1).numpy()
    sampler = TopPSampler(p=top_p, temperature=temperature, k=top_k, min_p=min_p)
    ids, candidate_logits = sampler.candidates(tf.constant(logits))
    got = np.zeros_like(expected)
    np.put_along_axis(got, ids.numpy(), tf.nn.softmax(candidate_logits, axis=-1).numpy(), axis=-1)
    np.testing.assert_array_equal(got > 0, expected > 0)  # the same tokens kept
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
    without = TopPSampler(p=top_p, temperature=temperature, k=top_k).candidates(tf.constant(logits))[1]
    assert np.sum(np.isfinite(candidate_logits.numpy())) < np.sum(np.isfinite(without.numpy()))
    assert sampler.get_config()["min_p"] == min_p


def test_min_p_out_of_range_is_one_error():
    for value in (-0.1, 1.5, True, "0.1"):
        with pytest.raises(UsageError, match=r"min_p = .* must be in \[0, 1\] \(0 or None: off\)"):
            TopPSampler(min_p=value)
    assert TopPSampler(min_p=0).min_p is None and TopPSampler(min_p=None).get_config()["min_p"] is None


def write_generation_config(folder, **values):
    path = os.path.join(folder, "generation_config.json")
    with open(path, "w") as f:
        json.dump(values, f)
    return path


@pytest.mark.parametrize("values, preset, mode", [
    # Llama 3 Instruct's: sampling with transformers' top_k 50 besides its temperature and top_p
    (dict(do_sample=True, temperature=0.6, top_p=0.9), dict(strategy="top_p", temperature=0.6, top_k=50, top_p=0.9),
     "sample"),
    # Qwen2.5 Instruct's, with a repetition penalty
    (dict(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05),
     dict(strategy="top_p", temperature=0.7, top_k=20, top_p=0.8, repetition_penalty=1.05), "sample"),
    (dict(do_sample=True, top_k=0), dict(strategy="top_p", temperature=1.0, top_k=None, top_p=1.0), "sample"),
    # min-p sampling (0 is off, as in transformers)
    (dict(do_sample=True, min_p=0.05, top_k=0), dict(strategy="top_p", temperature=1.0, top_k=None, top_p=1.0,
                                                     min_p=0.05), "sample"),
    (dict(do_sample=True, min_p=0), dict(strategy="top_p", temperature=1.0, top_k=50, top_p=1.0), "sample"),
    # transformers' beam search, its early_stopping at transformers' default
    (dict(num_beams=4, length_penalty=2.0), dict(strategy="beam", beam_width=4, beam_scoring="transformers",
                                                 length_penalty=2.0, early_stopping=False), "beam_search"),
    # a language model's min_length / max_length count its prompt: not read (an encoder-decoder's are)
    (dict(num_beams=2, early_stopping="never", no_repeat_ngram_size=3, min_length=9, max_length=30),
     dict(strategy="beam", beam_width=2, beam_scoring="transformers", length_penalty=1.0, early_stopping="never",
          no_repeat_ngram_size=3), "beam_search"),
    # GPT-2's: no choice made, so lmkit keeps its own default
    (dict(bos_token_id=0, eos_token_id=0), {}, "greedy_search"),
    (dict(do_sample=False, temperature=0.6), {}, "greedy_search"),
])
def test_generation_preset_follows_transformers_generation_mode(tmp_path, values, preset, mode):
    folder = str(tmp_path)
    write_generation_config(folder, **values)
    assert generation_preset(folder) == preset
    config = GenerationConfig.from_pretrained(folder)
    assert config.get_generation_mode() == mode
    if mode == "sample":  # the values transformers samples with, its defaults filled in
        assert preset["temperature"] == (config.temperature or 1.0)
        assert preset["top_p"] == (config.top_p or 1.0)
        assert preset["top_k"] == ((config.top_k if config.top_k is not None else 50) or None)


def test_generation_preset_without_a_file_and_with_bad_values(tmp_path):
    folder = str(tmp_path)
    assert generation_preset(folder) == {}
    for values, message in [(dict(do_sample=True, temperature=0), "temperature = 0 must be > 0"),
                            (dict(do_sample=True, top_p=1.5), r"top_p = 1.5 must be in \(0, 1\]"),
                            (dict(do_sample=True, top_k=-1), "top_k = -1 must be an integer >= 0"),
                            (dict(do_sample=True, min_p=1.5), r"min_p = 1.5 must be in \[0, 1\]"),
                            (dict(num_beams=0), "num_beams = 0 must be an integer >= 1"),
                            (dict(do_sample="yes"), "do_sample = 'yes' must be true or false")]:
        path = write_generation_config(folder, **values)
        with pytest.raises(UsageError, match=f"{path}: {message}"):
            generation_preset(folder)


def parsed(*argv):
    """``lmkit generate``'s flags planned as the command plans them (no model built)."""
    from lmkit.cli.generate import build_parser, plan_of_flags
    return plan_of_flags(build_parser().parse_args(list(argv)))


def test_generate_flags_take_the_folders_preset_and_override_it(tmp_path):
    folder = str(tmp_path / "llama")
    make_llama_folder(folder)
    base = ["--model_dir", folder, "--prompt", "the cat"]

    def settings(*flags):
        resolved = parsed(*base, *flags).settings
        return resolved.strategy, resolved.top_p, resolved.top_k, resolved.temperature
    # The folder's save_pretrained wrote ids only: lmkit's top_p 0.9 over the whole nucleus.
    plan = parsed(*base)
    assert settings() == ("top_p", 0.9, None, 1.0) and plan.used == {}
    write_generation_config(folder, do_sample=True, temperature=0.6, top_p=0.9, repetition_penalty=1.1,
                            eos_token_id=0)
    assert settings() == ("top_p", 0.9, 50, 0.6) and parsed(*base).settings.repetition_penalty == 1.1
    plan = parsed(*base, "--top_k", "5", "--temperature", "1.0")
    assert settings("--top_k", "5", "--temperature", "1.0") == ("top_p", 0.9, 5, 1.0)
    assert plan.used == {"strategy": "top_p", "top_p": 0.9, "repetition_penalty": 1.1}
    plan = parsed(*base, "--strategy", "beam")  # a beam search leaves the preset's penalty out
    assert (plan.settings.strategy, plan.settings.beam_width, plan.settings.repetition_penalty) == ("beam", 4, 1.0)
    write_generation_config(folder, num_beams=3)
    plan = parsed(*base, "--num_samples", "3")
    assert (plan.settings.strategy, plan.settings.beam_width) == ("beam", 3)
    with pytest.raises(UsageError, match=r"not to --strategy beam \(chosen by the model folder's generation_config"):
        parsed(*base, "--repetition_penalty", "1.3")
    assert parsed(*base, "--repetition_penalty", "1.3", "--strategy", "greedy").settings.strategy == "greedy"
    # min_p: the folder's, a flag's, and refused where the strategy would ignore it
    write_generation_config(folder, do_sample=True, min_p=0.1, top_p=1.0)
    plan = parsed(*base)
    sampler = plan.settings.sampler()
    assert (plan.settings.strategy, sampler.min_p, sampler.p) == ("top_p", 0.1, 1.0)
    assert "min_p 0.1" in plan.note()
    assert parsed(*base, "--min_p", "0.3").settings.sampler().min_p == 0.3
    assert parsed(*base, "--min_p", "0").settings.sampler().min_p is None
    assert parsed(*base, "--strategy", "greedy").settings.strategy == "greedy"  # the folder's min_p goes unused there
    assert "min_p" not in (parsed(*base, "--strategy", "greedy").note() or "")
    with pytest.raises(UsageError, match=r"--min_p applies to --strategy top_p \(with --top_p 1.0 for min-p "
                                         r"sampling alone\), not to --strategy top_k"):
        parsed(*base, "--min_p", "0.2", "--strategy", "top_k")
    with pytest.raises(UsageError, match=r"--min_p 1.2 must be in \[0, 1\]"):
        parsed(*base, "--min_p", "1.2")
    write_generation_config(folder, num_beams=3)
    resolved = parsed(*base, "--min_new_tokens", "2").settings  # beam search holds the end back too
    assert (resolved.strategy, resolved.min_new_tokens, resolved.beam_scoring, resolved.length_penalty,
            resolved.early_stopping) == ("beam", 2, "transformers", 1.0, False)
    resolved = parsed(*base, "--beam_scoring", "gnmt").settings  # lmkit's search: its alpha and its early stopping
    assert (resolved.beam_scoring, resolved.length_penalty, resolved.early_stopping) == ("gnmt", 0.6, "never")
    resolved = parsed(*base, "--beam_scoring", "gnmt", "--early_stopping", "true").settings  # an option of either
    assert (resolved.beam_scoring, resolved.early_stopping) == ("gnmt", True)


def test_lmkit_generate_samples_as_the_folders_generation_config_asks(tmp_path):
    """A folder asking for do_sample with top_k 1: lmkit generate, with no strategy flag, writes transformers'
    greedy continuation (lmkit's own top_p 0.9 at temperature 1 would not) and says so on stderr; the
    Python generate() does the same."""
    from transformers import AutoTokenizer

    import lmkit
    folder = str(tmp_path / "llama")
    make_llama_folder(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt = "the cat sat"
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    expected = decidable_greedy(LlamaForCausalLM.from_pretrained(folder).eval(), input_ids=torch.tensor([ids]),
                                attention_mask=torch.ones(1, len(ids), dtype=torch.long), max_new_tokens=12,
                                eos_token_id=None, pad_token_id=0)[0]
    write_generation_config(folder, do_sample=True, top_k=1, temperature=0.7, eos_token_id=10 ** 6)
    res = _lmkit("generate", "--model_dir", folder, "--prompt", prompt, "--max_new_tokens", "12", "--one_line",
                 "--seed", "5")
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == tokenizer.decode(expected).replace("\n", "\\n"), res.stdout  # one sample: its text
    assert (f"{folder}/generation_config.json: strategy top_p, temperature 0.7, top_k 1, top_p 1.0 "
            "(as transformers' generate; a value given overrides each)") in res.stderr
    [sample] = lmkit.generate(folder, prompt, max_new_tokens=12, seed=5, return_samples=True)
    assert sample.ids == expected
    # With the folder's choice overridden, the note names what is left of it.
    res = _lmkit("generate", "--model_dir", folder, "--prompt", prompt, "--max_new_tokens", "3", "--strategy",
                 "greedy")
    assert res.returncode == 0 and "generation_config.json: strategy" not in res.stderr, res.stderr[-2000:]
    # min_p = 1.0 keeps the top token alone: greedy again, now among transformers' top_k 50 at temperature 1.
    write_generation_config(folder, do_sample=True, eos_token_id=10 ** 6)
    [sample] = lmkit.generate(folder, prompt, max_new_tokens=12, seed=5, min_p=1.0, return_samples=True)
    assert sample.ids == expected


def test_a_run_fine_tuned_from_a_folder_samples_as_the_folder_asks(tmp_path):
    """A run fine-tuned from a Llama folder whose generation_config.json asks for do_sample with top_k 1
    (greedy): lmkit generate on the run, with no strategy flag, writes the run's greedy sample and names the
    folder's file; with the folder gone, lmkit's own default (top_p) is back."""
    import shutil
    folder, run_dir = str(tmp_path / "llama"), str(tmp_path / "run")
    corpus = make_llama_folder(folder)
    write_generation_config(folder, do_sample=True, top_k=1, eos_token_id=0)
    res = _lmkit("train", "--init_from", folder, "--train_file", corpus, "--model_dir", run_dir, "--max_steps", "1",
                 "--set", "num_steps=16", "--set", "batch_size=4")
    assert res.returncode == 0, res.stderr[-3000:]
    flags = ["generate", "--model_dir", run_dir, "--prompt", "the cat sat", "--max_new_tokens", "10", "--one_line",
             "--seed", "3"]
    greedy = _lmkit(*flags, "--strategy", "greedy")
    preset = _lmkit(*flags)
    assert greedy.returncode == 0 and preset.returncode == 0, greedy.stderr[-2000:] + preset.stderr[-2000:]
    assert preset.stdout == greedy.stdout
    assert f"{folder}/generation_config.json: strategy top_p, temperature 1.0, top_k 1, top_p 1.0" in preset.stderr
    plan = parsed("--model_dir", run_dir, "--prompt", "the cat")
    assert (plan.settings.strategy, plan.settings.top_k, plan.preset_source) == ("top_p", 1, folder)
    shutil.rmtree(folder)
    plan = parsed("--model_dir", run_dir, "--prompt", "the cat")
    assert (plan.settings.strategy, plan.settings.top_k, plan.settings.top_p, plan.preset_source) == \
        ("top_p", None, 0.9, None)
