"""Samplers driven through the decode loop with fake, deterministic logits."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf

from lmkit.decoding import (
    BeamSampler,
    GreedySampler,
    RandomSampler,
    Sampler,
    TopKSampler,
    TopPSampler,
    decode,
)

from .fakes import TableModel, check_decidable_nucleus

VOCAB = 8


def constant_model(probs, positions: int = 1) -> TableModel:
    """Every step has the same next-token distribution ``probs``."""
    logits = np.log(np.asarray(probs, np.float32))
    return TableModel(np.broadcast_to(logits, (positions, len(probs), len(probs))).copy())


def successor_model(vocab: int = VOCAB) -> TableModel:
    """The most likely next token is last + 1 (mod vocab), with a margin of 2."""
    table = np.zeros((1, vocab, vocab), np.float32)
    for last in range(vocab):
        table[0, last, (last + 1) % vocab] = 2.0
        table[0, last, (last + 3) % vocab] = 1.0  # a clear second choice for top-k
    return TableModel(table)


def random_table_model(vocab: int = VOCAB, positions: int = 12, seed: int = 0) -> TableModel:
    table = np.random.RandomState(seed).randn(positions, vocab, vocab).astype(np.float32)
    top2 = np.sort(table, axis=-1)[..., -2:]
    assert (top2[..., 1] - top2[..., 0]).min() > 1e-3, "pick another seed: near-tie in the table"
    return TableModel(table)


def numpy_greedy(model: TableModel, prompt, max_length: int):
    ids = list(prompt)
    while len(ids) < max_length:
        ids.append(int(np.argmax(model.numpy_logits(len(ids) - 1, ids[-1]))))
    return ids


def counts(result, start: int) -> collections.Counter:
    return collections.Counter(result.ids[:, start:].ravel().tolist())


@pytest.mark.parametrize("compiled", [True, False])
def test_greedy_exact_tokens(compiled):
    result = decode(successor_model(), 6, GreedySampler(), prompts=[[0], [5]], compiled=compiled)
    np.testing.assert_array_equal(result.ids, [[0, 1, 2, 3, 4, 5], [5, 6, 7, 0, 1, 2]])
    np.testing.assert_array_equal(result.lengths, [6, 6])
    assert result.ids.dtype == np.int32


def test_greedy_matches_numpy_on_position_dependent_logits():
    model = random_table_model()
    prompts = [[3], [1, 4, 2], [7, 7]]
    result = decode(model, 10, GreedySampler(), prompts=prompts)
    expected = [numpy_greedy(model, p, 10) for p in prompts]
    np.testing.assert_array_equal(result.ids, expected)


def test_log_probs_are_the_untempered_model_log_probs():
    model = random_table_model()
    result = decode(model, 7, TopKSampler(k=3, temperature=0.5), prompts=[[2], [5, 1, 0]], seed=3)
    for b, (row, start) in enumerate(zip(result.ids, result.prompt_lengths)):
        expected = 0.0  # only generated tokens count, the prompt does not
        for t in range(start, 7):
            logits = model.numpy_logits(t - 1, row[t - 1]).astype(np.float64)
            expected += logits[row[t]] - np.log(np.exp(logits).sum())
        np.testing.assert_allclose(result.log_probs[b], expected, rtol=1e-5)


def test_top_k_one_equals_greedy():
    model = random_table_model()
    greedy = decode(model, 12, GreedySampler(), batch_size=4, start_id=2)
    for seed in (0, 1):
        top1 = decode(model, 12, TopKSampler(k=1, temperature=2.0), batch_size=4, start_id=2, seed=seed)
        np.testing.assert_array_equal(top1.ids, greedy.ids)


def test_top_k_only_samples_the_k_best():
    # Every step: tokens 0, 1 are the two best; k = 2 must never leave them.
    model = constant_model([0.3, 0.25, 0.15, 0.1, 0.1, 0.1])
    result = decode(model, 20, TopKSampler(k=2), batch_size=32, start_id=0, seed=5)
    seen = counts(result, 1)
    assert set(seen) == {0, 1}
    # Renormalised: 0.3 / 0.55 = 0.545 of 608 draws (std 0.02).
    assert abs(seen[0] / sum(seen.values()) - 0.3 / 0.55) < 0.08


def test_top_k_larger_than_vocab_keeps_everything():
    model = constant_model([0.25, 0.25, 0.25, 0.25])
    full = decode(model, 10, RandomSampler(), batch_size=4, start_id=0, seed=2)
    big_k = decode(model, 10, TopKSampler(k=50), batch_size=4, start_id=0, seed=2)
    assert set(counts(big_k, 1)) == {0, 1, 2, 3}
    np.testing.assert_array_equal(big_k.ids, full.ids)  # top_k of all, sorted, equal logits


def test_top_p_tiny_keeps_only_the_top_token():
    model = random_table_model()
    greedy = decode(model, 12, GreedySampler(), batch_size=3, start_id=1)
    tiny = decode(model, 12, TopPSampler(p=1e-6), batch_size=3, start_id=1, seed=9)
    np.testing.assert_array_equal(tiny.ids, greedy.ids)


def test_top_p_breaks_ties_by_lower_id():
    # Tokens 1 and 3 tie for the top; with a tiny p only one is kept: the lower id.
    model = constant_model([0.1, 0.35, 0.1, 0.35, 0.1])
    result = decode(model, 8, TopPSampler(p=0.01), batch_size=16, start_id=0, seed=4)
    assert set(counts(result, 1)) == {1}


def test_top_p_one_is_the_full_distribution():
    probs = [0.4, 0.3, 0.2, 0.07, 0.03]
    model = constant_model(probs)
    nucleus = decode(model, 25, TopPSampler(p=1.0), batch_size=40, start_id=0, seed=11)
    full = decode(model, 25, RandomSampler(), batch_size=40, start_id=0, seed=11)
    np.testing.assert_array_equal(nucleus.ids, full.ids)
    seen = counts(nucleus, 1)
    assert set(seen) == set(range(5)), seen  # the 3 % tail is reachable: 960 draws
    freq = np.array([seen[i] for i in range(5)]) / sum(seen.values())
    np.testing.assert_allclose(freq, probs, atol=0.05)


def test_top_p_nucleus_of_exactly_two_tokens():
    # Sorted mass: 0.5, 0.8, 0.9, 1.0. For p = 0.75 the smallest set reaching p is {2, 0}.
    probs = [0.3, 0.1, 0.5, 0.1]
    model = constant_model(probs)
    seen = collections.Counter()
    for seed in range(4):
        seen += counts(decode(model, 12, TopPSampler(p=0.75), batch_size=24, start_id=1, seed=seed), 1)
    assert set(seen) == {0, 2}, seen
    share = seen[2] / sum(seen.values())  # renormalised: 0.5 / 0.8
    assert abs(share - 0.625) < 0.08


def test_top_p_boundary_includes_the_token_that_reaches_p():
    # Mass before token 0 (second best) is 0.5 < 0.5 + eps, so p just above 0.5 keeps two.
    model = constant_model([0.3, 0.2, 0.5])
    result = decode(model, 12, TopPSampler(p=0.55), batch_size=24, start_id=0, seed=1)
    assert set(counts(result, 1)) == {0, 2}
    result = decode(model, 12, TopPSampler(p=0.45), batch_size=24, start_id=0, seed=1)
    assert set(counts(result, 1)) == {2}


@pytest.mark.parametrize("sampler", [RandomSampler(temperature=1e-4),
                                     TopKSampler(k=4, temperature=1e-4),
                                     TopPSampler(p=0.95, temperature=1e-4)],
                         ids=["sample", "top_k", "top_p"])
def test_temperature_near_zero_is_greedy(sampler):
    model = random_table_model()
    greedy = decode(model, 12, GreedySampler(), prompts=[[0], [3, 3], [6]])
    cold = decode(model, 12, sampler, prompts=[[0], [3, 3], [6]], seed=123)
    np.testing.assert_array_equal(cold.ids, greedy.ids)


def test_high_temperature_flattens():
    model = constant_model([0.9, 0.05, 0.05])
    cold = counts(decode(model, 20, RandomSampler(temperature=1.0), batch_size=20, start_id=0, seed=0), 1)
    hot = counts(decode(model, 20, RandomSampler(temperature=50.0), batch_size=20, start_id=0, seed=0), 1)
    assert cold[0] > 0.8 * sum(cold.values())
    assert hot[0] < 0.45 * sum(hot.values())


class PositionSampler(Sampler):
    """A custom strategy: the token is the position being chosen (mod vocab)."""

    def get_next_token(self, logits, step, seed):
        del seed
        return tf.fill(tf.shape(logits)[:1], step % tf.shape(logits)[1])


@pytest.mark.parametrize("compiled", [True, False])
def test_a_custom_sampler_plugs_into_the_loop(compiled):
    result = decode(successor_model(), 11, PositionSampler(), prompts=[[6], [6, 6, 6]], compiled=compiled)
    np.testing.assert_array_equal(result.ids, [[6, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2],
                                               [6, 6, 6, 3, 4, 5, 6, 7, 0, 1, 2]])


class BranchingSampler(Sampler):
    """A user's strategy with a Python ``if`` on a tensor: it traces only through AutoGraph."""

    def get_next_token(self, logits, step, seed):
        del seed
        if step % 2 == 0:  # a tensor: AutoGraph turns this into tf.cond
            return tf.fill(tf.shape(logits)[:1], 2)
        return tf.fill(tf.shape(logits)[:1], 5)


@pytest.mark.parametrize("jit_compile", [True, False])
def test_a_users_sampler_keeps_autograph_and_lmkit_s_own_trace_without_it(jit_compile):
    # lmkit's models and samplers trace without AutoGraph (start-up time); a user's sampler on lmkit's
    # model keeps it, or its `if` on a tensor could not trace.
    from lmkit.core.xla import use_autograph
    from lmkit.models import build_model
    model = build_model({"model": "transformer", "vocab_size": 11, "hidden_size": 8, "num_layers": 1,
                         "num_heads": 2, "max_positions": 16})
    result = decode(model, 6, BranchingSampler(), prompts=[[6]], jit_compile=jit_compile)
    np.testing.assert_array_equal(result.ids, [[6, 5, 2, 5, 2, 5]])
    assert use_autograph(model, BranchingSampler()) and not use_autograph(model, GreedySampler())


@pytest.mark.parametrize("build, message", [
    (lambda: TopKSampler(k=0), "top_k = 0 must be an integer >= 1"),
    (lambda: TopPSampler(p=0.0), r"top_p = 0.0 must be in \(0, 1\]"),
    (lambda: TopPSampler(p=1.5), r"top_p = 1.5 must be in \(0, 1\]"),
    (lambda: RandomSampler(temperature=0.0), "temperature = 0.0 must be > 0"),
    (lambda: BeamSampler(beam_width=0), "beam_width = 0 must be an integer >= 1"),
    (lambda: BeamSampler(scoring="bleu"), "beam_scoring = 'bleu' must be one of gnmt, transformers"),
    (lambda: BeamSampler(early_stopping="always"), "early_stopping = 'always' must be true, false or"),
])
def test_sampler_arguments_are_checked(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def nucleus_reference(logits, p, temperature, k):
    """NumPy: the kept ids of one row (temperature, then the top k, then the smallest prefix reaching p) and
    their renormalized probabilities, as transformers' warpers keep them."""
    scaled = np.asarray(logits, np.float64) / temperature
    order = np.argsort(-scaled, kind="stable")[:k]
    probs = np.exp(scaled[order] - scaled[order].max())
    probs /= probs.sum()
    before = np.concatenate([[0.0], np.cumsum(probs)[:-1]])
    kept = order[before < p] if p < 1 else order
    kept_probs = np.exp(scaled[kept] - scaled[kept].max())
    return dict(zip(kept.tolist(), (kept_probs / kept_probs.sum()).tolist()))


@pytest.mark.parametrize("p, temperature, k", [(0.9, 1.0, None), (0.9, 0.6, 50), (0.8, 1.3, 5), (1.0, 0.7, 7),
                                               (0.5, 1.0, 1), (0.95, 1.0, 400), (1.0, 1.0, None)])
def test_top_p_candidates_are_the_top_k_nucleus(p, temperature, k):
    """TopPSampler(p, temperature, k) draws among the tokens NumPy keeps (top k, then the nucleus of their
    renormalized probabilities), with those probabilities; k at or above the vocabulary is no limit."""
    rng = np.random.default_rng(7)
    logits = rng.normal(0, 2.5, (4, 300)).astype(np.float32)
    check_decidable_nucleus(logits, p, temperature, k)
    ids, candidate_logits = TopPSampler(p=p, temperature=temperature, k=k).candidates(tf.constant(logits))
    probs = tf.nn.softmax(candidate_logits, axis=-1).numpy()
    for row in range(len(logits)):
        got = {int(i): float(q) for i, q in zip(ids[row].numpy(), probs[row]) if q > 0}
        expected = nucleus_reference(logits[row], p, temperature, k if k is not None else 300)
        assert sorted(got) == sorted(expected)
        np.testing.assert_allclose([got[i] for i in sorted(got)], [expected[i] for i in sorted(expected)],
                                   rtol=1e-5)
    if k is not None and k < 300:
        assert ids.shape[-1] == k  # the nucleus is taken among k tokens, not the whole vocabulary


def test_top_p_with_k_draws_within_the_top_k():
    """Through the decode loop: with k = 2 and p = 1 only the two most likely tokens come, both of them."""
    model = constant_model([0.05, 0.4, 0.05, 0.3, 0.05, 0.05, 0.05, 0.05])
    drawn = counts(decode(model, 20, TopPSampler(p=1.0, k=2), batch_size=30, start_id=0, seed=3), 1)
    assert set(drawn) == {1, 3}
    with pytest.raises(ValueError, match="top_k = 0 must be an integer >= 1"):
        TopPSampler(k=0)
