"""lmkit.decoding.beam: the one beam search, against brute-force enumeration of every sequence in NumPy."""

from __future__ import annotations

from typing import List, Tuple, Union

import numpy as np
import pytest
import tensorflow as tf

from lmkit.decoding import BeamSampler, GreedySampler, decode
from lmkit.decoding.beam import gnmt_length_penalty

from .fakes import PrefixModel, TinyAttention, TinyRNN


def beam_search(model, max_length, beam_width=4, *, length_penalty=0.0, **options):
    """lmkit's own search (GNMT scoring): ``decode`` with a :class:`BeamSampler`."""
    return decode(model, max_length, BeamSampler(beam_width, length_penalty), **options)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    return logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())


def enumerate_hypotheses(model: PrefixModel, prompt: List[int], max_length: int,
                         eos_id: Union[None, int, Tuple[int, ...]],
                         alpha: float) -> List[Tuple[float, List[int], float]]:
    """Every complete continuation of ``prompt`` as (score, ids, log_prob), best first (``eos_id``: one
    end token, several, or None)."""
    out = []
    ends = () if eos_id is None else tuple(eos_id) if isinstance(eos_id, tuple) else (eos_id,)

    def extend(prefix: List[int], log_prob: float) -> None:
        generated = len(prefix) - len(prompt)
        if (generated > 0 and prefix[-1] in ends) or len(prefix) == max_length:
            out.append((log_prob / gnmt_length_penalty(generated, alpha), prefix, log_prob))
            return
        step = log_softmax(model.numpy_logits(prefix))
        for token in range(model.vocab_size):
            extend(prefix + [token], log_prob + step[token])

    extend(list(prompt), 0.0)
    return sorted(out, key=lambda h: -h[0])


PROMPTS = [[1], [2, 3]]


@pytest.mark.parametrize("alpha", [0.0, 0.8, 2.0])
@pytest.mark.parametrize("eos_id", [0, None, (0, 3)])
def test_wide_beam_finds_the_brute_force_optimum(alpha, eos_id):
    max_length = 5
    model = PrefixModel(vocab_size=4, max_length=max_length, seed=18)
    # Wide enough that nothing is pruned: 4 ** 3 alive prefixes at most.
    width = 64
    result = beam_search(model, max_length, width, length_penalty=alpha, prompts=PROMPTS, eos_id=eos_id)
    for b, prompt in enumerate(PROMPTS):
        hypotheses = enumerate_hypotheses(model, prompt, max_length, eos_id, alpha)
        best_score, best_ids, best_log_prob = hypotheses[0]
        assert hypotheses[1][0] < best_score - 1e-4, "near-tie: pick another seed"
        assert result.sequences()[b] == best_ids
        np.testing.assert_allclose(result.scores[b], best_score, rtol=1e-5)
        np.testing.assert_allclose(result.log_probs[b], best_log_prob, rtol=1e-5)
        # The whole finished set is the top of the enumeration, in order.
        top = min(width, len(hypotheses))
        np.testing.assert_allclose(result.beam_scores[b, :top], [h[0] for h in hypotheses[:top]],
                                   rtol=1e-5)
        assert np.all(result.beam_scores[b, top:] == -np.inf)


def test_length_penalty_changes_the_winner():
    # The setting above is only a real check of the penalty if it matters.
    model = PrefixModel(vocab_size=4, max_length=5, seed=18)
    plain = [enumerate_hypotheses(model, p, 5, 0, 0.0)[0][1] for p in PROMPTS]
    penalised = [enumerate_hypotheses(model, p, 5, 0, 2.0)[0][1] for p in PROMPTS]
    assert all(len(a) < len(b) for a, b in zip(plain, penalised))
    got = [beam_search(model, 5, 64, length_penalty=alpha, prompts=PROMPTS, eos_id=0).sequences()
           for alpha in (0.0, 2.0)]
    assert got == [plain, penalised]


def constructed_model() -> PrefixModel:
    """Greedy takes the likelier first token and walks into a flat distribution;
    the best sequence goes through the less likely first token."""
    model = PrefixModel(vocab_size=4, max_length=4, seed=0)
    model.set_logits([3], np.log([0.05, 0.5, 0.44, 0.01]))
    model.set_logits([3, 1], np.log([0.25, 0.25, 0.25, 0.25]))
    model.set_logits([3, 2], np.log([0.97, 0.01, 0.01, 0.01]))
    return model


@pytest.mark.parametrize("compiled", [True, False])
def test_beam_beats_greedy_in_a_constructed_case(compiled):
    model = constructed_model()
    greedy = decode(model, 4, GreedySampler(), prompts=[[3]], eos_id=0)
    beam = beam_search(model, 4, 2, prompts=[[3]], eos_id=0, compiled=compiled)
    assert greedy.sequences() == [[3, 1, 0]]
    np.testing.assert_allclose(greedy.log_probs[0], np.log(0.5 * 0.25), rtol=1e-5)
    assert beam.sequences() == [[3, 2, 0]]
    np.testing.assert_allclose(beam.log_probs[0], np.log(0.44 * 0.97), rtol=1e-5)
    assert enumerate_hypotheses(model, [3], 4, 0, 0.0)[0][1] == [3, 2, 0]


def test_eager_and_compiled_agree():
    model = PrefixModel(vocab_size=4, max_length=6, seed=5)
    kwargs = dict(length_penalty=0.6, prompts=[[1], [2, 2, 3], [0]], eos_id=0)
    compiled = beam_search(model, 6, 3, **kwargs)
    eager = beam_search(model, 6, 3, compiled=False, **kwargs)
    np.testing.assert_array_equal(compiled.beam_ids, eager.beam_ids)
    np.testing.assert_allclose(compiled.beam_scores, eager.beam_scores, rtol=1e-6)


def test_stops_once_no_alive_hypothesis_can_win():
    model = PrefixModel(vocab_size=4, max_length=8, seed=6, scale=0.1)
    model.table_np[:, 0] += 8.0  # <eos> is by far the likeliest everywhere
    model.table.assign(model.table_np)
    result = beam_search(model, 8, 2, prompts=[[1]], eos_id=0)
    # Step 1 finishes [1, 0]; step 2 finishes the best alive one; the rest are 8 nats behind.
    assert int(model.steps_taken.numpy()) == 2
    best = enumerate_hypotheses(model, [1], 8, 0, 0.0)
    assert result.sequences() == [best[0][1]]
    np.testing.assert_allclose(result.beam_scores[0], [best[0][0], best[1][0]], rtol=1e-5, atol=1e-6)


def sequence_log_prob(model, ids: np.ndarray, start: int, length: int) -> float:
    """Teacher-forced log-probability of ids[start:length] given the prefix."""
    logits, _ = model(tf.constant(ids[np.newaxis, :length - 1]))
    log_probs = tf.nn.log_softmax(logits[0]).numpy()  # [length - 1, vocab]
    return float(sum(log_probs[t - 1, ids[t]] for t in range(start, length)))


@pytest.mark.parametrize("model_fn", [lambda: TinyRNN(vocab_size=10, hidden=8, seed=3),
                                      lambda: TinyAttention(vocab_size=10, dim=8, max_positions=12, seed=3)],
                         ids=["rnn", "attention"])
def test_scores_match_the_model_on_every_beam(model_fn):
    # Wrong state reordering would make the scores disagree with a fresh forward pass.
    model = model_fn()
    prompts = [[1, 2], [4], [7, 7, 7]]
    result = beam_search(model, 8, 3, length_penalty=0.7, prompts=prompts, eos_id=0)
    for b, prompt in enumerate(prompts):
        for k in range(3):
            assert np.isfinite(result.beam_scores[b, k])
            ids, length = result.beam_ids[b, k], int(result.beam_lengths[b, k])
            assert ids[:len(prompt)].tolist() == prompt
            assert ids[length - 1] == 0 or length == 8
            assert np.all(ids[length:] == 0)  # padded with pad_id = eos_id
            log_prob = sequence_log_prob(model, ids, len(prompt), length)
            np.testing.assert_allclose(result.beam_log_probs[b, k], log_prob, rtol=1e-4, atol=1e-5)
            penalty = gnmt_length_penalty(length - len(prompt), 0.7)
            np.testing.assert_allclose(result.beam_scores[b, k], log_prob / penalty, rtol=1e-4, atol=1e-5)
    assert np.all(np.diff(result.beam_scores, axis=1) <= 0)


def test_prompt_filling_max_length_is_returned():
    model = PrefixModel(vocab_size=4, max_length=3, seed=1)
    result = beam_search(model, 3, 2, prompts=[[1, 2, 3], [1]], eos_id=0)
    assert result.sequences()[0] == [1, 2, 3]
    assert result.scores[0] == 0.0
    single = beam_search(model, 1, 2, prompts=[[2]], eos_id=0)
    assert single.sequences() == [[2]]


@pytest.mark.parametrize("kwargs, message", [
    (dict(beam_width=0), "beam_width = 0 must be an integer >= 1"),
    (dict(length_penalty="0.6"), "length_penalty = '0.6' must be a number"),
    (dict(prompts=[[5]]), "prompt 0 token = 5"),
])
def test_bad_arguments(kwargs, message):
    model = PrefixModel(vocab_size=4, max_length=3)
    kwargs = {"beam_width": 2, "prompts": [[1]], **kwargs}
    with pytest.raises(ValueError, match=message):
        beam_search(model, 3, eos_id=0, **kwargs)
