"""Shared fixtures for the lmkit.layers tests."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same seeds (initial values and dropout masks)."""
    tf.random.set_seed(1234)
    tf.random.set_global_generator(tf.random.Generator.from_seed(1234))  # dropout masks
    np.random.seed(1234)
    yield


@pytest.fixture(params=["eager", "function"])
def run(request):
    """Runs a callable eagerly or inside a fresh ``tf.function``."""
    def runner(fn, *args, **kwargs):
        if request.param == "eager":
            return fn(*args, **kwargs)
        return tf.function(lambda *a: fn(*a, **kwargs))(*args)
    runner.mode = request.param
    return runner
