"""lmkit.decoding.text (a language model's half of lmkit.generate): line breaks as text, windows past the context,
stop strings, streaming, rules on tokens."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

import lmkit
from lmkit.core.errors import UsageError
from lmkit.data.tokenizers import train_tokenizer
from lmkit.decoding import GreedySampler, TopKSampler, decode, generate
from lmkit.decoding.text import readable
from lmkit.models import build_model

TEXT = "ROMEO:\nab cd\nJULIET:\nba dc\n\nROMEO:\ncab\n"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chars")
    text_file = folder / "plays.txt"
    text_file.write_text(TEXT * 3, encoding="utf-8")
    return train_tokenizer("char", str(text_file), str(folder))


def tiny(kind: str, vocab_size: int, max_positions: int = 8, seed: int = 0):
    # A wide init (0.8) spreads the logits, so float rounding (cached against uncached, XLA
    # against plain, another CPU) cannot flip the greedy argmax these tests compare exactly.
    tf.random.set_seed(seed)
    config = {"model": kind, "vocab_size": vocab_size, "hidden_size": 8, "num_layers": 1,
              "init_scale": 0.8, "dropout": 0.0}
    if kind == "transformer":
        config.update(num_heads=2, max_positions=max_positions)
    return build_model(config)


def generate_samples(model, tokenizer, prompts, *, max_new_tokens, sampler, rules=None, **options):
    """``generate`` on token-id prompts with a sampler of the test's: ``(samples, seed)``."""
    if rules is not None:  # the rules' fields, as generate takes them
        options.update(rules.get_config())
    samples = generate(model, prompts, tokenizer=tokenizer, sampler=sampler, max_new_tokens=max_new_tokens,
                       return_samples=True, **options)
    return samples, samples[0].seed if samples else None


def line_break_loving(tokenizer, kind="lstm"):
    """A model whose output bias favours the line break: old-style decoding stops at once."""
    model = tiny(kind, tokenizer.vocab_size)
    bias = [v for v in model.trainable_variables if "bias" in v.name and v.shape == (tokenizer.vocab_size,)]
    if bias:
        bias[-1].assign(tf.one_hot(tokenizer.eos_id, tokenizer.vocab_size) * 3.0)
    return model


def test_line_breaks_are_text_and_stop_at_eos_keeps_one_line(tokenizer):
    model = line_break_loving(tokenizer)
    prompt = tokenizer.encode("ROMEO:")
    multi, _ = generate_samples(model, tokenizer, [prompt], max_new_tokens=40, sampler=GreedySampler())
    assert len(multi[0].ids) == len(prompt) + 40 and multi[0].stopped_by == "length"
    assert multi[0].text.startswith("ROMEO:") and multi[0].text == tokenizer.decode(multi[0].ids)
    one, _ = generate_samples(model, tokenizer, [prompt], max_new_tokens=40, sampler=GreedySampler(),
                              stop_at_eos=True)
    assert "\n" not in one[0].text and one[0].stopped_by == "eos"
    # The one-line sample is the start of the multi-line one: the same model, the same greedy path.
    assert multi[0].ids[:len(one[0].ids)] == one[0].ids
    assert multi[0].ids[len(one[0].ids)] == tokenizer.eos_id


def test_a_transformer_slides_past_its_context_with_the_compiled_loop(tokenizer):
    window = 8
    model = tiny("transformer", tokenizer.vocab_size, max_positions=window)
    prompt = tokenizer.encode("ab")
    got, _ = generate_samples(model, tokenizer, [prompt], max_new_tokens=25, sampler=GreedySampler())
    assert len(got[0].ids) == len(prompt) + 25
    # Reference: the same sliding by hand, each window decoded on its own (uncached, not compiled).
    seq = [tokenizer.eos_id] + prompt
    first = decode(model, window, GreedySampler(), prompts=[seq], use_cache=False, compiled=False)
    seq = first.sequences()[0]
    keep = window // 2
    while len(seq) < 1 + len(prompt) + 25:
        nxt = decode(model, window, GreedySampler(), prompts=[seq[-keep:]], use_cache=False, compiled=False)
        seq = seq + nxt.sequences()[0][keep:]
    assert got[0].ids == seq[1:1 + len(prompt) + 25]


def test_context_slides_a_transformer_at_the_length_it_was_trained_on(tokenizer, tmp_path):
    model = tiny("transformer", tokenizer.vocab_size, max_positions=16)
    prompt = tokenizer.encode("ab")
    narrow, _ = generate_samples(model, tokenizer, [prompt], max_new_tokens=25, sampler=GreedySampler(),
                                 context=8)
    window = tiny("transformer", tokenizer.vocab_size, max_positions=8)
    for mine, other in zip(model.variables, window.variables):
        assert mine.name == other.name
        other.assign(mine if mine.shape == other.shape else mine[:other.shape[0]])  # positions 0-7
    same, _ = generate_samples(window, tokenizer, [prompt], max_new_tokens=25, sampler=GreedySampler())
    wide, _ = generate_samples(model, tokenizer, [prompt], max_new_tokens=25, sampler=GreedySampler())
    assert narrow[0].ids == same[0].ids  # reads 8 positions, then slides, as a model of 8 positions
    assert narrow[0].ids[:8] == wide[0].ids[:8]
    with pytest.raises(UsageError, match="context = 1 must be an integer >= 2"):
        generate_samples(model, tokenizer, [prompt], max_new_tokens=5, sampler=GreedySampler(), context=1)
    # A run's trained length is its num_steps; pretrained starts keep max_positions.
    from lmkit.decoding.source import open_folder

    def trained_context(folder):
        return open_folder(folder).trained_context()
    (tmp_path / "config.json").write_text(json.dumps({"num_steps": 64, "init_from": ""}))
    assert trained_context(str(tmp_path)) == 64
    (tmp_path / "config.json").write_text(json.dumps({"num_steps": 64, "init_from": "gpt2_folder"}))
    assert trained_context(str(tmp_path)) is None


def test_sliding_samples_are_reproducible_by_seed(tokenizer):
    model = tiny("transformer", tokenizer.vocab_size, max_positions=8)
    prompts = [tokenizer.encode("ab"), tokenizer.encode("ROMEO:")]
    run = lambda seed: generate_samples(model, tokenizer, prompts, max_new_tokens=25,  # noqa: E731
                                        sampler=TopKSampler(k=4), num_samples=2, seed=seed)
    a, seed_a = run(5)
    b, _ = run(5)
    c, _ = run(6)
    assert seed_a == 5 and [s.ids for s in a] == [s.ids for s in b] and [s.ids for s in a] != [s.ids for s in c]
    assert [(s.prompt_index, s.sample_index) for s in a] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [len(s.ids) - s.prompt_length for s in a] == [25, 25, 25, 25]


def test_stop_strings_end_a_sample_before_the_string(tokenizer):
    model = line_break_loving(tokenizer)
    prompt = tokenizer.encode("ROMEO:")
    full, _ = generate_samples(model, tokenizer, [prompt], max_new_tokens=60, sampler=GreedySampler())
    generated = full[0].text[len("ROMEO:"):]
    stop = "\n" if "\n\n" not in generated else "\n\n"
    cut, _ = generate_samples(model, tokenizer, [prompt], max_new_tokens=60, sampler=GreedySampler(),
                              stop=[stop, "dddddddddddd"])
    assert cut[0].stopped_by == stop
    assert cut[0].text == "ROMEO:" + generated[:generated.index(stop)]
    # Its ids run up to and including the tokens that wrote the stop string.
    assert tokenizer.decode(cut[0].ids).endswith(stop)


def test_bad_stop_strings_are_one_clear_error(tokenizer):
    model = tiny("lstm", tokenizer.vocab_size)
    for bad, match in (("", "must be non-empty strings"),
                       ("\u00e9t\u00e9", "cannot be produced by this model's char tokenizer")):
        with pytest.raises(UsageError, match=match):
            generate_samples(model, tokenizer, [tokenizer.encode("ab")], max_new_tokens=5,
                             sampler=GreedySampler(), stop=[bad])


def test_readable_escapes_control_characters_but_keeps_lines_and_tabs():
    assert readable("a\tb\nc") == "a\tb\nc"
    assert readable("bell\x07 esc\x1b[2J") == "bell\\x07 esc\\x1b[2J"
    assert readable("caf\u00e9 \u2603") == "caf\u00e9 \u2603"


def test_lstm_generation_has_no_window(tokenizer):
    model = tiny("lstm", tokenizer.vocab_size)
    got, _ = generate_samples(model, tokenizer, [tokenizer.encode("ab")], max_new_tokens=100,
                              sampler=GreedySampler())
    assert len(got[0].ids) == 102
    ref = decode(model, 103, GreedySampler(), prompts=[[tokenizer.eos_id] + tokenizer.encode("ab")])
    assert got[0].ids == ref.sequences()[0][1:]
    assert np.all(np.asarray(got[0].ids) < tokenizer.vocab_size)


def _greedy_reference(model, prompt, new_tokens, penalty):
    """Greedy with the repetition penalty, the whole prefix re-read each step (NumPy on the logits)."""
    seq = list(prompt)
    for _ in range(new_tokens):
        logits, _ = model(tf.constant([seq]), training=False)
        row = logits.numpy()[0, -1].astype(np.float64)
        seen = np.zeros_like(row, bool)
        seen[seq] = True
        row = np.where(seen, np.where(row > 0, row / penalty, row * penalty), row)
        seq.append(int(np.argmax(row)))
    return seq


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_repetition_penalty_matches_a_numpy_reference_compiled_or_not(tokenizer, kind):
    model = tiny(kind, tokenizer.vocab_size, max_positions=32)
    prompt = [tokenizer.eos_id] + tokenizer.encode("ab")
    want = _greedy_reference(model, prompt, 15, penalty=1.8)
    xla = decode(model, len(want), GreedySampler(), prompts=[prompt], repetition_penalty=1.8)
    plain = decode(model, len(want), GreedySampler(), prompts=[prompt], repetition_penalty=1.8, jit_compile=False)
    assert xla.sequences()[0] == want == plain.sequences()[0]
    assert decode(model, len(want), GreedySampler(), prompts=[prompt]).sequences()[0] != want  # it changes output
    with pytest.raises(UsageError, match=r"repetition_penalty = 0 must be > 0 \(1 = off\)"):
        decode(model, 10, GreedySampler(), prompts=[prompt], repetition_penalty=0)


def test_min_new_tokens_holds_the_end_token_back(tokenizer):
    model = line_break_loving(tokenizer)
    prompt = tokenizer.encode("ROMEO:")
    free, _ = generate_samples(model, tokenizer, [prompt], max_new_tokens=30, sampler=GreedySampler(),
                               stop_at_eos=True)
    held, _ = generate_samples(model, tokenizer, [prompt], max_new_tokens=30, sampler=GreedySampler(),
                               stop_at_eos=True, min_new_tokens=6)
    assert len(free[0].ids) - len(prompt) < 6  # it would end sooner
    assert len(held[0].ids) - len(prompt) >= 6 and "\n" not in held[0].text
    # beam search holds it back too (a rule of its search, as transformers' min_length)
    from lmkit.decoding.beam import BeamSampler
    free, _ = generate_samples(model, tokenizer, [prompt], max_new_tokens=30, sampler=BeamSampler(2),
                               stop_at_eos=True)
    held, _ = generate_samples(model, tokenizer, [prompt], max_new_tokens=30, sampler=BeamSampler(2),
                               stop_at_eos=True, min_new_tokens=6)
    assert len(free[0].ids) - len(prompt) < 6
    assert len(held[0].ids) - len(prompt) >= 6 and "\n" not in held[0].text
    with pytest.raises(UsageError, match="repetition_penalty applies to the per-token strategies"):
        lmkit.generate(model, "ab", tokenizer=tokenizer, strategy="beam", max_new_tokens=3,
                       repetition_penalty=1.2)


@pytest.mark.parametrize("stop", [[], ["\n"]])
def test_streaming_writes_the_sample_as_it_comes(tokenizer, stop):
    model = tiny("transformer", tokenizer.vocab_size, max_positions=8)
    prompt = tokenizer.encode("ROMEO:")
    pieces, steps = [], []

    def write(piece):
        pieces.append(piece)
        steps.append(len(pieces))

    streamed, _ = generate_samples(model, tokenizer, [prompt], max_new_tokens=20, sampler=GreedySampler(),
                                   stop=stop, stream=write)
    whole, _ = generate_samples(model, tokenizer, [prompt], max_new_tokens=20, sampler=GreedySampler(),
                                stop=stop)
    assert "".join(pieces) == streamed[0].text == whole[0].text  # past the context (8) too
    assert pieces[0] == "ROMEO:" and len(pieces) > 3  # the prompt, then piece by piece
    with pytest.raises(UsageError, match="stream writes one sample as it comes: give one prompt"):
        generate_samples(model, tokenizer, [prompt, prompt], max_new_tokens=3, sampler=GreedySampler(),
                         stream=write)


def test_the_streamer_holds_back_what_may_still_change(tokenizer):
    from lmkit.decoding.text import _TextStreamer
    out = []
    ids = tokenizer.encode("ab cd")
    streamer = _TextStreamer(tokenizer, [], budget=5, end_ids=[], stop=[" c"], write=out.append)
    for token in ids:
        streamer(np.array([token]), np.array([True]))
    assert "".join(out) == "ab" and streamer.done  # " c" stopped it; nothing of it was written
    out.clear()
    streamer = _TextStreamer(tokenizer, [], budget=9, end_ids=[], stop=["xyz"], write=out.append)
    for token in ids[:3]:
        streamer(np.array([token]), np.array([True]))
    assert "".join(out) == "a"  # "b " could still start "xyz"... held back: len("xyz") - 1 characters
    streamer.finish("ab ")
    assert "".join(out) == "ab "
    out.clear()  # any of several end ids ends the stream, and is not text
    streamer = _TextStreamer(tokenizer, [], budget=9, end_ids=[99, ids[1]], stop=[], write=out.append)
    for token in ids[:3]:
        streamer(np.array([token]), np.array([True]))
    assert "".join(out) == tokenizer.decode(ids[:1]) and streamer.done


def _bigrams(ids):
    return [tuple(ids[i:i + 2]) for i in range(len(ids) - 1)]


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_rules_on_tokens_hold_through_generation_and_its_sliding_window(tokenizer, kind):
    """no_repeat_ngram_size keeps every bigram of a sample (prompt included) unique; the forced first token comes
    once, where the sample starts, also when a transformer's window slides (8 positions here, 20 new tokens)."""
    from lmkit.decoding.constraints import Constraints
    model = tiny(kind, tokenizer.vocab_size)
    prompt = tokenizer.encode("ab")
    free, _ = generate_samples(model, tokenizer, [prompt], max_new_tokens=20, sampler=GreedySampler())
    assert len(set(_bigrams(free[0].ids))) < len(_bigrams(free[0].ids))  # greedy alone repeats itself
    first = tokenizer.encode("J")[0]
    rules = Constraints(no_repeat_ngram_size=2, forced_first_id=first, forced_last_id=tokenizer.encode("c")[0])
    held, _ = generate_samples(model, tokenizer, [prompt], max_new_tokens=20, sampler=GreedySampler(), rules=rules)
    new = held[0].ids[len(prompt):]
    assert new[0] == first
    # Forced once: the same sample as the prompt with that token after it, and no forced first token.
    after, _ = generate_samples(model, tokenizer, [prompt + [first]], max_new_tokens=19, sampler=GreedySampler(),
                                rules=Constraints(no_repeat_ngram_size=2, forced_last_id=rules.forced_last_id))
    assert after[0].ids == held[0].ids
    if kind == "lstm":  # no window: all of the sample is seen, and the last token is forced
        assert len(set(_bigrams(held[0].ids))) == len(_bigrams(held[0].ids))
        assert new[-1] == tokenizer.encode("c")[0] and len(new) == 20
    else:  # the bigrams of each window are unique
        assert len(set(_bigrams(held[0].ids[:8]))) == len(_bigrams(held[0].ids[:8]))
