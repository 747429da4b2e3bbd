"""lmkit.decoding.transduction (an encoder-decoder's half of lmkit.generate): sources decoded in batches come
back in order, whatever the batch; several samples per source; BLEU and exact match."""
import pytest
import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.data.tokenizers import train_tokenizer
from lmkit.decoding import Generator, generate
from lmkit.decoding.transduction import score
from lmkit.models.bart.model import TransformerSeq2Seq


def transduce(run, sources, **options):
    """One output text per source."""
    return generate(run, sources, **options)


def transduce_samples(run, sources, **options):
    """``num_samples`` output texts per source, grouped by source."""
    grouped = [[] for _ in sources]
    for sample in generate(run, sources, return_samples=True, **options):
        grouped[sample.prompt_index].append(sample.text)
    return grouped


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    text = folder / "text.txt"
    text.write_text("a b c d e f g h\n", encoding="utf-8")
    tokenizer = train_tokenizer("word", str(text), str(folder / "model"))
    tf.random.set_seed(1)
    model = TransformerSeq2Seq(source_vocab_size=tokenizer.vocab_size, vocab_size=tokenizer.vocab_size,
                               hidden_size=16, num_layers=1, num_heads=2, max_positions=8, max_source_positions=8,
                               share_embeddings=True, init_scale=0.5)
    return Generator(model, tokenizer, tokenizer)


SOURCES = ["a b c", "", "d", "e f g h a", "b b", "c"]


def test_outputs_follow_the_sources_whatever_the_batching(run):
    whole = transduce(run, SOURCES, batch_size=8)
    assert len(whole) == 6 and whole[1] == ""  # an empty source, an empty output
    for batch_size in (1, 2, 5):
        assert transduce(run, SOURCES, batch_size=batch_size) == whole
    # Each output is what the source gives alone (padding and batch neighbours change nothing).
    assert [transduce(run, [s])[0] for s in SOURCES] == whole
    assert transduce(run, SOURCES, strategy="beam", beam_width=1) == whole  # width 1 is greedy
    assert len(transduce(run, SOURCES, strategy="beam", beam_width=3, batch_size=4)) == 6
    sampled = transduce(run, SOURCES, strategy="sample", seed=3)
    assert sampled == transduce(run, SOURCES, strategy="sample", seed=3)
    assert all(len(text.split()) <= 3 for text in transduce(run, SOURCES, max_new_tokens=3))


def test_bad_settings_and_long_sources_are_named(run):
    with pytest.raises(UsageError, match="source 2 has 9 tokens, more than the model reads"):
        transduce(run, ["a", "a b c d e f g h a"])
    with pytest.raises(UsageError, match=r"max_new_tokens = 8 exceeds what the decoder holds: 7 \(max_positions 8"):
        transduce(run, ["a"], max_new_tokens=8)
    with pytest.raises(UsageError, match="batch_size = 0 must be an integer >= 1"):
        transduce(run, ["a"], batch_size=0)


def test_score_is_sacrebleu_and_exact_match():
    import sacrebleu
    outputs, references = ["the cat sat on the mat", "a b c", "x y"], ["the cat sat on a mat", "a b c", "y x"]
    result = score(outputs, references)
    assert result["exact_match"] == pytest.approx(1 / 3) and result["sentences"] == 3
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(outputs, [references]).score)
    assert score(references, references)["bleu"] == pytest.approx(100.0)
    assert "tok:13a" in result["bleu_signature"]
    with pytest.raises(UsageError, match="2 outputs but 3 references"):
        score(outputs[:2], references)


def test_several_samples_per_source(run):
    sampled = transduce_samples(run, SOURCES, num_samples=3, strategy="sample", seed=5, batch_size=4)
    assert [len(s) for s in sampled] == [3] * len(SOURCES)
    assert sampled[1] == ["", "", ""]  # an empty source
    assert sampled == transduce_samples(run, SOURCES, num_samples=3, strategy="sample", seed=5, batch_size=4)
    assert any(len(set(s)) > 1 for s in sampled)  # each sample is drawn on its own
    # Beam search: the best hypotheses of one search, the best first (the 1-best is transduce's).
    best = transduce(run, SOURCES, strategy="beam", beam_width=3)
    nbest = transduce_samples(run, SOURCES, num_samples=3, strategy="beam", beam_width=3)
    assert [s[0] for s in nbest] == best
    assert all(1 <= len(s) <= 3 for s in nbest) and nbest[1] == ["", "", ""]
    assert any(len(s) > 1 for s in nbest)
    # One sample is transduce's output.
    assert transduce_samples(run, SOURCES, strategy="beam", beam_width=3) == [[text] for text in best]


def test_bad_sample_counts_are_named(run):
    with pytest.raises(UsageError, match="greedy decoding writes one output per source"):
        transduce_samples(run, ["a"], num_samples=2)
    with pytest.raises(UsageError, match="num_samples = 4 exceeds beam_width = 3"):
        transduce_samples(run, ["a"], num_samples=4, strategy="beam", beam_width=3)
    with pytest.raises(UsageError, match="num_samples = 0 must be an integer >= 1"):
        transduce_samples(run, ["a"], num_samples=0, strategy="sample")
