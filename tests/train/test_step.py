"""Where the trainer compiles with XLA (``jit_compile = "auto"``) and what its step holds.

The decision is driven here with a fake device type: CI has no GPU.
"""
import numpy as np
import pytest
import tensorflow as tf

from lmkit import distributed as dist
from lmkit.config import TrainConfig
from lmkit.core.errors import UsageError
from lmkit.core.xla import use_xla
from lmkit.models import build_model
from lmkit.train import Trainer

# Ops that branch on a value (the predicate of a Switch lives in host memory: on a GPU the
# host waits for the device every step).
BRANCH_OPS = {"If", "StatelessIf", "Switch", "Merge", "Case", "StatelessCase"}


@pytest.fixture(autouse=True, scope="module")
def _init():
    dist.init(backend="local")


def _config(**kw):
    values = dict(model="lstm", vocab_size=30, hidden_size=8, num_layers=1, init_scale=0.1, keep_prob=1.0,
                  batch_size=4, num_steps=5, num_epochs=1, learning_rate=0.5, max_grad_norm=1.0)
    values.update(kw)
    return TrainConfig.from_dict(values)


def _ids(n=400):
    return (np.arange(n) * 7 % 30).astype(np.int32)


@pytest.mark.parametrize("setting, device, want", [
    ("auto", "GPU", True), ("auto", "CPU", False), (True, "CPU", True), (False, "GPU", False)])
def test_auto_compiles_on_gpus_only(setting, device, want):
    assert use_xla(setting, device) is want


@pytest.mark.parametrize("setting", ["yes", 1, None])
def test_a_bad_setting_is_refused(setting):
    with pytest.raises(UsageError, match="jit_compile"):
        use_xla(setting, "CPU")


def test_the_default_is_auto_and_the_trainer_follows_the_device(monkeypatch):
    assert _config().compute.jit_compile == "auto"
    lines = []
    cpu = Trainer(build_model(_config().model_config()), _config(), log=lines.append)
    cpu.fit(_ids(), max_steps=2)
    assert cpu.xla is False and "compiled the training step in" in "\n".join(lines)
    monkeypatch.setattr(dist, "device_type", lambda: "GPU")  # what a GPU host reports
    lines.clear()
    gpu = Trainer(build_model(_config().model_config()), _config(), log=lines.append)
    gpu.fit(_ids(), max_steps=2)
    assert gpu.xla is True and "compiled the training step with XLA in" in "\n".join(lines)
    assert gpu.step.function._jit_compile and gpu.evaluator._step._jit_compile


def _all_op_types(fn, *args):
    graph_def = fn.get_concrete_function(*args).graph.as_graph_def()
    ops = {n.op for n in graph_def.node}
    for f in graph_def.library.function:
        ops |= {n.op for n in f.node_def}
    return ops


@pytest.mark.parametrize("overrides", [dict(), dict(precision="mixed_float16"),
                                       dict(model="transformer", num_heads=2, max_positions=8,
                                            optimizer="adam", grad_accum_steps=2)])
def test_the_training_step_has_no_branch(overrides, monkeypatch):
    monkeypatch.setattr(dist, "device_type", lambda: "GPU")  # the step a GPU host builds (with XLA)
    cfg = _config(**overrides)
    trainer = Trainer(build_model(cfg.model_config()), cfg, log=lambda s: None)
    trainer.fit(_ids(), max_steps=1)
    x = tf.constant(_ids()[:20].reshape(4, 5))
    ops = _all_op_types(trainer.step.function, x, x, trainer.initial_state(), *[tf.constant(0.0)] * 3)
    assert "SelectV2" in ops and not ops & BRANCH_OPS, sorted(ops & BRANCH_OPS)


def test_the_plain_cpu_step_keeps_its_branch():
    # On a CPU without XLA the update stays under a tf.cond: the selects cost more there.
    cfg = _config()
    trainer = Trainer(build_model(cfg.model_config()), cfg, log=lambda s: None)
    trainer.fit(_ids(), max_steps=1)
    assert trainer.xla is False and trainer.branch_free is False
    x = tf.constant(_ids()[:20].reshape(4, 5))
    ops = _all_op_types(trainer.step.function, x, x, trainer.initial_state(), *[tf.constant(0.0)] * 3)
    assert ops & {"If", "StatelessIf"}


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
    x = tf.zeros([cfg.data.batch_size, cfg.data.num_steps], tf.int32)
    no = tf.constant(0.0)  # no stop, save or end request
    trainer.step.function.get_concrete_function(x, x, trainer.initial_state(), no, no, no)
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
