"""A language model wrapper that makes one training step's gradient non-finite (tests only).

``GradientBomb(model, at_call=s)`` behaves exactly like ``model`` except
that the backward pass of its ``s``-th training call (1-based, counted in a
checkpointed variable) multiplies the gradient of the logits by Inf: the
loss stays finite, every gradient becomes Inf or NaN, as a float16
overflow in the backward pass would make them. ``at_call=-1`` never fires;
``every_call_from=s`` fires on every call from the ``s``-th on.
``blow_up_from=s`` instead scales the logits by 1000 from the ``s``-th
training call on: a huge loss that stays finite (a diverging run).
"""
import tensorflow as tf


@tf.custom_gradient
def _poison_gradient(logits, fire):
    def backward(dy):
        factor = tf.where(fire, tf.constant(float("inf"), dy.dtype), tf.constant(1.0, dy.dtype))
        return dy * factor, None

    return tf.identity(logits), backward


class GradientBomb(tf.Module):
    """``model`` with an Inf gradient on chosen training calls."""

    def __init__(self, model, at_call=-1, every_call_from=-1, blow_up_from=-1):
        super().__init__(name="gradient_bomb")
        self.inner = model
        self.at_call = at_call
        self.every_call_from = every_call_from
        self.blow_up_from = blow_up_from
        self.vocab_size = model.vocab_size
        self.stateful = model.stateful
        self.calls = tf.Variable(0, dtype=tf.int64, trainable=False, name="calls")

    def initial_state(self, batch_size, max_length=None):
        return self.inner.initial_state(batch_size)

    def __call__(self, ids, state=None, training=False):
        logits, state = self.inner(ids, state, training)
        if training:
            n = self.calls.assign_add(1)
            fire = tf.logical_or(tf.equal(n, self.at_call),
                                 tf.logical_and(self.every_call_from > 0, n >= self.every_call_from))
            logits = _poison_gradient(logits, fire)
            if self.blow_up_from > 0:
                logits = logits * tf.where(n >= self.blow_up_from, 1000.0, 1.0)
        return logits, state

    def step(self, ids, state):
        return self.inner.step(ids, state)
