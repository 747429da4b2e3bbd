"""Dynamic loss scaling for float16: grow, halve, give up."""
import tensorflow as tf

from lmkit.train.loss_scale import DynamicLossScale


def test_loss_scale_grows_halves_and_gives_up():
    scale = DynamicLossScale(initial_scale=8.0, growth_interval=3, max_consecutive_skips=2)
    ok = [bool(scale.update(tf.constant(True))) for _ in range(3)]
    assert ok == [True] * 3 and float(scale.scale.numpy()) == 16.0  # doubled after 3 finite steps
    assert bool(scale.update(tf.constant(False)))  # one skip: recoverable
    assert float(scale.scale.numpy()) == 8.0 and int(scale.skipped_steps.numpy()) == 1
    assert not bool(scale.update(tf.constant(False)))  # the second in a row: give up
    assert int(scale.consecutive_skips.numpy()) == 2
    assert bool(scale.update(tf.constant(True))) and int(scale.consecutive_skips.numpy()) == 0
    grads = scale.unscale([tf.constant([8.0]), None, tf.IndexedSlices(tf.constant([[16.0]]), tf.constant([0]))])
    assert float(grads[0][0]) == 2.0 and grads[1] is None and float(grads[2].values[0, 0]) == 4.0
