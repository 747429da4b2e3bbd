"""The code blocks of docs/modules.md run as written."""

import os
import re

import numpy as np
import pytest
import tensorflow as tf

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "modules.md")


def _code_blocks():
    with open(DOC, encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)


def test_doc_has_both_examples():
    assert len(_code_blocks()) == 2


@pytest.mark.parametrize("index", [0, 1], ids=["transformer", "rnn"])
def test_code_block_runs(index):
    namespace = {}
    exec(compile(_code_blocks()[index], f"docs/modules.md[{index}]", "exec"), namespace)
    if index == 0:
        model = namespace["model"]
        assert namespace["logits"].shape == (4, 16, 100)
        assert np.isfinite(namespace["loss"].numpy())
        assert all(g is not None for g in namespace["grads"])
        np.testing.assert_array_equal(namespace["state"].positions, [8, 8, 8, 8])
        # The composed model's cached steps agree with its full pass.
        ids = namespace["ids"][:, :5]
        full, _ = model(ids)
        state = model.initial_state(4, 5)
        for t in range(5):
            step_logits, state = model.step(ids[:, t], state)
            np.testing.assert_allclose(step_logits, full[:, t], rtol=1e-4, atol=1e-5)
    else:
        assert namespace["logits"].shape == (4, 20, 100)
        assert all(t.shape == (4, 32) for t in tf.nest.flatten(namespace["state"]))
