"""Decoding with the built-in models of lmkit.models (built with build_model)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf

from lmkit.decoding import BeamSampler, GreedySampler, TopPSampler, decode
from lmkit.decoding.beam import gnmt_length_penalty
from lmkit.models import build_model

VOCAB = 11
EOS = 0


def tiny_model(kind: str, vocab_size: int = VOCAB):
    config = {"model": kind, "vocab_size": vocab_size, "hidden_size": 8, "num_layers": 2,
              # A wide init spreads the logits, so float rounding cannot flip an argmax.
              "init_scale": 0.8, "dropout": 0.0}
    if kind == "transformer":
        config.update(num_heads=2, max_positions=12)
    return build_model(config)


KINDS = ["lstm", "gru", "transformer"]
PROMPTS = [[3], [4, 5, 6], [7, 8]]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sampler", [GreedySampler(), TopPSampler(p=0.8, temperature=1.3)],
                         ids=["greedy", "top_p"])
def test_cached_equals_uncached(kind, sampler):
    model = tiny_model(kind)
    cached = decode(model, 10, sampler, prompts=PROMPTS, eos_id=EOS, seed=5)
    full = decode(model, 10, sampler, prompts=PROMPTS, eos_id=EOS, seed=5, use_cache=False)
    np.testing.assert_array_equal(cached.ids, full.ids)
    np.testing.assert_allclose(cached.log_probs, full.log_probs, rtol=1e-4, atol=1e-5)
    for b, prompt in enumerate(PROMPTS):
        assert cached.ids[b, :len(prompt)].tolist() == prompt


@pytest.mark.parametrize("kind", KINDS + ["llama"])
def test_a_prefilled_prompt_decodes_as_one_fed_a_token_a_step(kind, monkeypatch):
    # Prompts of 10 to 17 tokens: the cached loop feeds their first 8 (an RNN) or 16 (a cache of positions,
    # then rewound to the shortest prompt's 9 tokens before its last, the padding past them written again)
    # in one teacher-forced call (the repetition penalty sees the tokens before the rewind), then one token
    # a step; the same tokens and log-probabilities as the loop that feeds every prompt token through
    # model.step.
    from lmkit.decoding import sampler as sampler_module
    config = {"model": kind, "vocab_size": 23, "hidden_size": 8, "num_layers": 2, "init_scale": 0.8,
              "dropout": 0.0}
    if kind in ("transformer", "llama"):
        config.update(num_heads=2, max_positions=32)
    model = build_model(config)
    rng = np.random.RandomState(3)
    prompts = [rng.randint(1, 23, size=n).tolist() for n in (10, 17, 12)]
    lengths = np.array([len(p) for p in prompts])
    window = 16 if kind in ("transformer", "llama") else 8
    assert sampler_module.prefill_length(model, lengths, True, None) == window
    options = dict(prompts=prompts, eos_id=EOS, seed=5, repetition_penalty=1.3)
    runs = {}
    for multiple in (8, 10 ** 6):  # 10 ** 6: no prefill (a window of 0 below the prompts, past max_length)
        monkeypatch.setattr(sampler_module, "PREFILL_MULTIPLE", multiple)
        runs[multiple] = [decode(model, 24, sampler, **options)
                          for sampler in (GreedySampler(), TopPSampler(p=0.9, temperature=1.2))]
    assert sampler_module.prefill_length(model, lengths, True, None, max_length=24) == 0
    for prefilled, stepped in zip(runs[8], runs[10 ** 6]):
        np.testing.assert_array_equal(prefilled.ids, stepped.ids)
        np.testing.assert_allclose(prefilled.log_probs, stepped.log_probs, rtol=1e-4, atol=1e-5)
        assert (prefilled.lengths > lengths).all()


def test_no_prefill_without_a_cache_for_a_condition_or_a_model_from_outside_lmkit():
    from lmkit.decoding.sampler import prefill_length
    model, lengths = tiny_model("transformer"), np.array([9, 12])
    assert prefill_length(model, lengths, True, None) == 8
    assert prefill_length(model, np.array([8, 12]), True, None) == 0  # 7 tokens before the last: < 8
    # 9 tokens before the last: a window of 16, rewound to 9; but not past max_length, nor for an RNN
    assert prefill_length(model, np.array([10, 12]), True, None) == 16
    assert prefill_length(model, np.array([10, 12]), True, None, max_length=15) == 8
    assert prefill_length(tiny_model("lstm"), np.array([10, 12]), True, None) == 8
    assert prefill_length(model, lengths, False, None) == 0
    assert prefill_length(model, lengths, True, condition=tf.zeros([2, 3, 8])) == 0

    class Outside:
        pass
    assert prefill_length(Outside(), lengths, True, None) == 0


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_follows_the_teacher_forced_argmax(kind):
    model = tiny_model(kind)
    result = decode(model, 9, GreedySampler(), prompts=PROMPTS)  # no eos: full rows
    for b, prompt in enumerate(PROMPTS):
        logits, _ = model(tf.constant(result.ids[b:b + 1, :-1]))  # [1, 8, vocab]
        expected = np.argmax(logits[0].numpy(), axis=-1)[len(prompt) - 1:]
        np.testing.assert_array_equal(result.ids[b, len(prompt):], expected)


def enumerate_best(model, prompt, max_length, alpha):
    """Brute force over every continuation, scored with teacher-forced passes."""
    best = (-np.inf, None)
    for n in range(1, max_length - len(prompt) + 1):
        # <eos> only at the end; shorter than max_length only when ended by <eos>.
        tails = [t for t in itertools.product(range(model.vocab_size), repeat=n)
                 if EOS not in t[:-1] and (n == max_length - len(prompt) or t[-1] == EOS)]
        ids = np.array([list(prompt) + list(t) for t in tails], np.int32)  # [num, len]
        logits, _ = model(tf.constant(ids[:, :-1]))  # one batched pass per length
        log_probs = tf.nn.log_softmax(logits).numpy()  # [num, len - 1, vocab]
        steps = np.arange(len(prompt), ids.shape[1])
        totals = log_probs[:, steps - 1][np.arange(len(ids))[:, None], np.arange(n)[None], ids[:, steps]]
        scores = totals.sum(axis=1) / gnmt_length_penalty(n, alpha)
        if scores.max() > best[0]:
            best = (scores.max(), ids[scores.argmax()].tolist())
    return best


@pytest.mark.parametrize("kind", KINDS)
def test_wide_beam_equals_brute_force(kind):
    model = tiny_model(kind, vocab_size=4)
    prompts = [[1], [2, 3]]
    result = decode(model, 4, BeamSampler(27, 0.6), prompts=prompts, eos_id=EOS)
    for b, prompt in enumerate(prompts):
        score, ids = enumerate_best(model, prompt, 4, 0.6)
        assert result.sequences()[b] == ids
        np.testing.assert_allclose(result.scores[b], score, rtol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_every_beam_scores_its_own_sequence(kind):
    # Beams are reordered every step; a wrong reorder_state shows up here.
    model = tiny_model(kind)
    result = decode(model, 9, BeamSampler(3, 1.0), prompts=PROMPTS, eos_id=EOS)
    for b, prompt in enumerate(PROMPTS):
        for k in range(3):
            ids, length = result.beam_ids[b, k], int(result.beam_lengths[b, k])
            logits, _ = model(tf.constant(ids[np.newaxis, :length - 1]))
            log_probs = tf.nn.log_softmax(logits[0]).numpy()
            total = sum(log_probs[t - 1, ids[t]] for t in range(len(prompt), length))
            np.testing.assert_allclose(result.beam_log_probs[b, k], total, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(result.beam_scores[b, k],
                                       total / gnmt_length_penalty(length - len(prompt), 1.0),
                                       rtol=1e-4, atol=1e-5)


def test_transformer_max_length_above_max_positions_is_an_error():
    model = tiny_model("transformer")
    with pytest.raises(ValueError, match="max_positions"):
        decode(model, 13, GreedySampler(), prompts=[[1]])
