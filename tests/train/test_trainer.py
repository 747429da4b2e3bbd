"""The trainer in one process: learning, exact resume, non-finite stop, model dir checks."""
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from lmkit import distributed as dist
from lmkit.config import TrainConfig
from lmkit.core.errors import CheckpointError, NonFiniteError, UsageError
from lmkit.models import build_model
from lmkit.train import Trainer
from tests.scripts.gradient_bomb import GradientBomb

VOCAB = 40


def _config(**kw):
    values = dict(model="lstm", vocab_size=VOCAB, hidden_size=16, num_layers=2, init_scale=0.1,
                  keep_prob=0.7, batch_size=4, num_steps=5, num_epochs=2, learning_rate=1.0,
                  max_grad_norm=5.0, lr_decay=0.5, lr_decay_start_epoch=1, seed=3)
    values.update(kw)
    return TrainConfig.from_dict(values)


def _ids(n=1200, seed=0):
    rng = np.random.RandomState(seed)
    ids = np.zeros(n, np.int32)
    for i in range(1, n):
        ids[i] = (ids[i - 1] * 7 + 2) % VOCAB if rng.rand() < 0.85 else rng.randint(VOCAB)
    return ids


class _Vocab:
    """The least a trainer needs of a vocabulary."""

    def __init__(self, n=VOCAB):
        self.tokens = [f"t{i}" for i in range(n)]

    def __len__(self):
        return len(self.tokens)

    def fingerprint(self):
        return str(len(self.tokens))

    def save(self, path):
        with open(path, "w") as f:
            f.write("\n".join(self.tokens) + "\n")


def _train(cfg, model_dir, num_epochs, seed=11):
    tf.random.set_seed(seed)
    model = build_model(cfg.model_config())
    trainer = Trainer(model, cfg, model_dir=model_dir, log=lambda s: None)
    result = trainer.fit(_ids(), _ids(300, seed=1), num_epochs=num_epochs)
    return model, trainer, result


@pytest.fixture(autouse=True, scope="module")
def _init():
    dist.init()


def test_training_lowers_perplexity_and_follows_the_decay(tmp_path):
    cfg = _config(keep_prob=1.0, num_epochs=6, hidden_size=32, lr_decay_start_epoch=4)
    _, trainer, result = _train(cfg, None, 6)
    ppl = [e.train_perplexity for e in result.epochs]
    assert ppl[5] < 0.8 * ppl[0] and ppl[0] < VOCAB * 1.5
    assert [e.learning_rate for e in result.epochs] == pytest.approx([1.0, 1.0, 1.0, 1.0, 0.5, 0.25])
    assert all(e.valid_perplexity is not None for e in result.epochs)


def test_resume_is_exact_with_dropout_on(tmp_path):
    cfg = _config(keep_prob=0.7)
    straight, _, _ = _train(cfg, str(tmp_path / "a"), 2)
    _train(cfg, str(tmp_path / "b"), 1)
    resumed, _, result = _train(cfg, str(tmp_path / "b"), 2, seed=999)  # init seed must not matter
    assert result.resumed_from and result.epochs[0].epoch == 2
    for a, b in zip(straight.trainable_variables, resumed.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6, err_msg=a.name)


def test_dropout_really_is_on_in_that_test(tmp_path):
    """Guards the test above: with another seed, dropout gives other weights."""
    a, _, _ = _train(_config(keep_prob=0.7), None, 1)
    b, _, _ = _train(_config(keep_prob=0.7, seed=4), None, 1)
    assert any(not np.allclose(x.numpy(), y.numpy()) for x, y in
               zip(a.trainable_variables, b.trainable_variables))


def test_non_finite_loss_stops_with_epoch_and_step_and_keeps_last_good_checkpoint(tmp_path):
    # The non-finite value is forced (every gradient Inf from the first step of epoch 2 on):
    # a huge learning rate diverged to NaN on TF 2.18 but stayed finite (loss ~690) on 2.21.
    cfg = _config(keep_prob=1.0, num_epochs=3)
    model_dir = str(tmp_path / "m")

    def trainer(**bomb):
        tf.random.set_seed(11)
        model = GradientBomb(build_model(cfg.model_config()), **bomb)
        return Trainer(model, cfg, model_dir=model_dir, log=lambda s: None)

    trainer(at_call=-1).fit(_ids(), _ids(300, seed=1), num_epochs=1)
    ckpts = sorted(os.listdir(os.path.join(model_dir, "checkpoints")))
    with pytest.raises(NonFiniteError, match=r"non-finite loss or gradient .* at epoch 2, step 1;"):
        trainer(every_call_from=1).fit(_ids(), num_epochs=3)
    assert sorted(os.listdir(os.path.join(model_dir, "checkpoints"))) == ckpts


def test_a_diverging_finite_loss_stops_like_a_non_finite_one_and_keeps_the_last_good_checkpoint(tmp_path):
    cfg = _config(keep_prob=1.0, num_epochs=3)
    model_dir = str(tmp_path / "m")
    steps = len(Trainer(build_model(cfg.model_config()), cfg).epoch_batches(_ids(), 0))

    def trainer(from_call, config=cfg):
        tf.random.set_seed(11)
        return Trainer(GradientBomb(build_model(config.model_config()), blow_up_from=from_call), config,
                       model_dir=model_dir, log=lambda s: None, record_step_losses=True)

    first = trainer(10**9).fit(_ids(), num_epochs=1)
    assert max(first.step_losses) / 5 < 3 * np.log(VOCAB)  # per token (5 steps): a model that learns stays below
    ckpts = sorted(os.listdir(os.path.join(model_dir, "checkpoints")))
    bound = f"{3 * np.log(VOCAB):.2f}"
    with pytest.raises(NonFiniteError,
                       match=rf"the loss diverged: 10 steps in a row above {bound} per token \(divergence_factor 3 x "
                             rf"ln\(vocab_size {VOCAB}\).* at epoch 2, step 10; training stopped "
                             "and the last good checkpoint stays the latest"):
        trainer(steps + 1).fit(_ids(), num_epochs=3)
    assert sorted(os.listdir(os.path.join(model_dir, "checkpoints"))) == ckpts
    # Off: the same blow-up trains on (the checkpoints are then the run's own).
    off = cfg.replace(divergence_factor=0.0)
    shutil.rmtree(model_dir)
    result = trainer(3, off).fit(_ids(), num_epochs=1)
    assert min(result.step_losses[3:]) / 5 > 3 * np.log(VOCAB)


def test_model_dir_with_another_model_shape_is_refused(tmp_path):
    model_dir = str(tmp_path / "m")
    _train(_config(keep_prob=1.0), model_dir, 1)
    before = open(os.path.join(model_dir, "config.json")).read()
    cfg = _config(keep_prob=1.0, hidden_size=24)
    with pytest.raises(CheckpointError, match="hidden_size = 16, but the config says 24"):
        _train(cfg, model_dir, 1)
    assert open(os.path.join(model_dir, "config.json")).read() == before


def test_unwritable_model_dir_and_bad_batch_are_usage_errors(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UsageError, match="is not writable"):
        _train(_config(), str(blocker / "sub"), 1)
    with pytest.raises(UsageError, match="20 ids are too few for one batch"):
        Trainer(build_model(_config().model_config()), _config(batch_size=4)).fit(_ids(20))


def test_results_json_and_tensorboard(tmp_path):
    model_dir = tmp_path / "m"
    _train(_config(keep_prob=1.0), str(model_dir), 2)
    results = json.loads((model_dir / "results.json").read_text())
    assert [e["epoch"] for e in results["epochs"]] == [1, 2]
    assert results["world_size"] == dist.size()
    assert any(f.startswith("events") for f in os.listdir(model_dir / "tensorboard"))


def _ops_with_shape(fn, shape, *specs):
    """Op types in the graph of ``fn`` traced for ``specs`` whose output has exactly ``shape``."""
    graph = tf.function(fn).get_concrete_function(*specs).graph
    return [op.type for op in graph.get_operations()
            if any(o.shape.rank == len(shape) and o.shape.as_list() == shape for o in op.outputs)]


@pytest.mark.parametrize("max_grad_norm", [0.0, 5.0])
def test_clipping_keeps_the_embedding_gradient_sparse(max_grad_norm, monkeypatch):
    # The norm of an IndexedSlices gradient is taken over its rows, with or without clipping;
    # a densified [vocab, dim] gradient would cost a vocab-sized buffer every step.
    import lmkit.train.step as step_module
    from lmkit.optim import clip_gradients

    vocab, dim = 97, 13
    cfg = _config(vocab_size=vocab, hidden_size=dim, num_layers=1, max_grad_norm=max_grad_norm)
    seen = []

    def recording(grads, *limits):
        grads = list(grads)
        seen.append([type(g).__name__ for g in grads])
        return clip_gradients(grads, *limits)

    # 1. The trainer's step hands the averaged embedding gradient to clip_gradients as slices.
    monkeypatch.setattr(step_module, "clip_gradients", recording)
    trainer = Trainer(build_model(cfg.model_config()), cfg, log=lambda s: None)
    trainer.build(steps_per_epoch=10)
    x = tf.zeros([cfg.batch_size, cfg.num_steps], tf.int32)
    no = tf.zeros([3])  # no stop, save or end request
    trainer.step.function.get_concrete_function(x, x, trainer.initial_state(), no)
    assert seen and seen[0].count("IndexedSlices") == 1, seen

    # 2. clip_gradients never builds a dense [vocab, dim] tensor from slices.
    def clip(values, indices):
        slices = tf.IndexedSlices(values, indices, tf.constant([vocab, dim]))
        return clip_gradients([slices, tf.ones([3])], max_grad_norm, 0.0)

    specs = (tf.TensorSpec([20, dim]), tf.TensorSpec([20], tf.int32))
    assert _ops_with_shape(clip, [vocab, dim], *specs) == []
    # The probe sees a densified gradient when there is one: TensorFlow's own
    # global norm (what the trainer used with clipping off) makes one.
    densify = lambda v, i: tf.linalg.global_norm(  # noqa: E731
        [tf.convert_to_tensor(tf.IndexedSlices(v, i, tf.constant([vocab, dim])))])
    assert _ops_with_shape(densify, [vocab, dim], *specs) == ["UnsortedSegmentSum"]


def _checkpoint_metas(model_dir):
    folder = os.path.join(model_dir, "checkpoints")
    return [json.loads(open(os.path.join(folder, name, "meta.json")).read())
            for name in sorted(os.listdir(folder))]


def test_max_steps_inside_an_epoch_leaves_a_checkpoint(tmp_path):
    cfg = _config(keep_prob=1.0)
    model_dir = str(tmp_path / "m")
    tf.random.set_seed(11)
    trainer = Trainer(build_model(cfg.model_config()), cfg, model_dir=model_dir, log=lambda s: None)
    result = trainer.fit(_ids(), max_steps=7)
    (meta,) = _checkpoint_metas(model_dir)
    assert (meta["step"], meta["stopped_by"], meta["steps_in_epoch"], meta["epoch"]) == (7, "max_steps", 7, 0)
    assert result.checkpoint.endswith("ckpt-000000007") and result.global_step == 7


def test_a_usage_error_after_training_began_keeps_what_was_trained(tmp_path):
    from lmkit.data import DataError

    class BadValidation(Trainer):
        def evaluate_loss(self, ids):
            raise DataError("the validation file vanished")

    cfg = _config(keep_prob=1.0)
    model_dir = str(tmp_path / "m")
    trainer = BadValidation(build_model(cfg.model_config()), cfg, model_dir=model_dir, log=lambda s: None)
    with pytest.raises(DataError, match="vanished"):
        trainer.fit(_ids(), _ids(300, seed=1))
    (meta,) = _checkpoint_metas(model_dir)
    assert meta["stopped_by"] == "a usage error" and meta["step"] == int(trainer.progress.global_step.numpy()) > 0


def test_stateless_models_train_on_shuffled_windows_a_new_order_each_epoch():
    from lmkit.data import bptt_arrays, window_arrays

    ids = _ids()
    for model, stateful in (("transformer", False), ("lstm", True)):
        cfg = _config(model=model, num_heads=2)
        trainer = Trainer(build_model(cfg.model_config()), cfg, log=lambda s: None)
        first, second = trainer.epoch_arrays(ids, 0), trainer.epoch_arrays(ids, 1)
        if stateful:  # BPTT rows in order, the same every epoch
            np.testing.assert_array_equal(first[0], bptt_arrays(ids, 4, 5)[0])
            np.testing.assert_array_equal(first[0], second[0])
        else:
            np.testing.assert_array_equal(first[0], window_arrays(ids, 4, 5, epoch=0, seed=cfg.seed)[0])
            assert first[0].shape == second[0].shape and not np.array_equal(first[0], second[0])
        np.testing.assert_array_equal(first[1][:, :, :-1], first[0][:, :, 1:])  # targets: next ids


def test_eval_data_too_small_fails_before_training(tmp_path):
    cfg = _config(keep_prob=1.0)
    trainer = Trainer(build_model(cfg.model_config()), cfg, model_dir=str(tmp_path / "m"), log=lambda s: None)
    with pytest.raises(UsageError, match="the valid data has 10 tokens, too few for one evaluation batch"):
        trainer.fit(_ids(), _ids(10))
    assert not os.path.exists(tmp_path / "m")
    assert int(trainer.progress.global_step.numpy()) == 0


@pytest.mark.parametrize("model", ["lstm", "transformer"])
def test_resume_inside_an_epoch_is_exact_with_dropout_on(tmp_path, model):
    cfg = _config(keep_prob=0.7, model=model, num_heads=2)
    straight, _, _ = _train(cfg, str(tmp_path / "a"), 2)
    interrupted = str(tmp_path / "b")
    tf.random.set_seed(11)
    first = Trainer(build_model(cfg.model_config()), cfg, model_dir=interrupted, log=lambda s: None)
    first.fit(_ids(), _ids(300, seed=1), num_epochs=2, max_steps=37)  # inside epoch 1 (59 steps)
    (meta,) = _checkpoint_metas(interrupted)
    assert (meta["step"], meta["epoch"], meta["steps_in_epoch"]) == (37, 0, 37)
    assert ("rnn_state.npz" in os.listdir(first.loop.checkpoints.manager.latest())) == (model == "lstm")
    resumed, _, result = _train(cfg, interrupted, 2, seed=999)  # the init seed must not matter
    assert result.resumed_from and result.epochs[0].steps == 59 - 37
    for a, b in zip(straight.trainable_variables, resumed.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6, err_msg=a.name)


def test_checkpoints_every_steps_keep_the_last_few(tmp_path):
    cfg = _config(keep_prob=1.0, checkpoint_every_steps=10, keep_checkpoints=2, num_epochs=1)
    model_dir = str(tmp_path / "m")
    _train(cfg, model_dir, 1)
    steps = [m["step"] for m in _checkpoint_metas(model_dir)]
    assert steps == [50, 59]  # every 10 steps, the epoch's end; the folder keeps 2
    assert [m.get("saved_by") for m in _checkpoint_metas(model_dir)] == ["schedule", None]


@pytest.mark.parametrize("model", ["transformer", "lstm"])
def test_a_memory_mapped_cache_stream_trains_exactly_as_an_int32_array(tmp_path, model):
    ids = _ids()
    path = tmp_path / "ids.bin"
    ids.astype(np.uint16).tofile(path)
    mapped = np.memmap(path, dtype=np.uint16, mode="r", shape=ids.shape)
    losses = []
    for stream in (ids, mapped):
        cfg = _config(model=model, num_heads=2, keep_prob=1.0)
        tf.random.set_seed(5)
        trainer = Trainer(build_model(cfg.model_config()), cfg, record_step_losses=True, log=lambda s: None)
        losses.append(trainer.fit(stream, _ids(300, seed=1), num_epochs=1).step_losses)
    assert len(losses[0]) > 10
    np.testing.assert_array_equal(losses[0], losses[1])


def test_random_offset_sampling_trains_a_transformer_and_is_refused_for_an_rnn():
    ids = _ids()
    cfg = _config(model="transformer", num_heads=2, sampling="random")
    trainer = Trainer(build_model(cfg.model_config()), cfg, log=lambda s: None)
    first, second = trainer.epoch_arrays(ids, 0), trainer.epoch_arrays(ids, 0)
    np.testing.assert_array_equal(first[0], second[0])  # a function of (seed, epoch): resumable
    assert first[0].shape[0] == (len(ids) - 1) // 5 // 4  # as many steps as fixed windows give
    result = trainer.fit(ids, num_epochs=1)
    assert result.epochs and np.isfinite(result.epochs[-1].train_perplexity)
    cfg = _config(model="lstm", sampling="random")
    trainer = Trainer(build_model(cfg.model_config()), cfg, log=lambda s: None)
    with pytest.raises(UsageError, match="sampling = 'random' needs a model without a recurrent state"):
        trainer.fit(ids, num_epochs=1)


def test_a_mean_loss_steps_a_window_length_less_far_and_reports_the_same_perplexity():
    """loss_reduction = "mean": the step's loss and SGD's update are 1/num_steps of the summed loss's (no
    clipping), and the perplexity reported is per token either way."""
    ids = _ids()
    deltas, losses, perplexities = {}, {}, {}
    for reduction in ("sum", "mean"):
        cfg = _config(model="transformer", num_heads=2, keep_prob=1.0, learning_rate=0.1, max_grad_norm=0.0,
                      loss_reduction=reduction)
        tf.random.set_seed(5)
        model = build_model(cfg.model_config())
        before = [v.numpy() for v in model.trainable_variables]
        result = Trainer(model, cfg, log=lambda s: None, record_step_losses=True).fit(ids, max_steps=1)
        deltas[reduction] = [v.numpy() - b for v, b in zip(model.trainable_variables, before)]
        losses[reduction], perplexities[reduction] = result.step_losses[0], result.epochs[-1].train_perplexity
    np.testing.assert_allclose(losses["sum"], 5 * losses["mean"], rtol=1e-5)  # num_steps = 5
    np.testing.assert_allclose(perplexities["sum"], perplexities["mean"], rtol=1e-5)
    assert any(np.abs(d).max() > 1e-4 for d in deltas["mean"])
    for summed, mean in zip(deltas["sum"], deltas["mean"]):
        np.testing.assert_allclose(summed, 5 * mean, rtol=1e-3, atol=1e-6)  # float32 rounding of w + dw - w
