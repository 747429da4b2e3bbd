"""lmkit.layers.layouts: products by the decode loop's weight layouts compute what they replace."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from lmkit.decoding import BeamSampler, decode
from lmkit.layers import Linear, OutputProjection, WordEmbedder, layouts
from lmkit.layers.base import matmul_last_axis
from lmkit.models import build_model


class Holder(tf.Module):
    def __init__(self, **variables):
        super().__init__()
        for name, value in variables.items():
            setattr(self, name, value)


def test_the_copy_is_read_where_its_layout_is_the_faster_one():
    tall = tf.Variable(tf.random.normal([6, 3]))  # more rows than columns: a feed-forward's second kernel
    wide = tf.Variable(tf.random.normal([3, 6]))
    holder = Holder(tall=tall, wide=wide)
    assert layouts.stored_layout(tall, False, 1) is None  # outside the scope: nothing changes
    with layouts.decode_layouts(holder):
        np.testing.assert_array_equal(layouts.stored_layout(tall, False, 1).numpy(), tall.numpy().T)
        assert layouts.stored_layout(tall, False, 4) is None  # several rows: transpose_b is the slow one
        assert layouts.stored_layout(tall, False, None) is None
        assert layouts.stored_layout(wide, False, 1) is None  # its longer side is already contiguous
        for rows in (1, 4, None):  # used transposed (a tied projection): the copy at every batch size
            assert layouts.stored_layout(wide, True, rows) is not None
            assert layouts.stored_layout(tall, True, rows) is not None
        assert layouts.stored_layout(tf.constant(tall.numpy()), False, 1) is None  # not a variable
        assert layouts.stored_layout(tf.Variable(tf.ones([6, 3])), False, 1) is None  # not the module's
    assert layouts.stored_layout(tall, False, 1) is None
    with layouts.decode_layouts(holder, enabled=False):
        assert layouts.stored_layout(tall, False, 1) is None
    with layouts.decode_layouts(object()):  # a model from outside lmkit, without variables: no copies
        assert layouts.stored_layout(tall, False, 1) is None


def test_pays_only_for_xla_and_while_enabled(monkeypatch):
    steps = layouts.MIN_STEPS
    assert layouts.pays(False, steps) is False
    assert layouts.pays(True, steps) == (not tf.config.list_logical_devices("GPU"))
    assert layouts.pays(True, steps - 1) is False  # too short a loop to pay for its copies
    monkeypatch.setattr(layouts, "ENABLED", False)
    assert layouts.pays(True, steps) is False


@pytest.mark.parametrize("rows", [1, 3])
def test_products_in_the_scope_equal_the_plain_ones(rows):
    linear_tall = Linear(input_size=12, output_size=5, name="tall")
    linear_wide = Linear(input_size=5, output_size=12, name="wide")
    embedder = WordEmbedder(vocab_size=17, dim=5)
    tied = OutputProjection(dim=5, vocab_size=17, tied_embedder=embedder, use_bias=True)
    holder = Holder(a=linear_tall, b=linear_wide, c=tied)
    x12, x5 = tf.random.normal([rows, 12]), tf.random.normal([rows, 5])

    def products():
        return linear_tall(x12), linear_wide(x5), tied(x5), matmul_last_axis(x5[:, None, :], linear_wide.kernel)

    @tf.function(jit_compile=True)
    def scoped():
        with layouts.decode_layouts(holder):
            return products()

    for got, want in zip(scoped(), tf.function(products, jit_compile=True)()):
        assert got.shape == want.shape
        # The same float32 sums of at most 12 products in another order: a few ulps (6e-8 relative each)
        # apart on any CPU; 1e-5 leaves a hundredfold margin.
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def _model(kind: str):
    config = {"model": kind, "vocab_size": 29, "hidden_size": 16, "num_layers": 2, "num_heads": 2,
              "max_positions": 32, "init_scale": 0.8, "dropout": 0.0}
    return build_model(config)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("prompts", [[[3, 4, 5]], [[3], [4, 5, 6, 7], [8, 9]]], ids=["batch1", "batch3"])
def test_decoding_in_the_scope_gives_the_same_tokens(kind, prompts, monkeypatch):
    # gpt2 ties its projection (the copy at every batch size); llama's down projection is tall.
    entered = []
    scope = layouts.decode_layouts

    def spy(module, enabled=True):
        entered.append(enabled)
        return scope(module, enabled)

    monkeypatch.setattr(layouts, "decode_layouts", spy)
    results, first = {}, _model(kind)
    for on in (False, True):
        monkeypatch.setattr(layouts, "ENABLED", on)
        model = _model(kind)  # a fresh model (a fresh trace) with the same weights
        for mine, theirs in zip(model.variables, first.variables):
            mine.assign(theirs)
        results[on] = [decode(model, 30, prompts=prompts, seed=3)]
        if len(prompts) > 1:  # beam search multiplies several rows at any batch size: once is enough
            results[on].append(decode(model, 30, BeamSampler(beam_width=2), prompts=prompts))
    # the greedy loop (and the beam search), off then on
    assert entered == [False] * len(results[False]) + [True] * len(results[True])
    for off, on in zip(results[False], results[True]):
        np.testing.assert_array_equal(on.ids, off.ids)
        # The same tokens; each row's log-probability sums under 30 log-softmaxes whose logits differ by a few
        # ulps (the products above), so they agree to about 1e-6 relative: 1e-5 leaves a tenfold margin.
        np.testing.assert_allclose(on.log_probs, off.log_probs, rtol=1e-5, atol=1e-5)
