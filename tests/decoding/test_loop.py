"""lmkit.decoding.loop (decode): <eos>, padding, prompts, seeds, the cache, argument checks."""

from __future__ import annotations

import numpy as np
import pytest

from lmkit.decoding import (
    BeamSampler,
    BeamSearchResult,
    GreedySampler,
    RandomSampler,
    TopKSampler,
    TopPSampler,
    decode,
)

from .fakes import PrefixModel, TableModel, TinyAttention, TinyRNN

EOS, PAD = 5, 7


def successor_model(vocab: int = 8) -> TableModel:
    """Greedy next token = last + 1 (mod vocab)."""
    table = np.zeros((1, vocab, vocab), np.float32)
    for last in range(vocab):
        table[0, last, (last + 1) % vocab] = 3.0
    return TableModel(table)


@pytest.mark.parametrize("compiled", [True, False])
def test_stops_at_eos_per_sequence_and_pads(compiled):
    model = successor_model()
    result = decode(model, 8, GreedySampler(), prompts=[[0], [3], [4]], eos_id=EOS, pad_id=PAD,
                    compiled=compiled)
    np.testing.assert_array_equal(result.ids, [
        [0, 1, 2, 3, 4, 5, PAD, PAD],
        [3, 4, 5, PAD, PAD, PAD, PAD, PAD],
        [4, 5, PAD, PAD, PAD, PAD, PAD, PAD],
    ])
    np.testing.assert_array_equal(result.lengths, [6, 3, 2])
    assert result.sequences() == [[0, 1, 2, 3, 4, 5], [3, 4, 5], [4, 5]]
    assert result.sequences(include_prompt=False) == [[1, 2, 3, 4, 5], [4, 5], [5]]
    # The loop ended once the last sequence finished: 5 steps, not max_length - 1 = 7.
    assert int(model.steps_taken.numpy()) == 5


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("sampler", [GreedySampler(), BeamSampler(beam_width=1)])
def test_any_of_several_end_ids_ends_a_sequence(compiled, sampler):
    # A Hugging Face generation_config.json may list an end of text and an end of turn: each row stops
    # at whichever it meets first; padding is the first id.
    model = successor_model()
    result = decode(model, 8, sampler, prompts=[[0], [3], [6]], eos_id=[EOS, 2], compiled=compiled)
    assert result.sequences() == [[0, 1, 2], [3, 4, 5], [6, 7, 0, 1, 2]]
    np.testing.assert_array_equal(result.lengths, [3, 3, 5])
    if not isinstance(sampler, BeamSampler):  # beam search marks unused slots by score, not padding
        np.testing.assert_array_equal(result.ids[1], [3, 4, 5, EOS, EOS, EOS, EOS, EOS])
    # One id in a list is that id; repeated ids count once.
    np.testing.assert_array_equal(decode(model, 8, sampler, prompts=[[0]], eos_id=[EOS, EOS]).ids,
                                  decode(model, 8, sampler, prompts=[[0]], eos_id=EOS).ids)


def test_min_new_tokens_holds_back_every_end_id():
    # The successor model's greedy choice would be 2 after 1, then 0 after 7: both end ids are held
    # back (the row takes its runner-up, 7) until it has generated 3 tokens; the 4th may end it.
    table = np.zeros((1, 8, 8), np.float32)
    for last in range(8):
        table[0, last, (last + 1) % 8] = 3.0
        table[0, last, 7] = 1.0  # the runner-up everywhere
    result = decode(TableModel(table), 8, GreedySampler(), prompts=[[1]], eos_id=[2, 0], min_new_tokens=3)
    assert result.sequences() == [[1, 7, 7, 7, 0]]


def test_pad_defaults_to_eos_and_eos_inside_a_prompt_does_not_stop():
    model = successor_model()
    result = decode(model, 6, GreedySampler(), prompts=[[5, 6], [2]], eos_id=EOS)
    np.testing.assert_array_equal(result.ids, [[5, 6, 7, 0, 1, 2], [2, 3, 4, 5, 5, 5]])
    np.testing.assert_array_equal(result.lengths, [6, 4])


def test_without_eos_generates_to_max_length():
    result = decode(successor_model(), 5, GreedySampler(), batch_size=2, start_id=6)
    np.testing.assert_array_equal(result.ids, [[6, 7, 0, 1, 2]] * 2)
    np.testing.assert_array_equal(result.lengths, [5, 5])


def test_start_id_defaults_to_eos_and_prefixes_prompts():
    model = successor_model()
    plain = decode(model, 4, GreedySampler(), batch_size=1, eos_id=7)
    np.testing.assert_array_equal(plain.ids, [[7, 0, 1, 2]])
    prefixed = decode(model, 5, GreedySampler(), prompts=[[2], [0, 1]], start_id=6)
    np.testing.assert_array_equal(prefixed.ids, [[6, 2, 3, 4, 5], [6, 0, 1, 2, 3]])
    np.testing.assert_array_equal(prefixed.prompt_lengths, [2, 3])


def test_prompts_of_different_lengths_start_the_output():
    model = PrefixModel(vocab_size=5, max_length=7, seed=2)
    prompts = [[1], [2, 0, 4], [3, 3, 3, 3, 1], [0, 4]]
    result = decode(model, 7, GreedySampler(), prompts=prompts)
    for b, prompt in enumerate(prompts):
        row = result.ids[b].tolist()
        assert row[:len(prompt)] == prompt
        # Every later token is the argmax given the whole prefix (NumPy reference).
        for t in range(len(prompt), 7):
            assert row[t] == int(np.argmax(model.numpy_logits(row[:t]))), (b, t, row)
    np.testing.assert_array_equal(result.prompt_lengths, [1, 3, 5, 2])


def test_prompt_as_long_as_max_length_is_returned_unchanged():
    model = successor_model()
    result = decode(model, 3, RandomSampler(), prompts=[[1, 1, 1], [2]], seed=0)
    assert result.ids[0].tolist() == [1, 1, 1]
    assert result.log_probs[0] == 0.0


def flat_model(vocab: int = 50) -> TableModel:
    return TableModel(np.zeros((1, vocab, vocab), np.float32))


# p = 0.91, not 0.9: over 50 equal probabilities, 0.9 is exactly the mass of 45 tokens, and
# whether the 46th is kept would depend on the last bit of a cumulative sum (eager and graph
# kernels may round it apart).
@pytest.mark.parametrize("sampler", [RandomSampler(), TopKSampler(k=20), TopPSampler(p=0.91)],
                         ids=["sample", "top_k", "top_p"])
def test_same_seed_same_output_other_seed_other_output(sampler):
    model = flat_model()
    first = decode(model, 10, sampler, batch_size=4, start_id=0, seed=42)
    again = decode(model, 10, sampler, batch_size=4, start_id=0, seed=42)
    eager = decode(model, 10, sampler, batch_size=4, start_id=0, seed=42, compiled=False)
    other = decode(model, 10, sampler, batch_size=4, start_id=0, seed=43)
    np.testing.assert_array_equal(again.ids, first.ids)
    np.testing.assert_array_equal(eager.ids, first.ids)
    assert (other.ids != first.ids).any()
    assert first.seed == 42
    # Rows draw independently: a flat distribution over 50 tokens makes equal rows unlikely.
    assert len({tuple(r) for r in first.ids.tolist()}) == 4


def test_no_seed_draws_one_and_reports_it():
    model = flat_model()
    result = decode(model, 10, RandomSampler(), batch_size=3, start_id=0)
    replay = decode(model, 10, RandomSampler(), batch_size=3, start_id=0, seed=result.seed)
    np.testing.assert_array_equal(replay.ids, result.ids)


MODELS = {
    "table": lambda: TableModel(np.random.RandomState(1).randn(12, 12, 12).astype(np.float32)),
    "prefix": lambda: PrefixModel(vocab_size=4, max_length=8, seed=1),
    "rnn": lambda: TinyRNN(vocab_size=12, hidden=8),
    "attention": lambda: TinyAttention(vocab_size=12, dim=8, max_positions=16),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_cached_decoding_equals_recomputing_the_prefix(name):
    # Greedy is covered with the built-in models (test_decoding_real_models.py).
    sampler = TopKSampler(k=4, temperature=1.5)
    model = MODELS[name]()
    vocab = model.vocab_size
    prompts = [[1], [2, 3, 0], [0, vocab - 1]]
    kwargs = dict(prompts=prompts, eos_id=3, seed=7)
    cached = decode(model, 8, sampler, **kwargs)
    model.steps_taken.assign(0)
    full = decode(model, 8, sampler, use_cache=False, **kwargs)
    assert int(model.steps_taken.numpy()) == 0  # the reference path never calls step
    np.testing.assert_array_equal(cached.ids, full.ids)
    np.testing.assert_array_equal(cached.lengths, full.lengths)
    np.testing.assert_allclose(cached.log_probs, full.log_probs, rtol=1e-5, atol=1e-5)


def test_decode_hands_a_beam_sampler_to_beam_search():
    model = PrefixModel(vocab_size=4, max_length=5, seed=3)
    through_decode = decode(model, 5, BeamSampler(beam_width=3, length_penalty=0.5),
                            prompts=[[1], [2, 2]], eos_id=0)
    assert isinstance(through_decode, BeamSearchResult)
    by_name = decode(model, 5, prompts=[[1], [2, 2]], eos_id=0, strategy="beam", beam_width=3, length_penalty=0.5)
    np.testing.assert_array_equal(through_decode.beam_ids, by_name.beam_ids)  # the config's strategy
    with pytest.raises(ValueError, match="beam search is deterministic"):
        decode(model, 5, BeamSampler(), batch_size=1, eos_id=0, seed=3)


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch_size=2), "needs a first token"),
    (dict(), "give batch_size or prompts"),
    (dict(prompts=[1, 2]), r"wrap a single prompt: prompts=\[\[...\]\]"),
    (dict(prompts=[[1], []], eos_id=0), "prompt 1 is empty"),
    (dict(prompts=[[1] * 7]), "prompt 0 has 7 tokens.*max_length = 6"),
    (dict(prompts=[[1], [9]]), r"prompt 1 token = 9 is not a token id.*\[0, 8\)"),
    (dict(prompts=[[1]], batch_size=2), "batch_size = 2 but 1 prompts"),
    (dict(batch_size=1, eos_id=8), "eos_id = 8"),
    (dict(batch_size=1, eos_id=[1, 8]), "eos_id = 8"),
    (dict(batch_size=1, eos_id=[]), r"eos_id = \[\] must be a token id or a non-empty list of them"),
    (dict(batch_size=1, eos_id=[1, "2"]), r"eos_id = \[1, '2'\] must be a token id or a non-empty list"),
    (dict(batch_size=1, eos_id=1, seed=-1), r"seed = -1 must be an integer in \[0, 2\*\*63\)"),
    (dict(batch_size=1, eos_id=1, max_length=0), "max_length = 0"),
])
def test_bad_arguments_name_the_problem(kwargs, message):
    kwargs = dict(kwargs)
    max_length = kwargs.pop("max_length", 6)
    with pytest.raises(ValueError, match=message):
        decode(successor_model(), max_length, RandomSampler(), **kwargs)


def test_sampler_must_be_a_sampler():
    with pytest.raises(ValueError, match="get_sampler"):
        decode(successor_model(), 4, "greedy", batch_size=1, eos_id=0)
