"""The optimizers by name and a config's optimization section: presets, parameters, LARC, and the errors."""

from __future__ import annotations

import pytest
import tensorflow as tf

from lmkit import optim
from lmkit.config import TrainConfig, load_config


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
