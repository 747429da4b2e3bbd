"""The slots' compiled parts: a prompt fed in chunks gives the model's own logits, rows that do not decode keep
their place, and each row samples as the samplers do for that row of a batch."""
import numpy as np
import pytest
import tensorflow as tf

from lmkit.decoding.samplers import TopPSampler
from lmkit.serve.slots import SlotModel


@pytest.fixture(scope="module")
def model(run_dir):
    from lmkit.decoding.source import load_generator
    return load_generator(run_dir).model


def test_a_prompt_fed_in_chunks_gives_the_models_logits_and_steps_keep_idle_rows(model):
    slots = SlotModel(model, 3, 64, 5)
    ids = list(np.random.RandomState(0).randint(0, model.vocab_size, 23))
    expected, _ = model(tf.constant([ids]), None)
    done, logits = 0, None
    while logits is None:
        done, logits = slots.prefill(1, ids, done)
    np.testing.assert_allclose(logits.numpy(), expected.numpy()[0, -1], atol=1e-4)
    assert slots.state.positions.numpy().tolist() == [0, 23, 0]
    step_logits, greedy = slots.step(np.array([0, ids[0], 0], np.int32), np.array([False, True, False]))
    assert slots.state.positions.numpy().tolist() == [0, 24, 0]
    more, _ = model(tf.constant([ids + [ids[0]]]), None)
    np.testing.assert_allclose(step_logits.numpy()[1], more.numpy()[0, -1], atol=1e-4)
    assert greedy[1] == int(np.argmax(more.numpy()[0, -1]))


def test_each_row_samples_as_its_row_of_a_batch(model):
    slots = SlotModel(model, 4, 64, 4)
    logits = tf.random.stateless_normal([4, model.vocab_size], [1, 2])
    batch = TopPSampler(p=0.9, temperature=0.7).get_next_token(logits, 5, tf.constant([11, 5], tf.int64))
    picked = slots.sample(logits, [2, 0], [0.7, 0.7], [[11, 5, 2], [11, 5, 0]], 0.9, None)
    assert picked.tolist() == [int(batch[2]), int(batch[0])]


def test_prompts_that_join_together_go_in_one_call_as_each_would_alone(model):
    slots = SlotModel(model, 6, 64, 16)  # rows of a call: 1, 4 or 6; 32 tokens (rows x size) at most
    rng = np.random.RandomState(1)
    prompts = {slot: list(rng.randint(0, model.vocab_size, n)) for slot, n in ((4, 5), (0, 7), (2, 3))}
    fed = slots.prefill_many([(slot, ids, 0) for slot, ids in prompts.items()])  # 4 rows x 8 tokens: one call
    assert [done for done, _ in fed] == [5, 7, 3]
    for (slot, ids), (_, logits) in zip(prompts.items(), fed):
        alone, _ = model(tf.constant([ids]), None)
        np.testing.assert_allclose(logits.numpy(), alone.numpy()[0, -1], atol=1e-4)
    assert slots.state.positions.numpy().tolist() == [7, 0, 3, 0, 5, 0]  # the others' rows untouched
    # Past the budget the first prompts go in and the rest wait for the next call.
    five = [(slot, [1, 2, 3], 0) for slot in range(5)]  # 6 rows x 8 > 32: 4 fit
    assert len(slots.prefill_many(five)) == 4
    long_first = [(1, list(range(20)), 0), (3, [1, 2], 0)]  # 16 tokens of the first: 4 rows x 16 > 32
    assert [(done, logits) for done, logits in slots.prefill_many(long_first)] == [(16, None)]
    assert (4, 8) in slots.prefill_shapes() and (6, 8) not in slots.prefill_shapes()
