"""The model side of the server: one cache of ``slots`` rows, one compiled decode step, chunked prefill.

    slots = SlotModel(model, slots=16, length=256, chunk=64)
    done, logits = slots.prefill(3, prompt_ids, 0)        # the next chunk of slot 3's prompt
    fed = slots.prefill_many([(3, ids3, 0), (5, ids5, 0)])  # the next chunks of several, in one call
    logits, greedy = slots.step(last_tokens, decoding)   # one token for every decoding slot

The state is the model's own (``model.initial_state(slots, length)``: a
transformer's key/value cache pre-allocated for ``length`` positions, an
RNN's state), every tensor with the slot first. A decode step feeds one token
to every slot at once through ``model.step`` (each row at its own position,
:class:`~lmkit.layers.transformer.TransformerState`), compiled once with XLA;
rows that are not decoding (free, or still taking their prompt) keep their
position, so they never run past the cache. A prompt goes in by chunks of
``chunk`` tokens through ``model(ids, state)`` on its slot's row,
padded to one of a few sizes (8, 32, ``chunk``; the padding's keys sit past
the row's position, where the causal mask hides them until real tokens
replace them). Prompts that join together go in together: one call feeds
the next chunk of each of 1, 4 or 16 rows (padded with copies of the first),
as many as fit in ``2 * chunk`` tokens, so sixteen short prompts cost one
call, not sixteen (one compiled prefill per rows and size). An RNN's state
has no positions: its chunks go in one prompt at a time, at their own
length, without XLA.

Sampling imports the samplers' math (:class:`~lmkit.decoding.samplers.TopPSampler`):
the temperature divides each row's logits before the sampler sees them, and
each row draws with its own ``(seed, position, row)`` seed, so a request
samples the tokens ``lmkit generate --seed`` gives it alone.
"""

from __future__ import annotations

import collections
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from lmkit.core.xla import use_autograph
from lmkit.decoding.sampler import positional
from lmkit.decoding.samplers import GreedySampler, TopPSampler

__all__ = ["SlotModel", "TOP_LOGPROBS"]

#: The most top log-probabilities a prompt's scoring returns per token (OpenAI allows 5).
TOP_LOGPROBS = 20
#: Compiled samplers kept, one per (top_p, top_k): a client cannot grow the trace cache without bound.
_SAMPLERS_KEPT = 16


def _rows_where(active: tf.Tensor, new: tf.Tensor, old: tf.Tensor) -> tf.Tensor:
    """``new`` where ``active`` [slots], else ``old`` (any rank, slot first)."""
    mask = tf.reshape(active, [-1] + [1] * (new.shape.rank - 1))
    return tf.where(mask, new, old)


class SlotModel:
    """A language model's state for ``slots`` concurrent sequences, with its compiled step and prefill.

    Args:
      model: a language model (``initial_state``, ``__call__(ids, state)``, ``step``; docs/design.md).
      slots: the rows of the cache (``--max_batch``).
      length: positions per row: a sequence's prompt and new tokens together.
      chunk: prompt tokens per prefill call (``--prefill_chunk``).
      vocab_limit: ids at and past it are never chosen (a vocabulary padded past its tokenizer's).
      jit_compile: compile the step and the prefill with XLA.
    """

    def __init__(self, model: Any, slots: int, length: int, chunk: int, vocab_limit: Optional[int] = None,
                 jit_compile: bool = True) -> None:
        self.model, self.slots, self.length = model, int(slots), int(length)
        self.chunk = max(1, min(int(chunk), self.length))
        # The padded chunk's sizes: a short prompt (or a prompt's last piece) takes the smallest that holds it,
        # not a whole chunk of compute (one compiled prefill each).
        self.chunks = sorted({min(size, self.chunk) for size in (8, 32, self.chunk)})
        self.widths = sorted({min(width, self.slots) for width in (1, 4, 16, self.slots)})  # the step's row counts
        self.budget = 2 * self.chunk  # the most tokens (rows x size) one prefill call feeds
        self.vocab_size = int(model.vocab_size)
        self.vocab_limit = vocab_limit if vocab_limit and vocab_limit < self.vocab_size else None
        self.state = model.initial_state(self.slots, self.length)
        self._structure = self.state  # every state handed back in this nest: one trace of each function
        self.positional = positional(self.state)
        self._fresh = model.initial_state(1, self.length)  # an RNN row's state before its prompt
        self.jit_compile = jit_compile
        autograph = use_autograph(model)  # lmkit's models trace without it (start-up time)
        self._step = tf.function(self._step_graph, jit_compile=jit_compile, autograph=autograph)
        # Traced once for every (rows, size): XLA compiles each shape it meets (prefill_shapes(), a few), and
        # TensorFlow warns of a function traced 5 times in a row. An RNN's chunks, of any length, skip XLA.
        spec = [tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), self.state),
                tf.TensorSpec([None], tf.int32), tf.TensorSpec([None, None], tf.int32),
                tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.int32)]
        self._prefill = tf.function(self._prefill_graph, input_signature=spec, autograph=autograph,
                                    jit_compile=jit_compile if self.positional else None)
        self._score = tf.function(self._score_graph, input_signature=[tf.TensorSpec([1, None], tf.int32)],
                                  autograph=autograph)
        self._samplers: "collections.OrderedDict[Tuple[float, Optional[int]], Any]" = collections.OrderedDict()

    # -- compiled ----------------------------------------------------------------------------------
    def _limited(self, logits: tf.Tensor) -> tf.Tensor:
        logits = tf.cast(logits, tf.float32)
        if self.vocab_limit is None:
            return logits
        return tf.where(tf.range(self.vocab_size) >= self.vocab_limit, -float("inf"), logits)

    def _step_graph(self, ids: tf.Tensor, active: tf.Tensor, full: Any, width: int) -> Tuple[tf.Tensor, tf.Tensor, Any]:
        state = before = tf.nest.map_structure(lambda t: t[:width], full) if width < self.slots else full
        if self.positional:  # a row that does not decode writes (harmlessly) where its next token will go
            state = state._replace(positions=tf.where(active, state.positions,
                                                      tf.minimum(state.positions, self.length - 1)))
        logits, state = self.model.step(ids, state)  # [slots, vocab]
        if self.positional:
            state = state._replace(positions=tf.where(active, state.positions, before.positions))
        else:
            state = tf.nest.map_structure(lambda new, old: _rows_where(active, new, old), state, before)
        logits = self._limited(logits)
        if width < self.slots:  # the rows past the width, as they were
            state = tf.nest.map_structure(lambda new, old: tf.concat([new, old[width:]], 0), state, full)
        return logits, GreedySampler().get_next_token(logits, 0, None), state

    def _prefill_graph(self, state: Any, slots: tf.Tensor, ids: tf.Tensor, starts: tf.Tensor,
                       counts: tf.Tensor) -> Tuple[tf.Tensor, Any]:
        """The next chunk ``ids`` [rows, size] of the prompts of ``slots`` [rows], from ``starts`` [rows];
        ``counts`` [rows] of each row's tokens are real. A slot given twice gets the same row twice."""
        rows = tf.nest.map_structure(lambda t: tf.gather(t, slots), state)
        if self.positional:
            rows = rows._replace(positions=starts)
        else:  # a new prompt starts from the model's initial state
            rows = tf.nest.map_structure(lambda t, f: _rows_where(starts > 0, t, f), rows, self._fresh)
        logits, rows = self.model(ids, rows)  # [rows, size, vocab]
        if self.positional:  # the padding does not count
            rows = rows._replace(positions=starts + counts)
        index = slots[:, tf.newaxis]
        state = tf.nest.map_structure(lambda t, r: tf.tensor_scatter_nd_update(t, index, r), state, rows)
        # A gather, not logits[:, count - 1]: XLA takes a slice's bounds as compile-time constants, and would
        # compile the prefill again for every prompt length.
        return self._limited(tf.gather(logits, counts - 1, batch_dims=1)), state

    def _score_graph(self, ids: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        logits, _ = self.model(ids, None)  # [1, time, vocab]
        log_probs = tf.nn.log_softmax(self._limited(logits[0]))  # [time, vocab]
        # Token t is scored by the logits after t - 1: the first token has no score.
        chosen = tf.gather(log_probs[:-1], ids[0, 1:], batch_dims=1)  # [time - 1]
        top, top_ids = tf.math.top_k(log_probs[:-1], k=min(TOP_LOGPROBS, self.vocab_size))
        return chosen, top, top_ids

    # -- host ----------------------------------------------------------------------------------------
    def prefill(self, slot: int, ids: Sequence[int], done: int) -> Tuple[int, Optional[tf.Tensor]]:
        """Feeds slot ``slot`` the next chunk of its prompt ``ids`` (``done`` of them are in).

        Returns:
          ``(tokens in, logits [vocab] after the last prompt token or None while some remain)``.
        """
        return self.prefill_many([(slot, ids, done)])[0]

    def prefill_many(self, prompts: Sequence[Tuple[int, Sequence[int], int]]) -> List[Tuple[int, Optional[tf.Tensor]]]:
        """Feeds the next chunk of each of the first of ``prompts`` (``(slot, ids, done)``, distinct slots) that
        fit in one call: 1, 4 or 16 rows of one padded size, ``2 * chunk`` tokens at most (the first always).

        Returns:
          For each prompt fed, in order (at least the first): as :meth:`prefill`.
        """
        if not self.positional:  # no padding in an RNN's chunk: one prompt at a time, at its own length
            prompts = prompts[:1]
        fed: List[Tuple[int, Sequence[int], int, int]] = []  # (slot, ids, done, end)
        size = 0
        for slot, ids, done in prompts:
            end = min(len(ids), done + self.chunk)
            wanted = max(size, self._chunk_size(end - done))
            if fed and (len(fed) == self.widths[-1] or self._width(len(fed) + 1) * wanted > self.budget):
                break
            fed.append((slot, ids, done, end))
            size = wanted
        rows = self._width(len(fed))
        slots_, tokens, starts, counts = [], [], [], []
        for slot, ids, done, end in fed + [fed[0]] * (rows - len(fed)):
            # The padded chunk stays inside the cache: near its end the chunk starts earlier and
            # writes a few cached positions again (the same keys and values).
            start = min(done, self.length - size) if self.positional else done
            slots_.append(slot)
            tokens.append(list(ids[start:end]) + [0] * (size - (end - start)))
            starts.append(start)
            counts.append(end - start)
        logits, state = self._prefill(self.state, tf.constant(slots_, tf.int32), tf.constant(tokens, tf.int32),
                                      tf.constant(starts, tf.int32), tf.constant(counts, tf.int32))
        self.state = self._same_nest(state)
        return [(end, logits[i] if end == len(ids) else None) for i, (_, ids, _, end) in enumerate(fed)]

    def _chunk_size(self, tokens: int) -> int:
        """The padded size of a chunk of ``tokens`` (an RNN's: its own)."""
        return next(c for c in self.chunks if c >= tokens) if self.positional else tokens

    def _width(self, rows: int) -> int:
        """The fewest rows of a compiled call (1, 4, 16, all) that hold ``rows``: the step's, a prefill's."""
        return next(w for w in self.widths if w >= rows)

    def prefill_shapes(self) -> List[Tuple[int, int]]:
        """``(rows, size)`` of every prefill call :meth:`prefill_many` can make (each compiled once)."""
        if not self.positional:
            return [(1, size) for size in self.chunks]
        return [(rows, size) for size in self.chunks for rows in self.widths if rows == 1 or rows * size <= self.budget]

    def step(self, tokens: np.ndarray, active: np.ndarray) -> Tuple[tf.Tensor, np.ndarray]:
        """One token for every slot up to the last active one (``tokens`` [slots]); only ``active`` rows move on.

        The step runs on the first 1, 4, 16 or all slots, the fewest that hold every active row (one
        compiled step each): one request alone does not pay for sixteen.

        Returns:
          ``(logits [width, vocab] float32, the greedy tokens [width])``, ``width`` >= the last active row + 1.
        """
        used = int(np.max(np.nonzero(active)[0])) + 1 if np.any(active) else 1
        width = self._width(used)
        logits, greedy, state = self._step(tf.constant(tokens[:width], tf.int32),
                                           tf.constant(active[:width], tf.bool), self.state, width)
        self.state = self._same_nest(state)
        return logits, greedy.numpy()

    def _same_nest(self, state: Any) -> Any:
        """``state`` in the nest of the initial state (a model may hand back lists for tuples: another trace)."""
        return tf.nest.pack_sequence_as(self._structure, tf.nest.flatten(state))

    def sample(self, logits: tf.Tensor, rows: Sequence[int], temperatures: Sequence[float],
               seeds: Sequence[Sequence[int]], top_p: float, top_k: Optional[int]) -> np.ndarray:
        """Tokens drawn for ``rows`` of ``logits`` [rows of the step, vocab] with one (top_p, top_k).

        Args:
          rows: which rows; temperatures: each row's, > 0; seeds: each row's ``(seed, position, row)``.

        Returns:
          int32 [len(rows)] token ids.
        """
        key = (float(top_p), top_k)
        draw = self._samplers.pop(key, None) or self._sampler(TopPSampler(p=top_p, temperature=1.0, k=top_k))
        self._samplers[key] = draw
        while len(self._samplers) > _SAMPLERS_KEPT:
            self._samplers.popitem(last=False)
        width = int(logits.shape[0])  # one shape per sampler: rows padded with the first
        pad = width - len(rows)
        picked = draw(logits, tf.constant(list(rows) + [rows[0]] * pad, tf.int32),
                      tf.constant(list(temperatures) + [1.0] * pad, tf.float32),
                      tf.constant([list(s) for s in seeds] + [list(seeds[0])] * pad, tf.int64))
        return picked.numpy()[:len(rows)]

    def _sampler(self, sampler: TopPSampler) -> Any:
        def draw(logits: tf.Tensor, rows: tf.Tensor, temperatures: tf.Tensor, seeds: tf.Tensor) -> tf.Tensor:
            scaled = tf.gather(logits, rows) / temperatures[:, tf.newaxis]  # lmkit generate's logits / T
            return sampler.get_next_token(scaled, 0, seeds)
        return tf.function(draw, jit_compile=self.jit_compile, autograph=use_autograph(sampler))

    def score(self, ids: Sequence[int]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Log-probabilities of a prompt's tokens: ``(chosen [n - 1], top [n - 1, k], top ids [n - 1, k])``."""
        chosen, top, top_ids = self._score(tf.constant([list(ids)], tf.int32))
        return chosen.numpy(), top.numpy(), top_ids.numpy()
