"""LoRA adapters: a NumPy reference, frozen bases, optimizer slots, merging, mixed precision and XLA."""

import numpy as np
import pytest
import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.layers import Linear, LoRAAdapter, add_lora, frozen, merge_lora, precision
from lmkit.layers.lora import linear_layers, lora_of
from lmkit.models import build_model

LLAMA = dict(model="llama", vocab_size=40, hidden_size=16, num_layers=2, num_heads=4, num_kv_heads=2,
             max_positions=16)
GPT2 = dict(model="gpt2", vocab_size=40, hidden_size=16, num_layers=2, num_heads=2, max_positions=16)
IDS = tf.constant(np.random.RandomState(0).randint(0, 40, (2, 7)), tf.int32)


def _random(*shape, seed=0):
    return np.random.RandomState(seed).normal(size=shape).astype(np.float32)


def _adapted(config=LLAMA, targets=("query", "value"), rank=4, alpha=8.0, dropout=0.0):
    tf.random.set_seed(1)
    with frozen():
        model = build_model(config)
    lora = add_lora(model, rank=rank, alpha=alpha, dropout=dropout, targets=targets)
    return model, lora


def _train_b(lora, seed=5):
    """B as after some training (it starts at zero)."""
    for i, adapter in enumerate(lora.adapters.values()):
        adapter.b.assign(_random(*adapter.b.shape, seed=seed + i))


def test_adapted_linear_equals_numpy():
    linear = Linear(input_size=6, output_size=5, name="linear")
    adapter = LoRAAdapter(input_size=6, output_size=5, rank=3, alpha=6.0, name="lora")
    adapter.b.assign(_random(3, 5, seed=1))
    linear.adapter = adapter
    x = _random(2, 4, 6, seed=2)
    expected = (x @ linear.kernel.numpy() + linear.bias.numpy()
                + (6.0 / 3) * x @ adapter.a.numpy() @ adapter.b.numpy())
    np.testing.assert_allclose(linear(tf.constant(x)).numpy(), expected, rtol=1e-5, atol=1e-5)
    # A starts as PEFT's: uniform within 1/sqrt(fan_in); B at zero.
    a = adapter.a.numpy()
    assert np.abs(a).max() <= 1 / np.sqrt(6) and a.std() > 0.1 / np.sqrt(6)
    assert not np.any(LoRAAdapter(input_size=6, output_size=5, rank=3, alpha=1.0).b.numpy())


@pytest.mark.parametrize("config,targets,count", [(LLAMA, ("query", "value"), 4),
                                                  (LLAMA, ("query", "key", "value", "output", "gate", "up",
                                                           "down"), 14),
                                                  (GPT2, ("qkv",), 2), (GPT2, ("ffn_inner", "output"), 4)])
def test_only_adapters_train_and_the_start_equals_the_base(config, targets, count):
    tf.random.set_seed(1)
    with frozen():
        base = build_model(config)
    before, _ = base(IDS)
    assert base.trainable_variables == ()
    lora = add_lora(base, rank=2, alpha=4.0, targets=targets)
    assert len(lora.adapters) == count and lora_of(base) is lora
    assert {v.ref() for v in base.trainable_variables} == {v.ref() for v in lora.variables}
    assert len(base.trainable_variables) == 2 * count
    after, _ = base(IDS)
    np.testing.assert_array_equal(before.numpy(), after.numpy())  # B = 0: the base's function
    # Each adapter sits on a layer of a target's name.
    adapted = {layer.name for _, layer in linear_layers(base) if layer.adapter is not None}
    assert adapted == set(targets)


def test_optimizer_slots_and_gradients_only_for_adapters():
    model, lora = _adapted()
    _train_b(lora)
    frozen_values = {v.ref(): v.numpy().copy() for v in model.variables if not v.trainable}
    optimizer = tf.keras.optimizers.Adam(0.01)
    variables = list(model.trainable_variables)
    optimizer.build(variables)
    slots = [v for v in optimizer.variables if len(v.shape) > 0]
    assert sum(v.shape.num_elements() for v in slots) == 2 * lora.num_parameters()
    with tf.GradientTape() as tape:
        logits, _ = model(IDS, training=True)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(IDS, logits))
    grads = tape.gradient(loss, variables)
    assert all(g is not None and np.any(g.numpy()) for g in grads)
    optimizer.apply_gradients(zip(grads, variables))
    for v in model.variables:
        if not v.trainable:
            np.testing.assert_array_equal(v.numpy(), frozen_values[v.ref()], err_msg=v.name)


def test_merge_keeps_the_function_and_removes_the_adapters():
    model, lora = _adapted(targets=("query", "key", "value", "output", "gate", "up", "down"))
    _train_b(lora)
    adapted, _ = model(IDS)
    count = merge_lora(model)
    assert count == 14 and lora_of(model) is None
    assert all(layer.adapter is None for _, layer in linear_layers(model))
    merged, _ = model(IDS)
    np.testing.assert_allclose(merged.numpy(), adapted.numpy(), rtol=1e-4, atol=1e-5)
    assert merge_lora(model) == 0


def test_adapters_checkpoint_alone_and_load_on_a_base(tmp_path):
    model, lora = _adapted()
    _train_b(lora)
    expected, _ = model(IDS)
    path = tf.train.Checkpoint(model=lora).save(str(tmp_path / "ckpt"))
    saved = [name for name, _ in tf.train.list_variables(path) if name.startswith("model/")]
    assert len(saved) == 2 * len(lora.adapters)
    assert all("/adapters/" in name for name in saved), saved
    twin, twin_lora = _adapted()  # the same base (same seed), fresh adapters
    for a, b in zip(twin.variables, model.variables):
        if not b.trainable:
            a.assign(b)
    tf.train.Checkpoint(model=twin_lora).read(path).assert_existing_objects_matched()
    np.testing.assert_allclose(twin(IDS)[0].numpy(), expected.numpy(), rtol=1e-6, atol=1e-6)


def test_dropout_acts_only_while_training():
    model, lora = _adapted(dropout=0.5)
    _train_b(lora)
    one, _ = model(IDS)
    two, _ = model(IDS)
    np.testing.assert_array_equal(one.numpy(), two.numpy())
    trained, _ = model(IDS, training=True)
    assert not np.allclose(trained.numpy(), one.numpy())


def test_compiled_and_bfloat16_passes():
    model, lora = _adapted()
    _train_b(lora)
    eager, _ = model(IDS)
    compiled = tf.function(lambda ids: model(ids)[0], jit_compile=True)(IDS)
    np.testing.assert_allclose(compiled.numpy(), eager.numpy(), rtol=1e-4, atol=1e-4)
    with precision.scope("mixed_bfloat16"):
        half, _ = model(IDS)
    assert half.dtype == tf.float32
    np.testing.assert_allclose(half.numpy(), eager.numpy(), atol=0.1)


def test_bad_targets_and_settings_are_named():
    with frozen():
        model = build_model(LLAMA)
    with pytest.raises(UsageError, match=r"q_proj name\(s\) no linear layer .*down, gate, key, output, query, "
                                         r"up, value"):
        add_lora(model, rank=2, alpha=4.0, targets=("query", "q_proj"))
    with pytest.raises(UsageError, match="lora_targets is empty"):
        add_lora(model, rank=2, alpha=4.0, targets=(" ",))
    with pytest.raises(UsageError, match="lora_rank"):
        add_lora(model, rank=0, alpha=4.0)
    add_lora(model, rank=2, alpha=4.0)
    with pytest.raises(UsageError, match="already has LoRA adapters"):
        add_lora(model, rank=2, alpha=4.0)
