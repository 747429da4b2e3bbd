"""transformers' beam search and rules on tokens (lmkit.decoding.beam's scoring="transformers", constraints) against
transformers' generate on a tiny random BART, and a BART folder's generation_config.json read as transformers
reads it (lmkit generate --source_file)."""
import argparse
import json
import os

import numpy as np
import pytest
import tensorflow as tf  # noqa: E402
import torch  # noqa: E402  (a test dependency of the main environment: make setup)
from transformers import GenerationConfig  # noqa: E402
from transformers.generation.logits_process import (  # noqa: E402
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    MinLengthLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
)

from lmkit import distributed as dist
from lmkit.core.errors import UsageError  # noqa: E402
from lmkit.decoding import decode  # noqa: E402
from lmkit.decoding.beam import BeamSampler  # noqa: E402
from lmkit.decoding.constraints import Constraints  # noqa: E402
from lmkit.hub.generation_config import generation_preset  # noqa: E402
from tests.models.bart.test_convert import SOURCE_MASK, SOURCES, _lmkit, load, make_bart_folder, save_random  # noqa: E402

pytestmark = pytest.mark.transformers


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_rules_on_tokens_forbid_what_transformers_processors_forbid(n):
    rng = np.random.default_rng(n)
    batch, width, max_length, vocab = 3, 2, 14, 6  # a small vocabulary: n-grams repeat
    ids = rng.integers(0, vocab, (batch, width, max_length)).astype(np.int32)
    prompt_lengths = np.array([1, 1, 3], np.int32)
    log_probs = np.log(rng.dirichlet(np.ones(vocab), (batch, width))).astype(np.float32)
    for length in range(1, max_length):
        for rules, min_new in [(Constraints(no_repeat_ngram_size=n), None),
                               (Constraints(forced_first_id=0, forced_last_id=2), None),
                               (Constraints(no_repeat_ngram_size=n, forced_last_id=2), np.array([4, 0, 2], np.int32))]:
            got = rules.apply(tf.constant(log_probs), tf.constant(ids), tf.constant(length),
                              tf.constant(prompt_lengths), max_length, (2, 5),
                              None if min_new is None else tf.constant(min_new)).numpy()
            for b in range(batch):  # transformers' processors see one prompt length at a time
                processors = []
                if rules.no_repeat_ngram_size:
                    processors.append(NoRepeatNGramLogitsProcessor(n))
                if min_new is not None:
                    processors.append(MinLengthLogitsProcessor(int(prompt_lengths[b] + min_new[b]), [2, 5]))
                if rules.forced_first_id is not None and prompt_lengths[b] == 1:  # transformers: at length 1
                    processors.append(ForcedBOSTokenLogitsProcessor(rules.forced_first_id))
                if rules.forced_last_id is not None:
                    processors.append(ForcedEOSTokenLogitsProcessor(max_length, rules.forced_last_id))
                scores = torch.tensor(log_probs[b])
                for processor in processors:
                    scores = processor(torch.tensor(ids[b, :, :length], dtype=torch.long), scores)
                if rules.forced_first_id is not None and prompt_lengths[b] != 1 and length == prompt_lengths[b]:
                    continue  # lmkit forces the first new token after any prompt length: checked below
                np.testing.assert_array_equal(np.isinf(got[b]), np.isinf(scores.numpy()), err_msg=f"{b} {length}")
                np.testing.assert_array_equal(np.where(np.isinf(got[b]), 0, got[b]),
                                              np.where(np.isinf(scores.numpy()), 0, scores.numpy()))
    forced = Constraints(forced_first_id=4).apply(tf.constant(log_probs), tf.constant(ids), tf.constant(3),
                                                  tf.constant(prompt_lengths), max_length, (2,)).numpy()
    assert np.isfinite(forced[2]).sum() == width and (forced[2, :, 4] == 0).all()  # row 2: its first new token
    np.testing.assert_array_equal(forced[:2], log_probs[:2])
    with pytest.raises(UsageError, match="no_repeat_ngram_size = -1 must be an integer >= 0"):
        Constraints(no_repeat_ngram_size=-1)


class Perturbed:
    """The model with its logits moved by up to ``delta`` (a fixed function of the logits themselves)."""

    def __init__(self, model, delta, k):
        self.model, self.delta, self.k = model, delta, k

    def __getattr__(self, name):
        return getattr(self.model, name)

    def step(self, inputs, state):
        logits, state = self.model.step(inputs, state)
        return logits + self.delta * tf.sin(self.k * logits), state


RULES = ("no_repeat_ngram_size", "forced_first_id", "forced_last_id")


def lmkit_beam(model, memory, max_length, min_length, **settings):
    rules = Constraints(**{key: settings.pop(key) for key in RULES if key in settings})
    sampler = BeamSampler(settings.pop("num_beams"), settings.pop("length_penalty"), **settings)
    rows = int(tf.shape(tf.nest.flatten(memory)[-1])[0])
    result = decode(model, max_length, sampler, prompts=[[2]] * rows, eos_id=2, pad_id=1,
                    condition=memory, min_new_tokens=max(min_length - 1, 0), rules=rules)
    return [result.ids[row, :result.lengths[row]].tolist() for row in range(rows)]


def check_decidable(model, memory, max_length, min_length, settings, expected):
    """The search's outputs do not move when every logit moves by up to 1e-3 (two ways), 10x the float32
    difference between the frameworks' logits (test_bart: 1e-4): rounding on another CPU cannot flip them."""
    for delta, k in [(1e-3, 37.0), (-1e-3, 11.0)]:
        assert lmkit_beam(Perturbed(model, delta, k), memory, max_length, min_length, **dict(settings)) == expected


SETTINGS = [  # (transformers' generate keywords, max_length, min_length); early_stopping of each kind
    (dict(num_beams=3, length_penalty=1.0, early_stopping=False), 12, 0),
    (dict(num_beams=4, length_penalty=2.0, early_stopping=True, no_repeat_ngram_size=3, forced_first_id=0,
          forced_last_id=2), 14, 6),
    (dict(num_beams=4, length_penalty=0.5, early_stopping="never", no_repeat_ngram_size=2, forced_last_id=2), 10, 0),
    (dict(num_beams=2, length_penalty=-0.5, early_stopping=False, forced_first_id=0), 16, 4),
    (dict(num_beams=5, length_penalty=1.0, early_stopping=True, no_repeat_ngram_size=1), 9, 0),
    (dict(num_beams=3, length_penalty=2.0, early_stopping="never", forced_first_id=0, forced_last_id=2), 15, 8),
]


def save_ending(folder):
    """test_bart's random BART with </s> made likelier (its softmax bias + 4), so that hypotheses end at many
    lengths and the length normalization and early stopping decide (unchanged, every one runs to the end)."""
    torch_model = save_random(folder)
    with torch.no_grad():
        torch_model.final_logits_bias[0, 2] += 4.0
    torch_model.save_pretrained(folder)
    return torch_model


@pytest.fixture(scope="module")
def bart(tmp_path_factory):
    dist.init(backend="local")
    folder = str(tmp_path_factory.mktemp("bart"))
    torch_model = save_ending(folder)
    model = load(folder)
    return torch_model, model, model.encode(tf.constant(SOURCES), tf.constant(np.array(SOURCE_MASK, bool)))


def transformers_beam(torch_model, max_length, min_length, settings):
    keywords = {k: v for k, v in settings.items() if k not in ("forced_first_id", "forced_last_id")}
    with torch.no_grad():
        out = torch_model.generate(
            input_ids=torch.tensor(SOURCES), attention_mask=torch.tensor(SOURCE_MASK), do_sample=False,
            max_length=max_length, min_length=min_length, decoder_start_token_id=2,
            forced_bos_token_id=settings.get("forced_first_id"), forced_eos_token_id=settings.get("forced_last_id"),
            **keywords).tolist()
    rows = []
    for row in out:  # up to its </s> (or the whole length), the padding after it dropped
        rows.append(row[:row.index(2, 1) + 1] if 2 in row[1:] else row)
    return rows


@pytest.mark.parametrize("case", range(len(SETTINGS)))
def test_beam_search_equals_transformers_generate(bart, case):
    torch_model, model, memory = bart
    settings, max_length, min_length = SETTINGS[case]
    expected = transformers_beam(torch_model, max_length, min_length, settings)
    got = lmkit_beam(model, memory, max_length, min_length, scoring="transformers", **dict(settings))
    assert got == expected
    check_decidable(model, memory, max_length, min_length, {**settings, "scoring": "transformers"}, expected)
    if min_length:
        assert all(len(row) - 1 >= min_length - 1 for row in got)
    if case == 1:  # XLA compiles the same search
        sampler = BeamSampler(4, 2.0, scoring="transformers", early_stopping=True)
        result = decode(model, max_length, sampler, prompts=[[2], [2]], eos_id=2, pad_id=1, condition=memory,
                        min_new_tokens=min_length - 1, jit_compile=False,
                        rules=Constraints(no_repeat_ngram_size=3, forced_first_id=0, forced_last_id=2))
        assert [result.ids[r, :result.lengths[r]].tolist() for r in range(2)] == got


@pytest.mark.parametrize("n", [1, 2, 3])
def test_greedy_decoding_takes_the_rules_as_transformers_does(bart, n):
    """The rules apply to every strategy, as transformers' logits processors do: greedy outputs equal
    transformers' with the same rules (decidable on any CPU), and differ from greedy without them."""
    from lmkit.decoding.samplers import GreedySampler
    from tests.helpers import decidable_greedy
    torch_model, model, memory = bart
    expected = decidable_greedy(torch_model, stop_id=2, input_ids=torch.tensor(SOURCES),
                                attention_mask=torch.tensor(SOURCE_MASK), max_length=12, min_length=5,
                                no_repeat_ngram_size=n, forced_bos_token_id=0, forced_eos_token_id=2,
                                decoder_start_token_id=2)
    rules = Constraints(no_repeat_ngram_size=n, forced_first_id=0, forced_last_id=2)
    for jit in (True, False):
        result = decode(model, 12, GreedySampler(), prompts=[[2], [2]], eos_id=2, pad_id=1, condition=memory,
                        min_new_tokens=4, rules=rules, jit_compile=jit)
        assert [result.ids[r, :result.lengths[r]].tolist() for r in range(2)] == expected
    plain = decode(model, 12, GreedySampler(), prompts=[[2], [2]], eos_id=2, pad_id=1, condition=memory)
    assert [plain.ids[r, :plain.lengths[r]].tolist() for r in range(2)] != expected


def test_lmkit_own_search_chooses_otherwise_on_these_settings(bart):
    """The settings above tell the two searches apart: lmkit's own (GNMT's alpha 0.6, lmkit's default, and the same
    rules on tokens) gives other outputs on most of them."""
    torch_model, model, memory = bart
    differ = ended = 0
    for settings, max_length, min_length in SETTINGS:
        own = {k: v for k, v in settings.items() if k not in ("early_stopping", "length_penalty")}
        theirs = transformers_beam(torch_model, max_length, min_length, settings)
        differ += lmkit_beam(model, memory, max_length, min_length, length_penalty=0.6, **own) != theirs
        ended += any(len(row) < max_length for row in theirs)  # an end before the last position
    assert differ >= 4 and ended >= 4


def test_a_bart_folders_generation_config_gives_transformers_search(tmp_path):
    folder = str(tmp_path / "bart")
    save_random(folder)
    # bart-large-cnn's
    values = dict(num_beams=4, length_penalty=2.0, early_stopping=True, no_repeat_ngram_size=3, min_length=56,
                  max_length=142, forced_bos_token_id=0, forced_eos_token_id=2, decoder_start_token_id=2,
                  bos_token_id=0, eos_token_id=2, pad_token_id=1)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump(values, f)
    config = GenerationConfig.from_pretrained(folder)
    assert config.get_generation_mode() == "beam_search"
    assert generation_preset(folder) == dict(
        strategy="beam", beam_width=config.num_beams, beam_scoring="transformers",
        length_penalty=config.length_penalty, early_stopping=config.early_stopping,
        no_repeat_ngram_size=config.no_repeat_ngram_size, forced_first_id=config.forced_bos_token_id,
        forced_last_id=config.forced_eos_token_id, min_new_tokens=config.min_length - 1,
        max_new_tokens=config.max_length - 1)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:  # greedy, with its rules and lengths
        json.dump({**values, "num_beams": 1, "max_new_tokens": 60}, f)
    assert generation_preset(folder) == dict(no_repeat_ngram_size=3, forced_first_id=0, forced_last_id=2,
                                             min_new_tokens=55, max_new_tokens=60)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump(dict(num_beams=2, decoder_start_token_id=2), f)
    assert generation_preset(folder) == dict(strategy="beam", beam_width=2, beam_scoring="transformers",
                                             length_penalty=1.0, early_stopping=False)  # transformers' defaults
    for bad, message in [(dict(num_beams=2, early_stopping="yes"), "early_stopping = 'yes' must be true, false"),
                         (dict(num_beams=2, no_repeat_ngram_size=-2), "no_repeat_ngram_size = -2 must be an integer"),
                         (dict(num_beams=2, forced_bos_token_id="<s>"), "forced_bos_token_id = '<s>' must be a token"),
                         (dict(max_length=1), "max_length = 1 must be an integer >= 2")]:
        with open(os.path.join(folder, "generation_config.json"), "w") as f:
            json.dump(bad, f)
        with pytest.raises(UsageError, match=message):
            generation_preset(folder)


def test_lmkit_generate_on_a_bart_folder_searches_as_its_generation_config_asks(tmp_path):
    folder = str(tmp_path / "bart")
    tokenizer, torch_model = make_bart_folder(folder)
    values = dict(num_beams=3, length_penalty=2.0, early_stopping=True, no_repeat_ngram_size=2, min_length=5,
                  max_length=12, forced_bos_token_id=0, forced_eos_token_id=2, decoder_start_token_id=2,
                  bos_token_id=0, eos_token_id=2, pad_token_id=1)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump(values, f)
    sources = ["the cat sat on a mat", "blue sky !", "über 42 the dog ran"]
    encoded = [tokenizer(text)["input_ids"] for text in sources]  # <s> tokens </s>, as BART's
    expected = []
    model = load(folder)
    settings = dict(num_beams=3, length_penalty=2.0, early_stopping=True, no_repeat_ngram_size=2, forced_first_id=0,
                    forced_last_id=2)
    for ids in encoded:
        with torch.no_grad():
            out = torch_model.generate(input_ids=torch.tensor([ids]), generation_config=GenerationConfig(**values))
        expected.append(tokenizer.decode(out[0].tolist(), skip_special_tokens=True))
        memory = model.encode(tf.constant([ids]), tf.constant([[True] * len(ids)]))
        row = out[0].tolist()
        check_decidable(model, memory, 12, 5, {**settings, "scoring": "transformers"},
                        [row[:row.index(2, 1) + 1] if 2 in row[1:] else row])
    source_file = tmp_path / "sources.txt"
    source_file.write_text("\n".join(sources) + "\n", encoding="utf-8")
    res = _lmkit("generate", "--model_dir", folder, "--source_file", str(source_file))
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.splitlines() == expected and all(expected), expected
    assert "generation_config.json: strategy beam, beam_width 3, beam_scoring transformers, length_penalty 2.0, " \
           "early_stopping True, no_repeat_ngram_size 2, forced_first_id 0, forced_last_id 2, min_new_tokens 4, " \
           "max_new_tokens 11" in res.stderr, res.stderr
    # lmkit evaluate decodes the same way for its BLEU (written with --output), and says how in its report.
    target_file, written = tmp_path / "targets.txt", tmp_path / "outputs.txt"
    target_file.write_text("\n".join(expected) + "\n", encoding="utf-8")
    res = _lmkit("evaluate", "--model_dir", folder, "--source_file", str(source_file), "--target_file",
                 str(target_file), "--output", str(written), "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout)
    assert written.read_text(encoding="utf-8").splitlines() == expected and report["exact_match"] == 1.0
    assert (report["strategy"], report["beam_scoring"], report["decoding"]["no_repeat_ngram_size"],
            report["decoding"]["min_new_tokens"], report["decoding"]["max_new_tokens"]) == \
        ("beam", "transformers", 2, 4, 11)
    # A flag overrides its own value (the flags planned as lmkit generate plans them, in this process).
    from lmkit.cli.flags import early_stopping
    from lmkit.cli.generate import build_parser, plan_of_flags
    from lmkit.decoding.checks import flag_spelling

    def resolved(*flags):
        plan = plan_of_flags(build_parser().parse_args(["--model_dir", folder, "--source_file", str(source_file),
                                                        *flags]))
        return plan, plan.settings.sampler(), plan.settings.rules()

    plan, sampler, rules = resolved("--beam_scoring", "gnmt", "--no_repeat_ngram_size", "0")
    assert (sampler.scoring, sampler.length_penalty, sampler.early_stopping, rules.no_repeat_ngram_size,
            rules.forced_first_id, plan.settings.min_new_tokens) == ("gnmt", 0.6, "never", 0, 0, 4)
    assert "length_penalty" not in plan.used and "no_repeat_ngram_size" not in plan.used
    plan, sampler, _ = resolved("--strategy", "greedy", "--max_new_tokens", "3")
    assert (plan.settings.strategy, plan.settings.max_new_tokens, type(sampler).__name__) == ("greedy", 3,
                                                                                              "GreedySampler")
    fitted, _ = plan.settings.fit_decoder(24, plan.used)  # the file's min_length (4 new tokens) past 3: ends last
    assert (fitted.max_new_tokens, fitted.min_new_tokens) == (3, 2)
    plan, _, _ = resolved("--min_new_tokens", "1")
    fitted, _ = plan.settings.fit_decoder(9, plan.used)  # the file's max_length (11 new tokens) past the decoder's 8
    assert (fitted.max_new_tokens, fitted.min_new_tokens) == (8, 1)  # a flag stays as given
    with pytest.raises(UsageError, match="--max_new_tokens 30 exceeds what the decoder holds: 23"), flag_spelling():
        resolved("--max_new_tokens", "30")[0].settings.fit_decoder(24, {})
    assert [early_stopping(text) for text in ("true", "False", "never")] == [True, False, "never"]
    with pytest.raises(argparse.ArgumentTypeError, match="'maybe' is not one of true, false, never"):
        early_stopping("maybe")  # (lmkit's parser exits with status 2 on it: not in this process)
    plan, sampler, _ = resolved("--beam_scoring", "gnmt", "--early_stopping", "true")  # an option of either search
    assert (sampler.scoring, sampler.early_stopping) == ("gnmt", True)


@pytest.mark.parametrize("settings, message", [
    (dict(scoring="bleu"), "scoring = 'bleu' must be one of gnmt, transformers"),
    (dict(scoring="transformers", early_stopping=1), "early_stopping = 1 must be true, false or \"never\""),
    (dict(scoring="transformers", early_stopping="always"), "early_stopping = 'always' must be"),
])
def test_bad_beam_settings_are_named(settings, message):
    with pytest.raises(UsageError, match=message):
        BeamSampler(3, 1.0, **settings)
    with pytest.raises(UsageError, match="forced_first_id = -1 must be a token id"):
        Constraints(forced_first_id=-1)
    with pytest.raises(UsageError, match="rules = 3 is not an lmkit.decoding.constraints.Constraints"):
        decode(_Tiny(), 4, batch_size=1, rules=3)


class _Tiny:
    """Enough of a model for decode's checks."""
    vocab_size, max_positions = 5, 8
