"""Tiny language models that follow the protocol of docs/design.md, for decoding tests.

* ``TableModel``: logits = ``table[position, last_token]``; exact, NumPy-checkable.
* ``PrefixModel``: logits depend on the whole prefix (the state encodes it), so
  every sequence's probability can be enumerated in NumPy for beam search.
* ``TinyRNN``: an Elman RNN with random weights (state = hidden vector).
* ``TinyAttention``: one causal self-attention layer with a pre-allocated
  key/value cache, the same state layout a transformer uses.

``check_decidable_nucleus`` guards tests that compare top-k/top-p choices
across frameworks against float32 rounding.

Every model counts its ``step`` calls in ``steps_taken`` (a variable, so the
count also works inside ``tf.function``).
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np
import tensorflow as tf


class _Base(tf.Module):
    stateful = True

    def __init__(self, vocab_size: int, name: Optional[str] = None) -> None:
        super().__init__(name=name)
        self.vocab_size = vocab_size
        self.steps_taken = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps_taken")

    def reorder_state(self, state, indices):
        return tf.nest.map_structure(lambda s: tf.gather(s, indices), state)

    def get_config(self) -> Dict[str, int]:
        return {"vocab_size": self.vocab_size}


class TableModel(_Base):
    """logits[b] = table[position, last_token[b]] (the position clips at the end)."""

    def __init__(self, table: np.ndarray) -> None:
        super().__init__(vocab_size=table.shape[-1])
        self.table_np = np.asarray(table, np.float32)  # [positions, vocab, vocab]
        self.table = tf.constant(self.table_np)

    def initial_state(self, batch_size, max_length=None):
        del max_length
        return {"position": tf.zeros([batch_size], tf.int32)}

    def _lookup(self, position, ids):
        position = tf.minimum(position, self.table_np.shape[0] - 1)
        return tf.gather_nd(self.table, tf.stack([position, ids], axis=-1))

    def step(self, ids, state):
        self.steps_taken.assign_add(1)
        logits = self._lookup(state["position"], ids)  # [batch, vocab]
        return logits, {"position": state["position"] + 1}

    def __call__(self, ids, state=None, training=False):
        del training
        batch, time = tf.shape(ids)[0], tf.shape(ids)[1]
        start = self.initial_state(batch)["position"] if state is None else state["position"]
        position = start[:, tf.newaxis] + tf.range(time)[tf.newaxis, :]  # [batch, time]
        return self._lookup(position, ids), {"position": start + time}

    def numpy_logits(self, position: int, last: int) -> np.ndarray:
        return self.table_np[min(position, self.table_np.shape[0] - 1), last]


class PrefixModel(_Base):
    """logits = table[code(prefix)], where code is the prefix in base vocab+1.

    The code is unique for prefixes up to ``max_length`` tokens, so the model
    is an arbitrary distribution over whole sequences.
    """

    def __init__(self, vocab_size: int, max_length: int, seed: int = 0, scale: float = 1.5) -> None:
        super().__init__(vocab_size=vocab_size)
        self.num_codes = (vocab_size + 1) ** max_length
        rng = np.random.RandomState(seed)
        self.table_np = (scale * rng.randn(self.num_codes, vocab_size)).astype(np.float32)
        self.table = tf.Variable(self.table_np, trainable=False, name="table")

    @staticmethod
    def code(prefix: Sequence[int], vocab_size: int) -> int:
        code = 0
        for i in prefix:
            code = code * (vocab_size + 1) + int(i) + 1
        return code

    def set_logits(self, prefix: Sequence[int], logits: Sequence[float]) -> None:
        code = self.code(prefix, self.vocab_size)
        self.table_np[code] = logits
        self.table.assign(self.table_np)

    def numpy_logits(self, prefix: Sequence[int]) -> np.ndarray:
        return self.table_np[self.code(prefix, self.vocab_size)]

    def initial_state(self, batch_size, max_length=None):
        del max_length
        return {"code": tf.zeros([batch_size], tf.int32)}

    def step(self, ids, state):
        self.steps_taken.assign_add(1)
        code = state["code"] * (self.vocab_size + 1) + ids + 1  # [batch]
        return tf.gather(self.table, code), {"code": code}

    def __call__(self, ids, state=None, training=False):
        del training
        state = self.initial_state(tf.shape(ids)[0]) if state is None else state
        codes = tf.scan(lambda code, i: code * (self.vocab_size + 1) + i + 1,
                        tf.transpose(ids), initializer=state["code"])  # [time, batch]
        return tf.gather(self.table, tf.transpose(codes)), {"code": codes[-1]}


class TinyRNN(_Base):
    """h' = tanh(E[x] W + h U + b); logits = h' V + c."""

    def __init__(self, vocab_size: int = 12, hidden: int = 8, seed: int = 0) -> None:
        super().__init__(vocab_size=vocab_size)
        rng = np.random.RandomState(seed)
        self.hidden = hidden

        def var(shape, name, scale=1.0):
            return tf.Variable((scale * rng.randn(*shape)).astype(np.float32), name=name)

        self.embedding = var([vocab_size, hidden], "embedding")
        self.w = var([hidden, hidden], "w", 0.7)
        self.u = var([hidden, hidden], "u", 0.7)
        self.b = var([hidden], "b", 0.1)
        self.out = var([hidden, vocab_size], "out", 1.5)
        self.out_bias = var([vocab_size], "out_bias", 0.5)

    def initial_state(self, batch_size, max_length=None):
        del max_length
        return tf.zeros([batch_size, self.hidden])

    def _cell(self, h, ids):
        x = tf.gather(self.embedding, ids)  # [batch, hidden]
        return tf.tanh(x @ self.w + h @ self.u + self.b)

    def step(self, ids, state):
        self.steps_taken.assign_add(1)
        h = self._cell(state, ids)  # [batch, hidden]
        return h @ self.out + self.out_bias, h

    def __call__(self, ids, state=None, training=False):
        del training
        h0 = self.initial_state(tf.shape(ids)[0]) if state is None else state
        hs = tf.scan(self._cell, tf.transpose(ids), initializer=h0)  # [time, batch, hidden]
        hs = tf.transpose(hs, [1, 0, 2])  # [batch, time, hidden]
        return hs @ self.out + self.out_bias, hs[:, -1]


class TinyAttention(_Base):
    """One causal single-head attention layer over token + position embeddings.

    The cache holds keys and values for ``max_length`` positions, allocated
    up front, plus each row's next position.
    """

    stateful = False

    def __init__(self, vocab_size: int = 12, dim: int = 8, max_positions: int = 32, seed: int = 0) -> None:
        super().__init__(vocab_size=vocab_size)
        rng = np.random.RandomState(seed)
        self.dim = dim
        self.max_positions = max_positions

        def var(shape, name, scale=1.0):
            return tf.Variable((scale * rng.randn(*shape)).astype(np.float32), name=name)

        self.embedding = var([vocab_size, dim], "embedding")
        self.positions = var([max_positions, dim], "positions", 0.5)
        self.wq = var([dim, dim], "wq", 0.5)
        self.wk = var([dim, dim], "wk", 0.5)
        self.wv = var([dim, dim], "wv", 0.5)
        self.out = var([dim, vocab_size], "out", 1.0)

    def initial_state(self, batch_size, max_length=None):
        length = self.max_positions if max_length is None else max_length
        return {"keys": tf.zeros([batch_size, length, self.dim]),
                "values": tf.zeros([batch_size, length, self.dim]),
                "position": tf.zeros([batch_size], tf.int32)}

    def step(self, ids, state):
        self.steps_taken.assign_add(1)
        position = state["position"]  # [batch]
        x = tf.gather(self.embedding, ids) + tf.gather(self.positions, position)  # [batch, dim]
        length = state["keys"].shape[1]
        slot = tf.one_hot(position, length)[:, :, tf.newaxis]  # [batch, length, 1]
        keys = state["keys"] + slot * (x @ self.wk)[:, tf.newaxis, :]
        values = state["values"] + slot * (x @ self.wv)[:, tf.newaxis, :]
        scores = tf.einsum("bd,btd->bt", x @ self.wq, keys) / np.sqrt(self.dim)  # [batch, length]
        visible = tf.range(length)[tf.newaxis, :] <= position[:, tf.newaxis]
        weights = tf.nn.softmax(tf.where(visible, scores, -1e9))
        h = x + tf.einsum("bt,btd->bd", weights, values)  # [batch, dim]
        return h @ self.out, {"keys": keys, "values": values, "position": position + 1}

    def __call__(self, ids, state=None, training=False):
        del training
        if state is not None:
            raise NotImplementedError("TinyAttention.__call__ starts from an empty cache only")
        time = tf.shape(ids)[1]
        x = tf.gather(self.embedding, ids) + self.positions[tf.newaxis, :time]  # [batch, time, dim]
        scores = tf.einsum("bsd,btd->bst", x @ self.wq, x @ self.wk) / np.sqrt(self.dim)
        causal = tf.linalg.band_part(tf.ones([time, time], tf.bool), -1, 0)  # [time, time]
        weights = tf.nn.softmax(tf.where(causal[tf.newaxis], scores, -1e9))
        h = x + tf.einsum("bst,btd->bsd", weights, x @ self.wv)
        return h @ self.out, None


def check_decidable_nucleus(logits, p, temperature, k):
    """Fails (with its own message) where float32 rounding could move a row's nucleus or top-k boundary: the
    mass before a token within n x float32's epsilon of p (a cumulative sum of n terms errs by at most about
    that much), or the k-th and (k+1)-th scores that close. Then the test would test the CPU, not the sampler."""
    bound = logits.shape[-1] * np.finfo(np.float32).eps
    for row in np.asarray(logits, np.float64) / temperature:
        ranked = np.sort(row)[::-1]
        if k is not None and k < len(ranked):
            assert ranked[k - 1] - ranked[k] > bound, "top-k boundary within rounding: pick other logits"
        kept = ranked[:k]
        probs = np.exp(kept - kept.max())
        probs /= probs.sum()
        before = np.concatenate([[0.0], np.cumsum(probs)[:-1]])
        assert p >= 1 or np.min(np.abs(before - p)) > bound, "nucleus boundary within rounding: pick other logits"
