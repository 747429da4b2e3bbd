"""The one attention module (every layout, causal with its cache or to a memory), against NumPy; the functions
it computes with are tested in test_attend.py."""

import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from lmkit.layers import Attention, RotaryEmbedding, add_lora
from lmkit.layers import attention as attention_module
from lmkit.models import build_model

from .reference import np_attention
from .test_attend import _score_elements


def _random(*shape, seed=0):
    return np.random.RandomState(seed).normal(size=shape).astype(np.float32)


def test_attention_matches_numpy(run):
    attention = Attention(dim=6, num_heads=3, fused="qkv", init_scale=0.5)
    x = _random(2, 4, 6)
    got, cache = run(attention, tf.constant(x))
    assert cache is None
    np.testing.assert_allclose(got, np_attention(attention, x), rtol=1e-4, atol=1e-5)


def test_attention_is_causal():
    attention = Attention(dim=4, num_heads=2, fused="qkv")
    x = _random(1, 5, 4)
    changed = x.copy()
    changed[:, 3:] += 1.0
    a, _ = attention(tf.constant(x))
    b, _ = attention(tf.constant(changed))
    np.testing.assert_allclose(a[:, :3], b[:, :3], rtol=1e-6)
    assert not np.allclose(a[:, 3:], b[:, 3:])


DIM, HEADS = 8, 2
SOURCE_LENGTHS = [5, 3]  # the second row padded


def _mask(lengths, time):
    return np.arange(time)[None, :] < np.array(lengths)[:, None]  # True = token


def test_memory_attention_alone_against_numpy():
    attention = Attention(dim=DIM, num_heads=HEADS, causal=False, fused="kv", init_scale=0.5)
    x, source, mask = _random(2, 3, DIM), _random(2, 5, DIM, seed=1), _mask(SOURCE_LENGTHS, 5)
    got = attention(tf.constant(x), memory=attention.memory(tf.constant(source)), mask=tf.constant(mask))[0].numpy()
    q = x @ attention.query.kernel.numpy() + attention.query.bias.numpy()
    kv = source @ attention.key_value.kernel.numpy() + attention.key_value.bias.numpy()
    k, v = kv[..., :DIM], kv[..., DIM:]
    heads = []
    for h in range(HEADS):
        part = slice(h * DIM // HEADS, (h + 1) * DIM // HEADS)
        scores = q[..., part] @ k[..., part].transpose(0, 2, 1) / np.sqrt(DIM // HEADS)
        scores = np.where(mask[:, None, :], scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        heads.append(probs @ v[..., part])
    expected = np.concatenate(heads, -1) @ attention.output.kernel.numpy() + attention.output.bias.numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_attention_blocks_give_the_values_and_gradients_of_one_block(dtype):
    x = tf.constant(_random(2, 12, 8))

    def values_and_gradients(blocks):
        tf.random.set_seed(3)
        attention = Attention(dim=8, num_heads=2, fused="qkv", init_scale=0.5, attention_blocks=blocks)
        with tf.GradientTape() as tape:
            tape.watch(x)
            out, _ = attention(tf.cast(x, dtype))
            loss = tf.reduce_sum(tf.cast(out, tf.float32) * tf.cos(tf.range(8, dtype=tf.float32)))
        grads = tape.gradient(loss, [x, *attention.trainable_variables])
        return [out.numpy().astype(np.float32)] + [g.numpy() for g in grads]

    one = values_and_gradients(1)
    # The same products (the skipped keys add exact zeros), summed in another order. float32: a sum of
    # up to 12 terms (the window) reordered, within 12 eps of its largest value. bfloat16: the key and
    # value gradients are sums of one bfloat16 part per query block, each rounded once: within
    # `blocks` eps. Measured on an AVX-512 CPU: 1.4e-7 (float32, 1.2 eps) and 6.5e-3 (bfloat16, 1.7 eps).
    for blocks in (3, 4):
        eps, terms = (2.0 ** -23, 12) if dtype == tf.float32 else (2.0 ** -8, blocks)
        for got, want in zip(values_and_gradients(blocks), one):
            assert np.max(np.abs(got - want)) <= terms * eps * np.max(np.abs(want))


def test_attention_blocks_skip_the_masked_keys():
    # The point of the blocks: fewer scores computed, 5/8 of the window's with 4 blocks.
    spec = tf.TensorSpec([2, 16, 8], tf.float32)
    counts = {}
    for blocks in (1, 4):
        attention = Attention(dim=8, num_heads=2, fused="qkv", attention_blocks=blocks)
        counts[blocks] = _score_elements(lambda x: attention(x)[0], spec)
    assert counts[1] == 2 * 2 * 16 * 16
    assert counts[4] == counts[1] * 5 // 8


def test_auto_attention_blocks_split_windows_from_1024_positions():
    # The default "auto": 4 blocks from windows of 1024 positions (measured faster there on an H100 and a
    # CPU), one below (the CPU configs' windows of 64-128 keep their program), one for unknown lengths.
    assert Attention(dim=8, num_heads=2, fused="qkv").attention_blocks == "auto"
    for_ = attention_module.attention_blocks_for
    assert [for_("auto", n) for n in (None, 1, 64, 1023, 1024, 4096)] == [1, 1, 1, 1, 4, 4]
    assert [for_(3, n) for n in (None, 2, 3, 1024)] == [1, 2, 3, 3]
    spec = [tf.TensorSpec([1, 1, length, 4], tf.float32) for length in (1023, 1024)]
    counts = [_score_elements(lambda q, k, v: attention_module.causal_attend(q, k, v, "auto", 0.0, False),
                              *[s] * 3) for s in spec]
    assert counts == [1023 * 1023, 1024 * 1024 * 5 // 8]
    assert Attention(dim=8, num_heads=2, fused="qkv", attention_blocks=np.int64(2)).attention_blocks == 2  # as before
    for bad in (0, -1, 2.0, "4", True, None):
        with pytest.raises(ValueError, match="attention_blocks .* must be a positive integer or \"auto\""):
            Attention(dim=8, num_heads=2, fused="qkv", attention_blocks=bad)


def test_attention_blocks_with_a_dynamic_window_and_a_cache():
    # A window of unknown length (one trace for every length) falls back to one block; a cached
    # call (generation) attends as before.
    tf.random.set_seed(4)
    blocked = Attention(dim=8, num_heads=2, fused="qkv", attention_blocks=4)
    tf.random.set_seed(4)
    plain = Attention(dim=8, num_heads=2, fused="qkv")
    dynamic = tf.function(lambda x: blocked(x)[0], input_signature=[tf.TensorSpec([None, None, 8], tf.float32)])
    # the same products summed in another order (graph vs eager, cache slots of exact zeros): a few eps
    for length in (3, 9):
        x = tf.constant(_random(1, length, 8, seed=length))
        np.testing.assert_allclose(dynamic(x), plain(x)[0], rtol=1e-5, atol=1e-6)
    x = tf.constant(_random(1, 6, 8, seed=5))
    cache = blocked.initial_cache(1, 8)
    got, _ = blocked(x, cache=cache, positions=tf.zeros([1], tf.int32))
    np.testing.assert_allclose(got, plain(x)[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="attention_blocks"):
        Attention(dim=8, num_heads=2, fused="qkv", attention_blocks=0)


def _grouped_memory_reference(attention, x, source, mask):
    """float64 NumPy: queries of x attend to the keys and values of source (kv heads shared by groups of
    query heads), the padded keys never, then the output projection."""
    heads, kv_heads, head_dim = attention.num_heads, attention.num_kv_heads, attention.head_dim
    q = (x @ attention.query.kernel.numpy()).reshape(*x.shape[:2], heads, head_dim).transpose(0, 2, 1, 3)
    k, v = ((source @ layer.kernel.numpy()).reshape(*source.shape[:2], kv_heads, head_dim).transpose(0, 2, 1, 3)
            for layer in (attention.key, attention.value))
    k, v = (np.repeat(t, heads // kv_heads, axis=1) for t in (k, v))
    scores = np.where(mask[:, None, None, :], np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(head_dim), -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    context = np.einsum("bhqk,bhkd->bhqd", probs / probs.sum(-1, keepdims=True), v)
    return context.transpose(0, 2, 1, 3).reshape(*x.shape[:2], heads * head_dim) @ attention.output.kernel.numpy()


def test_grouped_attention_to_a_padded_memory_against_numpy(run):
    # Not causal, separate projections, 4 query heads over 2 key/value heads, a padding mask per row.
    attention = Attention(dim=8, num_heads=4, num_kv_heads=2, head_dim=3, causal=False, qkv_bias=False,
                          output_bias=False, init_scale=0.5)
    x, source, mask = _random(2, 3, 8), _random(2, 5, 8, seed=1), _mask(SOURCE_LENGTHS, 5)
    got, cache = run(lambda x, s, m: attention(x, memory=attention.memory(s), mask=m), tf.constant(x),
                     tf.constant(source), tf.constant(mask))
    assert cache is None
    want = _grouped_memory_reference(attention, x.astype(np.float64), source.astype(np.float64), mask)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # Without a memory the inputs attend to themselves (an encoder): the memory of the inputs.
    alone, _ = attention(tf.constant(source), mask=tf.constant(mask))
    np.testing.assert_allclose(alone, _grouped_memory_reference(attention, source, source, mask), rtol=1e-5,
                               atol=1e-5)


def test_settings_that_need_causal_attention_or_a_memory_are_named():
    with pytest.raises(ValueError, match="need causal self-attention"):
        Attention(dim=8, num_heads=2, causal=False, sliding_window=4)
    with pytest.raises(ValueError, match="need causal self-attention"):
        Attention(dim=8, num_heads=2, causal=False, fused="qkv")
    with pytest.raises(ValueError, match="fused 'q' is not one of None, 'kv', 'qkv'"):
        Attention(dim=8, num_heads=2, fused="q")
    with pytest.raises(ValueError, match="num_heads 4 is not a multiple of num_kv_heads 3"):
        Attention(dim=8, num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="head_dim 2 differs from the attention's 4"):
        Attention(dim=8, num_heads=2, rotary=RotaryEmbedding(head_dim=2))
    causal, memory = Attention(dim=8, num_heads=2), Attention(dim=8, num_heads=2, causal=False)
    x = tf.zeros([1, 2, 8])
    with pytest.raises(ValueError, match="build it with causal=False to pass a memory or a mask"):
        causal(x, memory=memory.memory(x))
    with pytest.raises(ValueError, match="takes its keys and values as memory="):
        memory(x, cache=causal.initial_cache(1, 4), positions=tf.zeros([1], tf.int32))
    with pytest.raises(ValueError, match="memory\\(\\) needs keys and values projected apart"):
        Attention(dim=8, num_heads=2, fused="qkv").memory(x)


# --- every family attends with the one class, in its own variable layout -------------------------------------

_LAYOUT = os.path.join(os.path.dirname(__file__), "data", "checkpoint_layout.json")


def _layout():
    with open(_LAYOUT, encoding="utf-8") as f:
        return json.load(f)["models"]


def _attentions(model):
    """Every module of ``model`` whose attribute name says it attends: (path, module)."""
    return [(".".join(map(str, path)), module) for path, module in
            model._flatten(with_path=True, predicate=lambda m: isinstance(m, tf.Module))  # noqa: SLF001
            if str(path[-1]).endswith("attention")]


@pytest.mark.parametrize("kind", ["gpt2", "llama", "transformer_seq2seq"])
def test_every_family_attends_with_the_one_attention_class(kind):
    model = build_model(dict(_layout()[kind]["config"]))
    found = _attentions(model)
    assert found and all(type(module) is Attention for _, module in found), [(p, type(m)) for p, m in found]
    layouts = {(module.causal, module.fused, module.rotary is not None) for _, module in found}
    assert layouts == {"gpt2": {(True, "qkv", False)}, "llama": {(True, None, True)},
                       "transformer_seq2seq": {(True, "qkv", False), (False, "kv", False)}}[kind]


def _checkpoint_entries(model, directory):
    path = tf.train.Checkpoint(model=model).save(os.path.join(directory, "ckpt"))
    suffix = "/.ATTRIBUTES/VARIABLE_VALUE"
    return sorted([name[len("model/"):-len(suffix)], shape] for name, shape in tf.train.list_variables(path)
                  if name.startswith("model/") and name.endswith(suffix))


def _unescape(name):
    """A checkpoint key's path segment back to the attribute (or dict key) it names."""
    return re.sub(r"\.(.)", lambda m: {"S": "/", ".": "."}[m.group(1)], name)


def _old_layout_checkpoint(variables, directory):
    """A checkpoint with exactly the recorded entries (random values), as the models before wrote it."""
    root, values = tf.Module(), {}
    for name, shape in variables:
        node = root
        *parents, leaf = [_unescape(part) for part in name.split("/")]
        for part in parents:
            if not hasattr(node, part):
                setattr(node, part, tf.Module())
            node = getattr(node, part)
        values[name] = np.random.RandomState(len(values)).normal(size=shape).astype(np.float32)
        setattr(node, leaf, tf.Variable(values[name]))
    return tf.train.Checkpoint(model=root).save(os.path.join(directory, "old")), values


@pytest.mark.parametrize("kind", ["transformer", "gpt2", "llama", "qwen2", "transformer_seq2seq"])
def test_checkpoints_written_before_the_one_attention_restore(kind, tmp_path):
    """Checkpoints and Hugging Face weight maps follow attribute names: every model keeps the entries it
    wrote before its attention became :class:`Attention`, no more and no fewer, LoRA adapters included."""
    recorded = _layout()[kind]
    model = build_model(dict(recorded["config"]))
    assert _checkpoint_entries(model, str(tmp_path)) == recorded["variables"]
    path, values = _old_layout_checkpoint(recorded["variables"], str(tmp_path))
    tf.train.Checkpoint(model=model).restore(path).assert_consumed()
    # Every restored value sits where it was: the model, written again, holds the old checkpoint's values.
    reader = tf.train.load_checkpoint(tf.train.Checkpoint(model=model).save(str(tmp_path / "again")))
    for name, value in values.items():
        np.testing.assert_array_equal(reader.get_tensor(f"model/{name}/.ATTRIBUTES/VARIABLE_VALUE"), value)
    add_lora(model, rank=2, alpha=4.0, targets=model.lora_targets)
    assert _checkpoint_entries(model, str(tmp_path / "lora")) == recorded["lora_variables"]
