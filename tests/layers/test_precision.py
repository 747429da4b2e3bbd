"""The precision policies: one registry, a scope per traced step (nested, per thread), casts that keep float32
variables' gradients float32, and a recurrent state carried as float32."""
import threading

import pytest
import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.layers import precision


def test_the_registry_names_each_policy_and_refuses_an_unknown_one():
    assert list(precision.PRECISIONS) == ["float32", "mixed_bfloat16", "mixed_float16"]
    assert precision.get("mixed_float16").loss_scaling and not precision.get("mixed_bfloat16").loss_scaling
    with pytest.raises(UsageError, match="precision 'bf16' is unknown; choices: float32, mixed_bfloat16"):
        precision.get("bf16")


def test_scopes_nest_and_stay_in_their_thread():
    assert precision.compute_dtype() == tf.float32
    seen = []
    with precision.scope("mixed_bfloat16"):
        assert precision.compute_dtype() == tf.bfloat16
        with precision.scope("mixed_float16"):
            assert precision.compute_dtype() == tf.float16
            worker = threading.Thread(target=lambda: seen.append(precision.compute_dtype()))
            worker.start()
            worker.join()
        assert precision.compute_dtype() == tf.bfloat16
        assert precision.cast_to_compute(tf.ones([2])).dtype == tf.bfloat16
        assert precision.cast_to_compute(tf.ones([2], tf.int32)).dtype == tf.int32  # ids stay ids
    assert precision.compute_dtype() == tf.float32 and seen == [tf.float32]  # another thread: its own stack


def test_a_cast_variable_gets_a_float32_gradient_and_a_state_leaves_as_it_came():
    variable = tf.Variable([1.0, 2.0])
    reference = tf.ones([2], tf.bfloat16)
    with tf.GradientTape() as tape:
        used = precision.cast_like(variable, reference)
        loss = tf.reduce_sum(tf.cast(used * reference, tf.float32))
    assert used.dtype == tf.bfloat16 and tape.gradient(loss, variable).dtype == tf.float32
    assert precision.cast_like(variable, tf.ones([2], tf.int32)) is variable  # not a floating reference
    state = (tf.zeros([2]), tf.zeros([2]))

    def run(s):
        assert all(t.dtype == tf.bfloat16 for t in s)  # inside: the compute dtype
        return s[0] + 1, (s[0] + 1, s[1] + 2)

    output, new_state = precision.state_in_dtype_of(reference, state, run)
    assert output.dtype == tf.bfloat16 and [t.dtype for t in new_state] == [tf.float32, tf.float32]
    assert new_state[1].numpy().tolist() == [2.0, 2.0]
