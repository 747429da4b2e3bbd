"""The engine: requests share decode steps in a fixed set of slots (continuous batching), free of HTTP.

    engine = Engine(slot_model, prompts, max_queue=64)
    engine.start()
    request = engine.submit([Sequence(ids, settings, ...)], on_event)  # or QueueFull
    ... on_event(sequence, text, tokens, logprobs, finish_reason) from the engine's thread ...
    engine.stop(grace=30)

One thread runs the loop: it moves waiting sequences into free slots, feeds
the next chunk of the joining prompts, the oldest first, as many as one call
takes (:meth:`SlotModel.prefill_many`), then runs one decode step for every
decoding slot (:meth:`SlotModel.step`) and hands each sequence its token.
A sequence leaves its slot the step it ends (an end token, a stop string,
``max_tokens``, the end of the context), is cancelled (its client left) or
passes its deadline; the slot takes the next waiting sequence at once.
Greedy rows take the step's argmax; sampled rows draw with their own seed,
position and row, so each gets the tokens it would alone.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple
from typing import Sequence as Seq

import numpy as np

from lmkit.serve.text import Reply

__all__ = ["Engine", "QueueFull", "Request", "Sampling", "Sequence"]


class QueueFull(Exception):
    """No free slot and ``max_queue`` sequences waiting: the request is refused (HTTP 429)."""


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How a sequence picks its tokens: ``temperature`` 0 is greedy; else ``lmkit generate --strategy top_p
    --top_p P --top_k K --temperature T --seed S``, as row ``row`` of that run (its sample number)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: Optional[int] = None
    seed: int = 0
    row: int = 0


@dataclasses.dataclass(eq=False)
class Sequence:
    """One reply being generated: a prompt in a slot, its tokens, and why it ended.

    Args:
      ids: the model's input (the start token included); prompt: the prompt's own ids (for the text).
      max_tokens: new tokens at most; stop: stop strings; index: the reply's ``index`` in its response.
      logprobs: top log-probabilities to report per new token (None: none).
    """

    ids: List[int]
    prompt: List[int]
    max_tokens: int
    sampling: Sampling = Sampling()
    stop: Tuple[str, ...] = ()
    index: int = 0
    logprobs: Optional[int] = None
    request: Any = None
    slot: Optional[int] = None
    fed: int = 0  # prompt tokens in the cache
    generated: List[int] = dataclasses.field(default_factory=list)
    finish_reason: Optional[str] = None
    reply: Optional[Reply] = None

    @property
    def position(self) -> int:
        """The position of the token being chosen next (the prompt counted)."""
        return len(self.ids) + len(self.generated)


#: ``on_event(sequence, new text, new tokens, logprob entries, finish reason or None)``, on the engine's thread.
OnEvent = Callable[[Sequence, str, List[int], List[Dict[str, Any]], Optional[str]], None]


@dataclasses.dataclass(eq=False)
class Request:
    """The sequences of one HTTP request and what they report to."""

    sequences: List[Sequence]
    on_event: OnEvent
    deadline: float = float("inf")
    cancelled: bool = False
    submitted: float = dataclasses.field(default_factory=time.monotonic)
    first_token: Optional[float] = None

    @property
    def done(self) -> bool:
        return all(s.finish_reason is not None for s in self.sequences)


class Engine:
    """Continuous batching over a :class:`~lmkit.serve.slots.SlotModel`.

    Args:
      slots: the model's slots (:class:`~lmkit.serve.slots.SlotModel`).
      prompts: the folder's :class:`~lmkit.serve.text.Prompts` (end ids, tokenizer, token texts).
      max_queue: sequences that may wait for a slot beyond the free ones; more is :class:`QueueFull`.
      metrics: a :class:`~lmkit.serve.metrics.Metrics` (or None).
    """

    def __init__(self, slots: Any, prompts: Any, max_queue: int = 64, metrics: Any = None) -> None:
        self.model, self.prompts, self.max_queue, self.metrics = slots, prompts, int(max_queue), metrics
        self.ends = set(prompts.end_ids)
        self.waiting: Deque[Sequence] = collections.deque()
        self.running: List[Optional[Sequence]] = [None] * slots.slots
        self.lock = threading.Condition()
        self.stopping = False
        self.steps = 0
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._loop, name="lmkit-engine", daemon=True)
        # Seconds to pause after each decode step: lets tests and demos watch requests mid-stream.
        self.step_delay = float(os.environ.get("LMKIT_SERVE_STEP_DELAY", "0") or 0)

    # -- the caller's side (any thread) -----------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def submit(self, sequences: List[Sequence], on_event: OnEvent, timeout: Optional[float] = None) -> Request:
        """Queues a request's sequences.

        Raises:
          QueueFull: the queue cannot take them now.
        """
        deadline = float("inf") if not timeout else time.monotonic() + timeout
        request = Request(sequences, on_event, deadline)
        for s in sequences:
            s.request = s.request or request
            s.reply = Reply(self.prompts.tokenizer, s.prompt, s.stop)
        with self.lock:
            if self.stopping or self.error is not None:
                raise QueueFull("the server is shutting down")
            free = sum(s is None for s in self.running)  # a free slot takes a sequence at the next step
            if len(self.waiting) + len(sequences) > self.max_queue + free:
                raise QueueFull(f"{len(self.waiting)} sequences wait for the {len(self.running) - free} slots in use "
                                f"(--max_queue {self.max_queue})")
            self.waiting.extend(sequences)
            self.lock.notify()
        return request

    def cancel(self, request: Request) -> None:
        """Ends ``request`` at the next step (its client left or its time ran out); its slots free up."""
        request.cancelled = True
        with self.lock:
            self.lock.notify()

    def counts(self) -> Tuple[int, int]:
        """``(sequences in slots, sequences waiting)``."""
        with self.lock:
            return sum(s is not None for s in self.running), len(self.waiting)

    def stop(self, grace: float = 0.0) -> bool:
        """Takes no more requests; waits up to ``grace`` seconds for the running ones, then ends the rest.

        Returns:
          True when every request finished on its own.
        """
        with self.lock:
            self.stopping = True
            self.lock.notify()
        end = time.monotonic() + grace
        while time.monotonic() < end and any(self.counts()):
            time.sleep(0.02)
        finished = not any(self.counts())
        with self.lock:
            for s in list(self.waiting) + [s for s in self.running if s is not None]:
                s.request.cancelled = True
            self.lock.notify()
        if self.thread.ident is not None:  # started
            self.thread.join(timeout=10)
        return finished

    # -- the engine's thread ----------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while True:
                with self.lock:
                    if self.stopping and not any(self.running) and (not self.waiting or self._all_cancelled()):
                        self._drop_waiting()
                        return
                    self._admit()
                    if not any(self.running) and not self.waiting:
                        self.lock.wait(0.1)
                        continue
                self._drop_ended()
                joining = [s for s in self.running if s is not None and s.fed < len(s.ids)]
                if joining:  # one prefill call, then a decode step: a join stalls the others little
                    self._prefill(sorted(joining, key=lambda s: s.request.submitted))
                if any(s is not None and s.fed == len(s.ids) for s in self.running):
                    self._decode()
        except BaseException as exc:  # noqa: BLE001 - every request still open hears of it
            self.error = exc
            with self.lock:
                sequences = list(self.waiting) + [s for s in self.running if s is not None]
            for s in sequences:
                self._finish(s, "error")
            raise

    def _all_cancelled(self) -> bool:
        return all(s.request.cancelled for s in self.waiting)

    def _admit(self) -> None:
        """Waiting sequences into free slots, first come first served (under the lock)."""
        for slot, taken in enumerate(self.running):
            if taken is None and self.waiting:
                s = self.waiting.popleft()
                if s.request.cancelled or time.monotonic() > s.request.deadline:
                    self._finish(s, "cancelled" if s.request.cancelled else "timeout")
                    continue
                s.slot, s.fed = slot, 0
                self.running[slot] = s

    def _drop_waiting(self) -> None:
        while self.waiting:
            self._finish(self.waiting.popleft(), "cancelled")

    def _drop_ended(self) -> None:
        """Frees the slots of cancelled sequences and of those past their deadline."""
        now = time.monotonic()
        for s in self.running:
            if s is not None and (s.request.cancelled or now > s.request.deadline):
                self._finish(s, "cancelled" if s.request.cancelled else "timeout")

    def _prefill(self, joining: List[Sequence]) -> None:
        """The next chunk of the first of ``joining`` that one call takes; a prompt that is in gets its first token."""
        fed = self.model.prefill_many([(s.slot, s.ids, s.fed) for s in joining])
        for s, (done, logits) in zip(joining, fed):
            s.fed = done
            if logits is None:
                continue
            if s.sampling.temperature > 0:  # the prompt is in: its first token
                token = int(self.model.sample(logits[None], [0], [s.sampling.temperature], [self._seed(s)],
                                              s.sampling.top_p, s.sampling.top_k)[0])
            else:
                token = int(np.argmax(logits.numpy()))  # GreedySampler: the lowest id of the largest
            self._take(s, token, logits.numpy() if s.logprobs is not None else None)

    def _seed(self, s: Sequence) -> List[int]:
        return [s.sampling.seed, s.position, s.sampling.row]

    def _decode(self) -> None:
        rows = [s if s is not None and s.fed == len(s.ids) and s.finish_reason is None else None
                for s in self.running]
        tokens = np.array([s.generated[-1] if s is not None else 0 for s in rows], np.int32)
        logits, greedy = self.model.step(tokens, np.array([s is not None for s in rows]))  # [width, ...]
        self.steps += 1
        if self.step_delay:
            time.sleep(self.step_delay)
        chosen = {i: int(greedy[i]) for i, s in enumerate(rows) if s is not None and s.sampling.temperature == 0}
        groups: Dict[Tuple[float, Optional[int]], List[int]] = collections.defaultdict(list)
        for i, s in enumerate(rows):
            if s is not None and s.sampling.temperature > 0:
                groups[(s.sampling.top_p, s.sampling.top_k)].append(i)
        for (top_p, top_k), members in groups.items():
            drawn = self.model.sample(logits, members, [rows[i].sampling.temperature for i in members],
                                      [self._seed(rows[i]) for i in members], top_p, top_k)
            chosen.update(zip(members, (int(t) for t in drawn)))
        wanted = [i for i in chosen if rows[i].logprobs is not None]
        values = logits.numpy() if wanted else None
        for i, token in chosen.items():
            self._take(rows[i], token, None if values is None else values[i])

    def _take(self, s: Sequence, token: int, logits: Optional[np.ndarray]) -> None:
        """Hands ``token`` to its sequence; ends the sequence where it ends."""
        request = s.request
        if request.first_token is None:
            request.first_token = time.monotonic()
            if self.metrics is not None:
                self.metrics.first_token(request.first_token - request.submitted)
        s.generated.append(token)
        if self.metrics is not None:
            self.metrics.tokens(1)
        entries = [] if logits is None else [self._logprob(token, logits, s.logprobs)]
        reason = None
        if token in self.ends:
            reason = "stop"  # an end token is no text
        else:
            s.reply.add(token)
            if s.reply.stopped is not None:
                reason = "stop"
        if reason is None and (len(s.generated) >= s.max_tokens or s.position >= self.model.length):
            reason = "length"
        if reason is None:
            request.on_event(s, s.reply.new_text(False), [token], entries, None)
        else:
            self._finish(s, reason, [token], entries)

    def _logprob(self, token: int, logits: np.ndarray, top: int) -> Dict[str, Any]:
        shifted = logits - np.max(logits)
        log_probs = shifted - np.log(np.sum(np.exp(shifted)))
        best = np.argsort(-log_probs, kind="stable")[:max(top, 0)]
        return {"token": token, "logprob": float(log_probs[token]),
                "top": [(int(i), float(log_probs[i])) for i in best]}

    def _finish(self, s: Sequence, reason: str, tokens: Seq[int] = (), entries: Seq[Dict[str, Any]] = ()) -> None:
        """Ends ``s`` (it leaves its slot now) and tells its request."""
        if s.finish_reason is not None:
            return
        s.finish_reason = reason
        if s.slot is not None and self.running[s.slot] is s:
            self.running[s.slot] = None
        text = s.reply.new_text(True) if s.reply is not None else ""
        try:
            s.request.on_event(s, text, list(tokens), list(entries), reason)
        finally:
            with self.lock:
                self.lock.notify()
