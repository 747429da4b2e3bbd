"""The encoder-decoders (transformer, RNN with Luong or Bahdanau attention): cached steps = the full pass,
decoding with a condition (XLA, plain, uncached, beam search), padded sources decode as alone, and each
learns a copy task."""

import numpy as np
import pytest
import tensorflow as tf

from lmkit import decoding
from lmkit.core.errors import UsageError
from lmkit.models.bart.model import TransformerSeq2Seq
from lmkit.models.rnn.seq2seq import RNNSeq2Seq

START, END = 1, 2
SOURCES = [[5, 6, 7, 8, 9], [9, 4, 3, 0, 0]]  # the second padded with 0
MASK = [[True] * 5, [True, True, True, False, False]]


KINDS = {
    "transformer-pre-ln": (TransformerSeq2Seq, dict(num_heads=2, max_source_positions=8)),
    "transformer-post-ln": (TransformerSeq2Seq, dict(num_heads=2, max_source_positions=8, pre_layer_norm=False)),
    "rnn-luong": (RNNSeq2Seq, dict(cell="lstm", attention="luong")),
    "rnn-bahdanau": (RNNSeq2Seq, dict(cell="gru", attention="bahdanau", bidirectional=False)),
}


def _model(kind="transformer-pre-ln", **options):
    tf.random.set_seed(0)
    cls, extra = KINDS[kind]
    config = dict(source_vocab_size=12, vocab_size=11, hidden_size=16, num_layers=2, max_positions=10,
                  init_scale=0.3, **extra)
    return cls(**{**config, **options})


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_cached_steps_equal_the_teacher_forced_pass(kind):
    model = _model(kind)
    memory = model.encode(tf.constant(SOURCES), tf.constant(MASK))
    target = tf.constant([[START, 3, 4, 5, 6], [START, 7, 7, 2, 0]])
    full, _ = model(target, condition=memory)
    assert full.shape == (2, 5, 11)
    state = model.initial_state(2, 5, condition=memory)
    prefill, state = model(target[:, :2], state)
    steps = [prefill]
    for t in range(2, 5):
        logits, state = model.step(target[:, t], state)
        steps.append(logits[:, tf.newaxis])
    np.testing.assert_allclose(tf.concat(steps, 1).numpy(), full.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["transformer-pre-ln", "rnn-luong", "rnn-bahdanau"])
def test_decoding_with_a_condition_agrees_across_loops_and_rows_decode_as_alone(kind):
    model = _model(kind)
    memory = model.encode(tf.constant(SOURCES), tf.constant(MASK))
    prompts = [[START], [START]]
    runs = [decoding.decode(model, 8, prompts=prompts, eos_id=END, condition=memory, **options).ids
            for options in ({}, {"jit_compile": False}, {"use_cache": False})]
    np.testing.assert_array_equal(runs[0], runs[1])
    np.testing.assert_array_equal(runs[0], runs[2])
    # The padded row decodes as its source alone, unpadded.
    alone = model.encode(tf.constant([[9, 4, 3]]))
    single = decoding.decode(model, 8, prompts=[[START]], eos_id=END, condition=alone).ids
    np.testing.assert_array_equal(single[0], runs[0][1])
    # Beam search gathers the condition with the hypotheses; width 1 without an end token is greedy.
    greedy = decoding.decode(model, 8, prompts=prompts, condition=memory).ids
    beam = decoding.decode(model, 8, decoding.BeamSampler(1), prompts=prompts, condition=memory)
    np.testing.assert_array_equal(beam.ids, greedy)
    wide = decoding.decode(model, 8, decoding.BeamSampler(3), prompts=prompts, condition=memory)
    assert wide.ids.shape == (2, 8) and np.all(wide.scores >= beam.scores - 1e-5)  # never worse


@pytest.mark.parametrize("kind", ["transformer-pre-ln", "rnn-luong"])
def test_it_learns_to_copy_its_source(kind):
    sizes = dict(num_heads=4, max_source_positions=6) if kind.startswith("transformer") else {}
    model = _model(kind, num_layers=1, hidden_size=32, max_positions=8, share_embeddings=True, source_vocab_size=11,
                   **sizes)
    rng = np.random.default_rng(0)
    optimizer = tf.keras.optimizers.Adam(0.01)

    @tf.function
    def train_step(source, target):
        with tf.GradientTape() as tape:
            logits, _ = model(target[:, :-1], condition=model.encode(source), training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(target[:, 1:], logits))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for _ in range(250):
        source = rng.integers(3, 11, (32, 5)).astype(np.int32)
        target = np.concatenate([np.full((32, 1), START), source, np.full((32, 1), END)], 1).astype(np.int32)
        loss = float(train_step(tf.constant(source), tf.constant(target)))
    held_out = rng.integers(3, 11, (16, 5)).astype(np.int32)
    out = decoding.decode(model, 7, prompts=[[START]] * 16, eos_id=END, condition=model.encode(held_out)).ids
    exact = np.mean(np.all(out[:, 1:6] == held_out, axis=1))
    print(f"copy task: final loss {loss:.4f}, exact {exact:.2f}")
    assert loss < 0.1 and exact >= 0.9, (loss, exact)


@pytest.mark.parametrize("kind", ["transformer-pre-ln", "rnn-luong"])
def test_bad_settings_and_missing_conditions_are_named(kind):
    with pytest.raises(UsageError, match="share_embeddings needs one vocabulary: source_vocab_size 12 != "
                                         "vocab_size 11"):
        _model(kind, share_embeddings=True)
    model = _model(kind)
    with pytest.raises(UsageError, match="condition=model.encode"):
        model.initial_state(2, 5)
    if kind.startswith("rnn"):
        with pytest.raises(UsageError, match="tie_weights needs embedding_dim = hidden_size = 16, got 8"):
            _model(kind, tie_weights=True, embedding_dim=8)
        return
    with pytest.raises(UsageError, match="longer than max_source_positions 8"):
        model.encode(tf.zeros([1, 9], tf.int32))


def test_attention_blocks_of_the_decoder_train_the_same_model():
    # attention_blocks=3 in the model section: stored in the config, and the decoder's causal self-attention
    # in blocks gives the logits and gradients of the whole target at once.
    from lmkit.models import build_model

    plain, blocked = _model(), _model(attention_blocks=3)
    assert "attention_blocks" not in plain.get_config()
    assert build_model(blocked.get_config()).decoder.layers[1].attention.attention_blocks == 3
    for mine, theirs in zip(blocked.variables, plain.variables):
        mine.assign(theirs)
    target = tf.constant([[START, 3, 4, 5, 6, 7, 8], [START, 7, 7, 2, 0, 0, 0]])
    results = []
    for model in (plain, blocked):
        with tf.GradientTape() as tape:
            logits, _ = model(target, condition=model.encode(tf.constant(SOURCES), tf.constant(MASK)), training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(target[:, 1:], logits[:, :-1]))
        results.append([logits] + [tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)])
    # The same products (skipped keys add exact zeros) summed in another order: float32 rounding, a few
    # eps (1.2e-7) of each value through two layers; 1e-5 relative and 1e-6 absolute.
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
