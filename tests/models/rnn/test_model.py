"""The RNN language models (lmkit.models.rnn.model): the state carried across windows, Zaremba's initialisation."""

import numpy as np
import pytest
import tensorflow as tf

from lmkit.models import build_model
from tests.models.test_protocols import _config, _ids


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_rnn_state_carries_across_windows(run, kind):
    model = build_model(_config(kind).model_config())
    ids = _ids(2, 8)
    want, want_state = model(ids)

    def windows(ids):
        first, state = model(ids[:, :5])
        second, state = model(ids[:, 5:], state)
        return tf.concat([first, second], axis=1), state

    got, state = run(windows, ids)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(tf.nest.flatten(state), tf.nest.flatten(want_state)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_zaremba_initialization_covers_every_variable():
    model = build_model(_config("lstm", init_scale=0.05).model_config())
    for variable in model.variables:
        values = variable.numpy()
        assert np.abs(values).max() <= 0.05, variable.name
        assert values.std() > 0.01, f"{variable.name} is not uniformly initialised"
