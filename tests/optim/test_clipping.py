"""Gradient clipping against NumPy, with IndexedSlices (duplicate indices) and None."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from lmkit import optim
from tests.optim import reference as ref

EMB_SHAPE = (5, 2)
INDICES = np.array([0, 3, 3, 1, 3])  # row 3 appears three times


def make_grads(scale: float):
    rng = np.random.default_rng(3)
    dense_a = scale * rng.standard_normal((3, 4))
    values = scale * rng.standard_normal((len(INDICES), EMB_SHAPE[1]))
    dense_b = scale * rng.standard_normal((2,))
    numpy_grads = [dense_a, ref.densify(values, INDICES, EMB_SHAPE), None, dense_b]

    def tf_grads():
        return [tf.constant(dense_a, tf.float32),
                tf.IndexedSlices(tf.constant(values, tf.float32), tf.constant(INDICES),
                                 tf.constant(EMB_SHAPE)),
                None,
                tf.constant(dense_b, tf.float32)]

    return numpy_grads, tf_grads


def to_numpy(grads):
    out = []
    for g in grads:
        if g is None:
            out.append(None)
        elif isinstance(g, tf.IndexedSlices):
            out.append(tf.convert_to_tensor(g).numpy())
        else:
            out.append(g.numpy())
    return out


def compare(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if w is None:
            assert g is None
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)


def run(fn, mode):
    return tf.function(fn)() if mode == "function" else fn()


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("max_norm", [0.5, 1e3])  # clipped, untouched
def test_clip_by_global_norm(mode, max_norm):
    numpy_grads, tf_grads = make_grads(scale=1.0)
    want, want_norm = ref.clip_global(numpy_grads, max_norm)
    clipped, norm = run(lambda: optim.clip_by_global_norm(tf_grads(), max_norm), mode)
    assert isinstance(clipped[1], tf.IndexedSlices), "sparse gradients stay sparse"
    np.testing.assert_allclose(float(norm), want_norm, rtol=1e-6)
    compare(to_numpy(clipped), want)
    if max_norm < want_norm:
        got_norm = np.sqrt(sum(np.sum(g ** 2) for g in to_numpy(clipped) if g is not None))
        np.testing.assert_allclose(got_norm, max_norm, rtol=1e-5)


def test_duplicate_indices_count_as_one_summed_row():
    """tf.clip_by_global_norm measures the raw values; lmkit measures the dense gradient."""
    numpy_grads, tf_grads = make_grads(scale=1.0)
    slices = tf_grads()[1]
    want = np.linalg.norm(numpy_grads[1])
    raw = np.linalg.norm(slices.values.numpy())
    assert abs(raw - want) > 1e-3  # the test data makes the difference visible
    np.testing.assert_allclose(float(optim.gradient_norm(slices)), want, rtol=1e-6)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_clip_by_layer_norm(mode):
    numpy_grads, tf_grads = make_grads(scale=1.0)
    norms = [None if g is None else np.linalg.norm(g) for g in numpy_grads]
    limit = float(np.median([n for n in norms if n is not None]))  # some clipped, some not
    want = ref.clip_per_layer(numpy_grads, limit)
    got = run(lambda: optim.clip_by_layer_norm(tf_grads(), limit), mode)
    assert isinstance(got[1], tf.IndexedSlices)
    compare(to_numpy(got), want)
    assert sum(n > limit for n in norms if n is not None) >= 1
    assert sum(n < limit for n in norms if n is not None) >= 1


@pytest.mark.parametrize("per_layer, global_max", [(0.0, 0.0), (0.0, 1.0), (0.8, 0.0), (0.8, 1.0)])
def test_clip_gradients_applies_the_config(per_layer, global_max):
    numpy_grads, tf_grads = make_grads(scale=1.0)
    want = numpy_grads
    _, want_norm = ref.clip_global(numpy_grads, 1.0)
    if per_layer:
        want = ref.clip_per_layer(want, per_layer)
    if global_max:
        want, _ = ref.clip_global(want, global_max)
    got, norm = optim.clip_gradients(tf_grads(), max_grad_norm=global_max,
                                     max_grad_norm_per_layer=per_layer)
    np.testing.assert_allclose(float(norm), want_norm, rtol=1e-6)  # norm before clipping
    compare(to_numpy(got), want)


def test_non_finite_norm_poisons_every_gradient():
    grads = [tf.constant([1.0, np.inf]), tf.constant([2.0])]
    clipped, norm = optim.clip_by_global_norm(grads, 1.0)
    assert not np.isfinite(float(norm))
    assert all(np.all(np.isnan(g.numpy())) for g in clipped)


def test_bad_limits():
    with pytest.raises(ValueError, match="max_norm"):
        optim.clip_by_global_norm([tf.ones([2])], 0.0)
    with pytest.raises(ValueError, match="max_grad_norm_per_layer"):
        optim.clip_gradients([tf.ones([2])], max_grad_norm_per_layer=-1.0)


def test_sparse_norm_and_update_compile_with_xla():
    """jit_compile=True train steps (TrainConfig.jit_compile) may clip sparse gradients."""
    numpy_grads, tf_grads = make_grads(scale=1.0)
    emb = tf.Variable(tf.zeros(EMB_SHAPE))
    opt = optim.LARC(optim.SGD(learning_rate=0.1), larc_eta=1.0, larc_mode="scale")
    opt.build([emb])

    @tf.function(jit_compile=True)
    def step():
        clipped, norm = optim.clip_gradients(tf_grads(), max_grad_norm=0.5)
        opt.apply_gradients([(clipped[1], emb)])
        return norm

    norm = step()
    np.testing.assert_allclose(float(norm), ref.clip_global(numpy_grads, 1.0)[1], rtol=1e-5)
    # LARC(scale) on a zero variable: factor = min_update, so the step is tiny but not zero
    want = -0.1 * 1e-7 * ref.clip_global(numpy_grads, 0.5)[0][1]
    np.testing.assert_allclose(emb.numpy(), want, rtol=1e-4, atol=1e-12)


def test_summed_rows_does_its_index_arithmetic_in_int64():
    # On a GPU TensorFlow keeps int32 tensors in host memory: int32 index arithmetic in the
    # step would copy to the host and back. Every integer op of summed_rows is int64.
    from lmkit.optim.clipping import summed_rows

    values = tf.constant(np.arange(10, dtype=np.float32).reshape(5, 2))
    fn = tf.function(lambda v, i: summed_rows(tf.IndexedSlices(v, i, tf.constant(EMB_SHAPE))))
    graph = fn.get_concrete_function(values, tf.constant(INDICES, tf.int32)).graph
    # (the sort's permutation is int32 by definition of TopKV2; everything after it is not)
    arithmetic = {"GatherV2", "ConcatV2", "Sub", "NotEqual", "Cumsum",
                  "UnsortedSegmentSum", "StridedSlice", "Neg"}
    int32 = [op.name for op in graph.get_operations() if op.type in arithmetic
             and any(t.dtype == tf.int32 and t.shape.rank != 0 for t in op.outputs)]
    assert not int32, f"int32 index arithmetic: {int32}"
    got = fn(values, tf.constant(INDICES, tf.int32)).numpy()
    dense = ref.densify(values.numpy(), INDICES, EMB_SHAPE)
    np.testing.assert_allclose(np.linalg.norm(got), np.linalg.norm(dense), rtol=1e-6)
