"""The language-model protocol of lmkit.models: every built-in language model honours it (shapes, cached steps,
reordered states, dropout only while training), built from a config's model section."""

import numpy as np
import pytest
import tensorflow as tf

from lmkit.config import TrainConfig
from lmkit.models import RNNLanguageModel, TransformerLanguageModel, build_model

VOCAB = 13
KINDS = ["lstm", "gru", "transformer"]


def _config(model, **overrides):
    values = dict(model=model, vocab_size=VOCAB, hidden_size=8, num_layers=2, init_scale=0.3, dropout=0.0,
                  batch_size=4, num_steps=6, num_epochs=1, learning_rate=1.0, max_grad_norm=5.0,
                  num_heads=2, max_positions=16)
    values.update(overrides)
    return TrainConfig.from_dict(values)


def _ids(batch, time, seed=0):
    return tf.constant(np.random.RandomState(seed).randint(0, VOCAB, size=(batch, time)).astype(np.int32))


@pytest.mark.parametrize("kind", KINDS)
def test_protocol_shapes(kind):
    model = build_model(_config(kind).model_config())
    logits, state = model(_ids(3, 5))
    assert logits.shape == (3, 5, VOCAB) and logits.dtype == tf.float32
    state = model.initial_state(3, max_length=8)
    assert all(t.shape[0] == 3 for t in tf.nest.flatten(state))
    step_logits, state = model.step(_ids(3, 1)[:, 0], state)
    assert step_logits.shape == (3, VOCAB)
    reordered = model.reorder_state(state, tf.constant([2, 2, 0, 1]))
    assert all(t.shape[0] == 4 for t in tf.nest.flatten(reordered))


@pytest.mark.parametrize("kind", KINDS)
def test_step_with_reorder_state_equals_full_pass(run, kind):
    model = build_model(_config(kind).model_config())
    ids = _ids(3, 7)
    order = tf.constant([2, 0, 2, 1])
    # The full pass over the reordered rows.
    want, _ = model(tf.gather(ids, order))

    def decode(ids):
        # Three steps on the original rows, reorder (beam search), four more steps.
        state = model.initial_state(3, max_length=7)
        logits = []
        for t in range(3):
            step_logits, state = model.step(ids[:, t], state)
            logits.append(tf.gather(step_logits, order))
        state = model.reorder_state(state, order)
        reordered_ids = tf.gather(ids, order)
        for t in range(3, 7):
            step_logits, state = model.step(reordered_ids[:, t], state)
            logits.append(step_logits)
        return tf.stack(logits, axis=1)

    np.testing.assert_allclose(run(decode, ids), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_dropout_only_while_training(kind):
    model = build_model(_config(kind, dropout=0.5).model_config())
    ids = _ids(2, 5)
    np.testing.assert_array_equal(model(ids)[0], model(ids, training=False)[0])
    assert not np.allclose(model(ids, training=True)[0], model(ids)[0])


@pytest.mark.parametrize("kind", KINDS)
def test_tie_weights_shares_the_table(kind):
    tied = build_model(_config(kind, tie_weights=True).model_config())
    untied = build_model(_config(kind).model_config())
    assert tied.projection.tied_embedder is tied.embedder
    assert len(tied.trainable_variables) == len(untied.trainable_variables) - 1
    names = [v.name for v in tied.trainable_variables]
    assert len(names) == len(set(names))


def test_model_argument_errors():
    with pytest.raises(ValueError, match="embedding_dim 5 must equal hidden_size 8 when tie_weights=True"):
        RNNLanguageModel(vocab_size=VOCAB, hidden_size=8, embedding_dim=5, tie_weights=True)
    with pytest.raises(ValueError, match="embedding_dim 5 must be 0 or hidden_size 8 for the transformer"):
        TransformerLanguageModel(vocab_size=VOCAB, hidden_size=8, embedding_dim=5)
    with pytest.raises(ValueError, match="position_embedding 'rotary' is not one of learned, sinusoid"):
        TransformerLanguageModel(vocab_size=VOCAB, hidden_size=8, position_embedding="rotary")
    model = TransformerLanguageModel(vocab_size=VOCAB, hidden_size=8, num_heads=2, max_positions=4)
    with pytest.raises(ValueError, match="ids have 5 time steps but max_positions is 4"):
        model(_ids(1, 5))
    with pytest.raises(ValueError, match="max_length 5 exceeds max_positions 4"):
        model.initial_state(1, max_length=5)


def test_training_accepts_python_bools_in_separate_functions():
    model = build_model(_config("lstm", dropout=0.5).model_config())
    ids = _ids(2, 4)
    train = tf.function(lambda ids: model(ids, training=True)[0])
    evaluate = tf.function(lambda ids: model(ids, training=False)[0])
    np.testing.assert_allclose(evaluate(ids), model(ids)[0], rtol=1e-6)
    assert not np.allclose(train(ids), evaluate(ids))


