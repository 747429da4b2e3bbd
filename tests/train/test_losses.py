"""sequence_softmax_cross_entropy against a NumPy reference of Texar's semantics."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.train.losses import sequence_softmax_cross_entropy, sparse_softmax_cross_entropy, window_loss
from tests.layers.conftest import _seeded, run  # noqa: F401 (pytest fixtures: seeds; eager and compiled runs)

BATCH, TIME, VOCAB = 3, 4, 6
RNG = np.random.RandomState(0)
LOGITS = RNG.normal(scale=2.0, size=(BATCH, TIME, VOCAB)).astype(np.float32)
LABELS = RNG.randint(0, VOCAB, size=(BATCH, TIME)).astype(np.int32)
LENGTHS = np.array([4, 2, 0], np.int32)
MASK = np.array([[1, 0, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]], np.float32)


def np_loss(labels, logits, sequence_length=None, mask=None, average_across_batch=True,
            average_across_timesteps=False, sum_over_batch=False, sum_over_timesteps=True):
    logits = logits.astype(np.float64)
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    if labels.ndim == 2:
        losses = -np.take_along_axis(log_probs, labels[..., None].astype(np.int64), -1)[..., 0]
    else:
        losses = -(labels * log_probs).sum(-1)
    weights = np.ones_like(losses)
    if sequence_length is not None:
        weights *= np.arange(losses.shape[1])[None, :] < sequence_length[:, None]
    if mask is not None:
        weights *= mask
    losses = losses * weights
    if sum_over_timesteps:
        losses = losses.sum(1)
    elif average_across_timesteps:
        if sequence_length is None and mask is None:
            losses = losses.mean(1)
        else:
            count = weights.sum(1)
            losses = np.where(count > 0, losses.sum(1) / np.maximum(count, 1e-30), 0.0)
    if sum_over_batch:
        losses = losses.sum(0)
    elif average_across_batch:
        losses = losses.mean(0)
    return losses


TIME_MODES = {"keep": {}, "average": {"average_across_timesteps": True}, "sum": {"sum_over_timesteps": True}}
BATCH_MODES = {"keep": {}, "average": {"average_across_batch": True}, "sum": {"sum_over_batch": True}}
MASKS = {"none": {}, "lengths": {"sequence_length": LENGTHS}, "mask": {"mask": MASK},
         "both": {"sequence_length": LENGTHS, "mask": MASK}}


@pytest.mark.parametrize("time_mode,batch_mode", list(itertools.product(TIME_MODES, BATCH_MODES)))
@pytest.mark.parametrize("masking", list(MASKS))
def test_matches_numpy(run, time_mode, batch_mode, masking):
    options = {"average_across_batch": False, "average_across_timesteps": False,
               "sum_over_batch": False, "sum_over_timesteps": False}
    options.update(TIME_MODES[time_mode])
    options.update(BATCH_MODES[batch_mode])
    masks = MASKS[masking]
    tensors = {k: tf.constant(v) for k, v in masks.items()}
    got = run(lambda labels, logits: sequence_softmax_cross_entropy(labels, logits, **tensors, **options),
              tf.constant(LABELS), tf.constant(LOGITS))
    want = np_loss(LABELS, LOGITS, **masks, **options)
    assert got.dtype == tf.float32
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_default_is_sum_over_time_mean_over_batch():
    got = sequence_softmax_cross_entropy(LABELS, LOGITS)
    np.testing.assert_allclose(got, np_loss(LABELS, LOGITS).item(), rtol=1e-6)
    assert got.shape == ()


def test_fully_masked_row_averages_to_zero_not_nan():
    got = sequence_softmax_cross_entropy(LABELS, LOGITS, sequence_length=LENGTHS, average_across_batch=False,
                                         average_across_timesteps=True, sum_over_timesteps=False)
    assert got.numpy()[2] == 0.0 and np.all(np.isfinite(got))


def test_masked_steps_with_nan_logits_do_not_poison_the_loss():
    logits = LOGITS.copy()
    logits[1, 3] = np.nan
    got = sequence_softmax_cross_entropy(LABELS, logits, sequence_length=LENGTHS)
    np.testing.assert_allclose(got, np_loss(LABELS, LOGITS, sequence_length=LENGTHS), rtol=1e-5)


def test_distribution_labels(run):
    labels = np.random.RandomState(1).dirichlet(np.ones(VOCAB), size=(BATCH, TIME)).astype(np.float32)
    got = run(lambda a, b: sequence_softmax_cross_entropy(a, b, average_across_timesteps=True,
                                                          sum_over_timesteps=False),
              tf.constant(labels), tf.constant(LOGITS))
    want = np_loss(labels, LOGITS, average_across_timesteps=True, sum_over_timesteps=False)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_half_precision_logits_use_float32_softmax():
    logits16 = tf.constant(LOGITS * 8, tf.float16)
    got = sequence_softmax_cross_entropy(LABELS, logits16)
    assert got.dtype == tf.float32
    want = np_loss(LABELS, np.asarray(logits16.numpy(), np.float32))
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_gradient_flows_to_logits():
    logits = tf.Variable(LOGITS)
    with tf.GradientTape() as tape:
        loss = sequence_softmax_cross_entropy(LABELS, logits, sequence_length=LENGTHS)
    grad = tape.gradient(loss, logits).numpy()
    # Each row's gradient is (softmax - onehot) / batch on unmasked steps, zero elsewhere.
    probs = np.exp(LOGITS) / np.exp(LOGITS).sum(-1, keepdims=True)
    want = (probs - np.eye(VOCAB)[LABELS]) / BATCH
    want *= (np.arange(TIME)[None, :] < LENGTHS[:, None])[..., None]
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-6)


def test_incompatible_options():
    with pytest.raises(ValueError, match="average_across_timesteps and sum_over_timesteps are both True"):
        sequence_softmax_cross_entropy(LABELS, LOGITS, average_across_timesteps=True)
    with pytest.raises(ValueError, match="average_across_batch and sum_over_batch are both True"):
        sequence_softmax_cross_entropy(LABELS, LOGITS, sum_over_batch=True)
    with pytest.raises(ValueError, match=r"logits have shape \(3, 6\) but must be \[batch, time, vocab\]"):
        sequence_softmax_cross_entropy(LABELS, LOGITS[:, 0])
    with pytest.raises(ValueError, match=r"integer labels have shape \(3,\)"):
        sequence_softmax_cross_entropy(LABELS[:, 0], LOGITS)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_window_loss_and_its_gradient_against_torchs_cross_entropy(run, reduction):
    """"mean" is PyTorch's (and nanoGPT's) F.cross_entropy over every position; "sum" is TIME times it, and
    so is its gradient: the factor that max_grad_norm sees."""
    torch = pytest.importorskip("torch")
    logits = tf.Variable(LOGITS)
    loss, grad = run(lambda: _value_and_gradient(lambda: window_loss(LABELS, logits, reduction), logits))
    t_logits = torch.tensor(LOGITS.astype(np.float64), requires_grad=True)
    t_loss = torch.nn.functional.cross_entropy(t_logits.reshape(-1, VOCAB), torch.tensor(LABELS.reshape(-1)).long())
    t_loss.backward()
    factor = TIME if reduction == "sum" else 1
    np.testing.assert_allclose(loss, factor * t_loss.item(), rtol=1e-5)
    np.testing.assert_allclose(grad, factor * t_logits.grad.numpy(), rtol=1e-4, atol=1e-7)


def _value_and_gradient(loss_fn, variable):
    with tf.GradientTape() as tape:
        loss = loss_fn()
    return loss, tape.gradient(loss, variable)


def test_window_loss_names_an_unknown_reduction():
    with pytest.raises(UsageError, match="loss_reduction = 'average' is not one of sum, mean"):
        window_loss(LABELS, LOGITS, "average")


def np_sparse_xent(labels, logits):
    """float64 reference: logsumexp(logits) - logits[label] per row, and softmax - onehot."""
    x = logits.astype(np.float64)
    top = x.max(-1, keepdims=True)
    lse = top[..., 0] + np.log(np.exp(x - top).sum(-1))
    picked = np.take_along_axis(x, labels[..., None].astype(np.int64), -1)[..., 0]
    probs = np.exp(x - lse[..., None])
    return lse - picked, probs - np.eye(x.shape[-1])[labels]


@pytest.mark.parametrize("scale", [1.0, 40.0, 400.0])  # 40, 400: some label probabilities underflow
def test_sparse_softmax_cross_entropy_values_and_gradient(run, scale):
    rng = np.random.RandomState(int(scale))
    logits = (rng.normal(size=(2, 5, 7, 50)) * scale).astype(np.float32)  # any leading shape
    labels = rng.randint(0, 50, size=(2, 5, 7)).astype(np.int64)
    weights = rng.uniform(size=labels.shape).astype(np.float32)  # a different upstream gradient per row

    def loss_and_grad(y, x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            losses = sparse_softmax_cross_entropy(y, x)
            total = tf.reduce_sum(losses * weights)
        return losses, tape.gradient(total, x)

    losses, grad = run(loss_and_grad, tf.constant(labels), tf.constant(logits))
    want_losses, want_grad = np_sparse_xent(labels, logits)
    assert losses.shape == labels.shape and losses.dtype == tf.float32
    if scale > 1:
        assert want_losses.max() > 87.0  # losses whose label probability underflows float32
    np.testing.assert_allclose(losses, want_losses, rtol=2e-6, atol=2e-5 * max(1.0, scale / 40))
    np.testing.assert_allclose(grad, want_grad * weights[..., None], rtol=1e-4, atol=1e-6)
    # ... and the same as TensorFlow's fused kernel.
    fused = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    np.testing.assert_allclose(losses, fused, rtol=1e-6, atol=1e-4 * max(1.0, scale / 40))


def test_sparse_softmax_cross_entropy_infinite_logits():
    logits = np.zeros((2, 3), np.float32)
    logits[0, 1] = -np.inf  # an impossible label: infinite loss, as from the fused kernel
    got = sparse_softmax_cross_entropy(np.array([1, 2]), logits).numpy()
    assert got[0] == np.inf
    np.testing.assert_allclose(got[1], np.log(3.0), rtol=1e-6)  # three equal logits


def test_sparse_softmax_cross_entropy_rejects_labels_out_of_range():
    with pytest.raises(tf.errors.InvalidArgumentError, match="not in"):
        sparse_softmax_cross_entropy(np.array([0, 6]), np.zeros((2, 6), np.float32))
