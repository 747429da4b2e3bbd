"""Slots, the `variables` order, checkpoints, lazy building, and the config factory."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from lmkit import optim
from lmkit.config import TrainConfig, load_config


def model_vars(prefix: str = "net"):
    return [tf.Variable(tf.fill(shape, 0.5), name=f"{prefix}/{name}")
            for name, shape in (("embedding", [4, 3]), ("kernel", [3, 2]), ("bias", [2]))]


EXPECTED_SLOTS = {
    "sgd": [],
    "momentum": ["momentum"],
    "adam": ["m", "v"],
    "adamw": ["m", "v"],
    "novograd": ["m", "v"],
    "lamb": ["m", "v"],
}


@pytest.mark.parametrize("name", sorted(EXPECTED_SLOTS))
def test_build_creates_named_slots_in_a_stable_order(name):
    variables = model_vars()
    opt = optim.create_optimizer(name, learning_rate=0.1)
    assert opt.learning_rate.dtype == tf.float32 and not opt.learning_rate.trainable
    assert opt.iterations.dtype == tf.int64 and not opt.iterations.trainable
    assert [v.name for v in opt.variables] == [opt.learning_rate.name, opt.iterations.name]
    opt.build(variables)
    want = [f"net/{var}/{slot}:0" for var in ("embedding", "kernel", "bias")
            for slot in EXPECTED_SLOTS[name]]
    got = [v.name for v in opt.variables[2:]]
    assert got == want
    for slot in opt.variables[2:]:
        assert not slot.trainable
        assert not np.any(slot.numpy()), "slots start at zero"
    if name == "novograd":  # one second moment per layer
        assert opt.slots(variables[0])["v"].shape == ()
        assert opt.slots(variables[0])["m"].shape == (4, 3)
    before = list(opt.variables)
    opt.build(variables)  # idempotent
    opt.build(variables[::-1])  # order of later calls does not matter
    assert [id(v) for v in opt.variables] == [id(v) for v in before]
    extra = tf.Variable(tf.zeros([5]), name="net/extra")
    opt.build(variables + [extra])
    assert [v.name for v in opt.variables[len(before):]] == [
        f"net/extra/{slot}:0" for slot in EXPECTED_SLOTS[name]]


def test_variables_with_equal_names_get_separate_slots():
    a = tf.Variable(tf.ones([2]), name="w")
    b = tf.Variable(tf.ones([3]), name="w")
    opt = optim.Adam()
    opt.build([a, b])
    assert opt.slots(a)["m"] is not opt.slots(b)["m"]
    assert opt.slots(b)["m"].shape == (3,)
    assert [v.name for v in opt.variables[2:]] == ["w/m:0", "w/v:0", "w_1/m:0", "w_1/v:0"]


def test_larc_shares_the_wrapped_state():
    inner = optim.SGD(momentum=0.9)
    opt = optim.LARC(inner, larc_eta=0.002)
    assert opt.learning_rate is inner.learning_rate
    assert opt.iterations is inner.iterations
    variables = model_vars()
    opt.build(variables)
    assert [id(v) for v in opt.variables] == [id(v) for v in inner.variables]
    assert len(opt.variables) == 2 + 3
    opt.learning_rate.assign(0.25)
    assert float(inner.learning_rate.numpy()) == 0.25


def _train(opt, variables, steps, seed):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        grads = [tf.constant(rng.standard_normal(v.shape).astype(np.float32)) for v in variables]
        opt.learning_rate.assign(float(rng.uniform(0.01, 0.1)))
        opt.apply_gradients(zip(grads, variables))


@pytest.mark.parametrize("make", [
    lambda: optim.Adam(),
    lambda: optim.NovoGrad(),
    lambda: optim.LARC(optim.SGD(momentum=0.9), larc_eta=0.002, larc_mode="scale"),
], ids=["adam", "novograd", "larc_momentum"])
def test_checkpoint_round_trip_restores_slots(tmp_path, make):
    variables, opt = model_vars(), make()
    opt.build(variables)
    _train(opt, variables, steps=3, seed=0)
    path = tf.train.Checkpoint(model=variables, optimizer=opt).save(str(tmp_path / "ckpt"))

    # A fresh optimizer built in the opposite order: slots are found by name.
    variables2, opt2 = model_vars(), make()
    opt2.build(variables2[::-1])
    tf.train.Checkpoint(model=variables2, optimizer=opt2).restore(path).assert_consumed()
    saved = {v.name: v.numpy() for v in opt.variables}
    restored = {v.name: v.numpy() for v in opt2.variables}
    assert saved.keys() == restored.keys()
    for name, value in saved.items():
        np.testing.assert_array_equal(restored[name], value, err_msg=name)
    assert any(np.any(v) for k, v in restored.items() if k.count("/") >= 2), "slots were trained"

    # Training on from both gives identical weights.
    _train(opt, variables, steps=2, seed=1)
    _train(opt2, variables2, steps=2, seed=1)
    for a, b in zip(variables, variables2):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_apply_before_build_builds_eagerly_and_in_tf_function():
    eager_vars, traced_vars = model_vars("e"), model_vars("t")
    eager, traced = optim.Adam(learning_rate=0.1), optim.Adam(learning_rate=0.1)
    grads = [tf.fill(v.shape, 0.3) for v in eager_vars]

    eager.apply_gradients(zip(grads, eager_vars))  # no build() first

    @tf.function
    def step():
        traced.apply_gradients(zip(grads, traced_vars))

    step()  # slots are created on the first trace, outside the graph
    step()
    eager.apply_gradients(zip(grads, eager_vars))
    assert len(traced.variables) == 2 + 2 * 3
    for a, b in zip(eager_vars, traced_vars):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
    assert int(traced.iterations.numpy()) == 2


def test_iterations_drive_bias_correction_under_tf_function():
    """The step counter is read inside the graph, not frozen at trace time."""
    w = tf.Variable([1.0])
    opt = optim.Adam(learning_rate=1.0, beta1=0.5, beta2=0.5, epsilon=1e-12)
    opt.build([w])
    step = tf.function(lambda g: opt.apply_gradients([(g, w)]))
    deltas = []
    for g in (1.0, 1.0, 1.0):
        before = float(w.numpy()[0])
        step(tf.constant([g]))
        deltas.append(before - float(w.numpy()[0]))
    # with a constant gradient the bias-corrected Adam step is exactly lr each time
    np.testing.assert_allclose(deltas, [1.0, 1.0, 1.0], rtol=1e-5)


# ------------------------------------------------------------------ factory
def small_config(**changes) -> TrainConfig:
    return load_config("config_small").replace(**changes)


@pytest.mark.parametrize("name, cls", [("sgd", optim.SGD), ("momentum", optim.SGD),
                                       ("adam", optim.Adam), ("adamw", optim.AdamW),
                                       ("novograd", optim.NovoGrad), ("lamb", optim.LAMB)])
def test_build_optimizer_by_name(name, cls):
    opt = optim.build_optimizer(small_config(optimizer=name, learning_rate=0.5))
    assert type(opt) is cls
    assert float(opt.learning_rate.numpy()) == 0.5
    if name == "momentum":
        assert opt.momentum == 0.9
    if name == "sgd":
        assert opt.momentum == 0.0


def test_build_optimizer_passes_params_and_wraps_larc():
    opt = optim.build_optimizer(load_config("config_small_large_batch"))
    assert isinstance(opt, optim.LARC) and type(opt.optimizer) is optim.SGD
    assert (opt.larc_eta, opt.larc_mode, opt.min_update, opt.epsilon) == (0.002, "clip", 1e-7, 1e-7)
    adam = optim.build_optimizer(load_config("config_transformer"))
    assert type(adam) is optim.Adam
    assert (adam.beta1, adam.beta2, adam.epsilon) == (0.9, 0.98, 1e-9)
    lamb = optim.build_optimizer(small_config(
        optimizer="lamb", optimizer_params={"weight_decay": 0.01,
                                            "exclude_from_weight_decay": ["bias"]},
        larc_params={"larc_eta": 0.01, "larc_mode": "scale"}))
    assert isinstance(lamb, optim.LARC) and lamb.larc_mode == "scale" and lamb.min_update == 1e-7
    assert lamb.optimizer.weight_decay == 0.01
    assert not lamb.decays(tf.Variable([1.0], name="x/bias"))


def test_factory_errors_name_the_problem():
    with pytest.raises(ValueError) as err:
        optim.build_optimizer(small_config(optimizer="adagrad"))
    for name in optim.OPTIMIZERS:
        assert name in str(err.value)
    with pytest.raises(ValueError, match="'beta_1'.*did you mean 'beta1'"):
        optim.build_optimizer(small_config(optimizer="adam", optimizer_params={"beta_1": 0.9}))
    with pytest.raises(ValueError, match="'nesterov'"):  # known to SGD, not to Adam
        optim.build_optimizer(small_config(optimizer="adam", optimizer_params={"nesterov": True}))
    with pytest.raises(ValueError, match="'eta'"):
        optim.build_optimizer(small_config(larc_params={"eta": 0.002}))
    with pytest.raises(ValueError, match="larc_eta"):
        optim.build_optimizer(small_config(larc_params={"larc_mode": "clip"}))
    with pytest.raises(ValueError, match="larc_mode"):
        optim.build_optimizer(small_config(larc_params={"larc_eta": 0.002, "larc_mode": "lars"}))
    with pytest.raises(ValueError, match="momentum"):
        optim.build_optimizer(small_config(optimizer="momentum", optimizer_params={"momentum": 2}))


def test_optimizer_params_lists_the_keys():
    assert optim.optimizer_params("momentum")["momentum"] == 0.9
    assert set(optim.optimizer_params("novograd")) == {
        "beta1", "beta2", "epsilon", "weight_decay", "grad_averaging", "exclude_from_weight_decay"}
