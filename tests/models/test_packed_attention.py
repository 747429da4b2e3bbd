"""Packed windows through whole models (GPT-2 with learned positions, the transformer with sinusoids, Llama with
rotary positions, grouped heads and a sliding window, Gemma): each example's logits are its own, eagerly and under
XLA, and a packed batch's loss per weighted token is the unpacked one."""
import numpy as np
import pytest
import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.data.chat import Example
from lmkit.data.packing import PackedBatches
from lmkit.models import build_model

MODELS = {
    "gpt2": dict(model="gpt2", vocab_size=40, hidden_size=16, num_layers=2, num_heads=2, max_positions=32,
                 tie_weights=True, output_bias=False),
    "sinusoid": dict(model="transformer", vocab_size=40, hidden_size=16, num_layers=2, num_heads=2, max_positions=32,
                     position_embedding="sinusoid", attention_blocks=2),
    "llama": dict(model="llama", vocab_size=40, hidden_size=16, num_layers=2, num_heads=4, num_kv_heads=2,
                  max_positions=32, sliding_window=6, layer_types=["sliding_attention", "full_attention"]),
    "gemma": dict(model="gemma", vocab_size=40, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                  head_dim=8, max_positions=32),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    tf.random.set_seed(7)
    return build_model(dict(MODELS[request.param]))


def _window(*examples, length=16):
    """ids and segment ids [1, length] of the examples one after the other, then padding."""
    ids = np.concatenate(examples + (np.zeros(length - sum(map(len, examples)), np.int32),))
    segments = np.concatenate([np.full(len(e), i + 1, np.int32) for i, e in enumerate(examples)] +
                              [np.zeros(length - sum(map(len, examples)), np.int32)])
    return ids[None].astype(np.int32), segments[None]


@pytest.mark.parametrize("compiled", [False, True], ids=["plain", "xla"])
def test_each_example_of_a_packed_window_gets_the_logits_it_gets_alone(model, compiled):
    rng = np.random.default_rng(0)
    first, second, third = (rng.integers(1, 40, n).astype(np.int32) for n in (5, 7, 3))
    call = (tf.function(lambda ids, segments: model(ids, segment_ids=segments)[0], jit_compile=True) if compiled
            else lambda ids, segments: model(ids, segment_ids=segments)[0])
    packed = call(*_window(first, second, third)).numpy()
    for start, example in [(0, first), (5, second), (12, third)]:
        alone = model(example[None])[0].numpy()
        np.testing.assert_allclose(packed[0, start:start + len(example)], alone[0], atol=1e-5)
    # another first example (and length) leaves the second's logits as they were
    changed = call(*_window(rng.integers(1, 40, 5).astype(np.int32), second, third)).numpy()
    np.testing.assert_allclose(changed[0, 5:12], packed[0, 5:12], atol=1e-6)
    assert not np.allclose(changed[0, :5], packed[0, :5], atol=1e-3)
    # positions given explicitly are the ones found from the segments
    ids, segments = _window(first, second, third)
    positions = np.concatenate([np.arange(5), np.arange(7), np.arange(3), np.zeros(1)])[None].astype(np.int32)
    np.testing.assert_allclose(model(ids, positions=positions, segment_ids=segments)[0], packed, atol=1e-6)


def _weighted_loss(logits, targets, weights):
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
    return float(tf.reduce_sum(losses * weights)), float(np.sum(weights))


def test_a_packed_batchs_loss_is_the_unpacked_loss(model):
    rng = np.random.default_rng(1)
    examples = []
    for _ in range(12):
        n = int(rng.integers(3, 10))
        weights = (rng.random(n) < 0.6).astype(np.uint8)
        weights[-1] = 1
        examples.append(Example(rng.integers(1, 40, n).astype(np.int32), weights))
    batches = PackedBatches(examples, batch_size=2, num_steps=16, epoch=0, seed=0)
    total = count = 0.0
    used = set()
    for i in range(len(batches)):
        rows = batches[i]
        logits, _ = model(rows.inputs, positions=rows.positions, segment_ids=rows.segment_ids)
        loss, tokens = _weighted_loss(logits, rows.targets, rows.weights)
        total, count = total + loss, count + tokens
        used.update(index for row in batches.groups[i] for index in row)
    alone_total = alone_count = 0.0
    for index in sorted(used):
        ids, weights = examples[index]
        logits, _ = model(ids[None, :-1])
        loss, tokens = _weighted_loss(logits, ids[None, 1:], weights[None, 1:].astype(np.float32))
        alone_total, alone_count = alone_total + loss, alone_count + tokens
    assert count == alone_count > 0
    np.testing.assert_allclose(total / count, alone_total / alone_count, rtol=1e-5, atol=1e-6)


def test_a_packed_window_with_a_decoding_state_is_refused(model):
    state = model.initial_state(1, 8)
    with pytest.raises(UsageError, match=r"positions and segment_ids describe a packed training window"):
        model(tf.zeros([1, 4], tf.int32), state, segment_ids=tf.ones([1, 4], tf.int32))
