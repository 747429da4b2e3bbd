"""lmkit.generate / lmkit.decoding.generation: the one entry point, for a language model and an encoder-decoder,
with a GenerationConfig, its fields as keywords, or both; 0.2's keywords name their replacements."""

from __future__ import annotations

import pytest
import tensorflow as tf

import lmkit
from lmkit.core.errors import UsageError
from lmkit.data.tokenizers import train_tokenizer
from lmkit.decoding import GenerationConfig, Generator, GreedySampler, generate
from lmkit.models.bart.model import TransformerSeq2Seq

from .test_text import TEXT, tiny


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chars")
    text_file = folder / "plays.txt"
    text_file.write_text(TEXT * 3, encoding="utf-8")
    return train_tokenizer("char", str(text_file), str(folder))


def test_python_api_from_a_model_object(tokenizer):
    model = tiny("transformer", tokenizer.vocab_size, max_positions=8)
    texts = lmkit.generate(model, ["ab", "ROMEO:"], tokenizer=tokenizer, strategy="greedy", max_new_tokens=12)
    assert len(texts) == 2 and texts[0].startswith("ab") and texts[1].startswith("ROMEO:")
    samples = lmkit.generate(model, "ab", tokenizer=tokenizer, strategy="top_k", top_k=3, num_samples=3,
                             max_length=10, seed=1, return_samples=True)
    assert [len(s.ids) for s in samples] == [10, 10, 10] and all(isinstance(s, lmkit.Generation) for s in samples)
    assert samples[0].continuation == samples[0].text[2:]
    with pytest.raises(UsageError, match="needs tokenizer="):
        lmkit.generate(model, "ab")
    with pytest.raises(UsageError, match="strategy = 'nucleus' is not one of"):
        lmkit.generate(model, "ab", tokenizer=tokenizer, strategy="nucleus")
    with pytest.raises(UsageError, match="beam search cannot go past the model's context of 8"):
        lmkit.generate(model, "ab", tokenizer=tokenizer, strategy="beam", max_new_tokens=20)


def test_beam_search_keeps_the_whole_context_unless_told(tmp_path, monkeypatch):
    """Beam search cannot slide: a run's trained length is no limit for it, an explicit context is."""
    from lmkit.decoding import generation, source, text

    model = tiny("transformer", 30, max_positions=16)
    seen = []
    folder = source.ModelFolder(str(tmp_path), hugging_face=False, conditional=False)
    monkeypatch.setattr(source.ModelFolder, "trained_context", lambda self: 8)
    generator = source.Generator(model, _Chars(), folder=folder)
    real = text.continue_prompts
    monkeypatch.setattr(text, "continue_prompts", lambda *a, **k: seen.append(a[4].context) or real(*a, **k))
    generation.generate(generator, "ab", strategy="beam", max_new_tokens=10)
    generation.generate(generator, "ab", strategy="greedy", max_new_tokens=10)
    assert seen == [None, 8]
    with pytest.raises(UsageError, match="beam search cannot go past the model's context of 8 tokens"):
        generation.generate(generator, "ab", strategy="beam", max_new_tokens=10, context=8)


class _Chars:
    """The least of a tokenizer: characters a-z as ids 4-29, eos 1."""

    eos_id, bos_id, pad_id, vocab_size = 1, None, None, 30
    name = "char"

    def encode(self, text):
        return [ord(c) - ord("a") + 4 for c in text]

    def decode(self, ids):
        return "".join("\n" if i == 1 else chr(i - 4 + ord("a")) if i >= 4 else "" for i in ids)


def test_a_config_and_its_fields_as_keywords_are_one_thing(tokenizer):
    """generate(source, inputs, config, **fields): a keyword wins over the config's field; token ids and text
    prompts give the same samples; an unknown field is named."""
    model = tiny("transformer", tokenizer.vocab_size, max_positions=8)
    by_keywords = generate(model, ["ab", "ROMEO:"], tokenizer=tokenizer, strategy="greedy", max_new_tokens=12)
    config = GenerationConfig(strategy="greedy", max_new_tokens=3)
    assert generate(model, ["ab", "ROMEO:"], config, tokenizer=tokenizer, max_new_tokens=12) == by_keywords
    assert generate(model, ["ab", "ROMEO:"], config.replace(max_new_tokens=12), tokenizer=tokenizer) == by_keywords
    ids = [tokenizer.encode("ab"), tokenizer.encode("ROMEO:")]
    assert generate(model, ids, config, tokenizer=tokenizer, max_new_tokens=12) == by_keywords
    assert generate((model, tokenizer), "ab", config, max_new_tokens=12) == by_keywords[:1]
    own = generate(model, "ab", tokenizer=tokenizer, sampler=GreedySampler(), max_new_tokens=12)
    assert own == by_keywords[:1]
    # 0.2's spellings are errors that name the keyword to use.
    with pytest.raises(UsageError, match=r"strategy = GreedySampler\(\) is not one of .*; pass a Sampler object as "
                                         r"generate\(sampler=...\)"):
        generate(model, "ab", tokenizer=tokenizer, strategy=GreedySampler(), max_new_tokens=12)
    with pytest.raises(UsageError, match=r"generate\(prompts=...\) was removed in lmkit 0.3; pass them as "
                                         r"generate\(source, inputs\)"):
        generate(model, tokenizer=tokenizer, prompts=["ab"])
    with pytest.raises(UsageError, match="unknown key 'top_q'; did you mean 'top_p'"):
        generate(model, "ab", tokenizer=tokenizer, top_q=0.5)
    sampled = generate(model, "ab", tokenizer=tokenizer, strategy="sample", max_new_tokens=5, return_samples=True)
    again = generate(model, "ab", tokenizer=tokenizer, strategy="sample", max_new_tokens=5, seed=sampled[0].seed)
    assert sampled[0].seed is not None and again == [sampled[0].text]  # each sample names its seed


@pytest.fixture(scope="module")
def seq2seq(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    text = folder / "text.txt"
    text.write_text("a b c d e f g h\n", encoding="utf-8")
    words = train_tokenizer("word", str(text), str(folder / "model"))
    tf.random.set_seed(1)
    model = TransformerSeq2Seq(source_vocab_size=words.vocab_size, vocab_size=words.vocab_size, hidden_size=16,
                               num_layers=1, num_heads=2, max_positions=8, max_source_positions=8,
                               share_embeddings=True, init_scale=0.5)
    return Generator(model, words, words)


def test_an_encoder_decoder_decodes_its_sources_through_the_same_entry_point(seq2seq):
    """generate() on an encoder-decoder: greedy by default, one output per source (each as it is alone), and
    with num_samples the samples of each source, tagged by source and sample."""
    sources = ["a b c", "", "d e"]
    greedy = generate(seq2seq, sources)
    assert len(greedy) == 3 and greedy[1] == "" and [generate(seq2seq, s)[0] for s in sources] == greedy
    assert generate(seq2seq, "a b c", strategy="beam", beam_width=1) == greedy[:1]  # width 1 is greedy
    samples = generate(seq2seq, sources, GenerationConfig(strategy="sample", num_samples=2, seed=4),
                       return_samples=True)
    assert [(s.prompt_index, s.sample_index) for s in samples] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert [s.text for s in samples] == generate(seq2seq, sources, strategy="sample", num_samples=2, seed=4)
    assert all(s.seed == 4 and s.prompt_text == "" and s.continuation == s.text for s in samples)
    with pytest.raises(UsageError, match="an encoder-decoder decodes texts"):
        generate(seq2seq, [[1, 2]])
    with pytest.raises(UsageError, match="an encoder-decoder's outputs come a batch at a time"):
        generate(seq2seq, "a", stream=print)
    with pytest.raises(UsageError, match="stop applies to language models; the model holds an encoder-decoder"):
        generate(seq2seq, "a", stop=["x"])
