"""A model folder ready to serve: its model in slots, its engine, its prompts; requests in, replies out.

:class:`Server` is what the HTTP app (:mod:`lmkit.serve.app`) stands on and
what tests drive without HTTP: :meth:`Server.sequences` turns a checked
request (:class:`~lmkit.serve.protocol.Params`) into the engine's sequences
(or a 400 that gives the prompt's length and the context), and
:class:`Collector` gathers the engine's events into a response's choices.
"""

from __future__ import annotations

import dataclasses
import os
import random
from typing import Any, Dict, List, Optional

from lmkit.core.errors import UsageError
from lmkit.serve.engine import Engine, Sampling, Sequence
from lmkit.serve.metrics import Metrics
from lmkit.serve.protocol import ApiError, Params, logprobs_object
from lmkit.serve.text import Prompts

__all__ = ["Collector", "ServeOptions", "Server"]

#: New tokens of a completion that gives no max_tokens (OpenAI's default).
DEFAULT_COMPLETION_TOKENS = 16


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """The settings of ``lmkit serve`` (its flags).

    Attributes:
      api_key: the Bearer token every API request must carry (None: none asked).
      max_batch: sequences decoded side by side (slots of the cache).
      max_queue: sequences that may wait for a slot (more: 429).
      request_timeout: seconds a request may take, waiting included (0: no limit).
      prefill_chunk: tokens of a prompt fed per prefill call, between decode steps (a call takes several
        prompts that join together, ``2 * prefill_chunk`` tokens in all).
      context: positions per slot (None: what ``lmkit generate`` reads before its window slides: a
        run's trained window, else the model's ``max_positions``).
      chat_template: a Jinja chat template file (None: the folder's, if it has one).
      model_name: the ``model`` requests name (None: the folder's name).
      jit_compile: compile the decode step and the prefill with XLA.
    """

    api_key: Optional[str] = None
    max_batch: int = 16
    max_queue: int = 64
    request_timeout: float = 600.0
    prefill_chunk: int = 64
    context: Optional[int] = None
    chat_template: Optional[str] = None
    model_name: Optional[str] = None
    jit_compile: bool = True

    def check(self) -> "ServeOptions":
        """Raises UsageError naming the first flag out of range."""
        for flag, value, ok in (("--max_batch", self.max_batch, self.max_batch >= 1),
                                ("--max_queue", self.max_queue, self.max_queue >= 0),
                                ("--request_timeout", self.request_timeout, self.request_timeout >= 0),
                                ("--prefill_chunk", self.prefill_chunk, self.prefill_chunk >= 1),
                                ("--context", self.context, self.context is None or self.context >= 2)):
            if not ok:
                raise UsageError(f"{flag} {value} is out of range; see lmkit serve --help")
        return self


def _chat_template(folder: Any, path: Optional[str]) -> Any:
    """The template a chat is laid out with: the file given, else the folder's (or its source's), else None."""
    from lmkit.hub.chat import ChatTemplate, read_chat_template
    if path is not None:
        if not os.path.isfile(path):
            raise UsageError(f"--chat_template {path} does not exist; give a Jinja chat template file")
        with open(path, encoding="utf-8") as f:
            source = f.read()
        special = {}
        origin = folder.pretrained_source()
        if origin is not None:
            try:
                special = read_chat_template(origin).special_tokens
            except UsageError:
                special = {}
        return ChatTemplate(source, special, path)
    origin = folder.pretrained_source()
    if origin is None:
        return None
    try:
        return read_chat_template(origin)
    except UsageError:
        return None


class Server:
    """A model folder loaded for serving.

    Args:
      model_dir: an lmkit run or a Hugging Face folder of a language model (any family).
      options: :class:`ServeOptions`.

    Raises:
      UsageError: an encoder-decoder, a folder lmkit cannot read, a bad option.
    """

    def __init__(self, model_dir: str, options: ServeOptions = ServeOptions()) -> None:
        from lmkit.decoding.source import open_folder
        from lmkit.serve.slots import SlotModel
        self.options = options.check()
        folder = open_folder(model_dir)
        if folder.conditional:
            raise UsageError(f"{model_dir} holds an encoder-decoder; lmkit serve serves language models "
                             "(use lmkit generate --source_file for an encoder-decoder)")
        generator = folder.load()
        self.model_name = options.model_name or os.path.basename(os.path.normpath(model_dir))
        self.prompts = Prompts(generator.tokenizer, _chat_template(folder, options.chat_template))
        window = int(getattr(generator.model, "max_positions", 0) or 0) or None
        context = options.context or generator.trained_context() or window or 1024
        self.context = min(context, window) if window else context
        self.slots = SlotModel(generator.model, options.max_batch, self.context, options.prefill_chunk,
                               vocab_limit=self.prompts.vocab_limit, jit_compile=options.jit_compile)
        self.metrics = Metrics()
        self.engine = Engine(self.slots, self.prompts, options.max_queue, self.metrics)
        self.metrics.counts = self.engine.counts

    def warm_up(self) -> None:
        """Compiles the step and the prefills before the first request."""
        import numpy as np
        for rows, size in self.slots.prefill_shapes():  # each prefill shape compiled once
            self.slots.prefill_many([(slot, [0] * size, 0) for slot in range(rows)])
        for width in self.slots.widths:  # each width of the step compiled once
            active = np.arange(self.slots.slots) == width - 1
            self.slots.step(np.zeros(self.slots.slots, np.int32), active)

    def sequences(self, params: Params) -> List[Sequence]:
        """The engine's sequences of a request: each prompt ``n`` times.

        Raises:
          ApiError: 400 for a prompt that leaves no room in the context (both numbers given), a bad stop
            string or prompt, a chat without a template.
        """
        try:
            inputs = self._inputs(params)
            stop = self.prompts.check_stop(params.stop)
        except UsageError as exc:
            raise ApiError(400, str(exc), "messages" if params.chat else "prompt") from None
        seed = random.SystemRandom().randrange(2 ** 31) if params.seed is None else params.seed
        out = []
        for i, (ids, prompt, extra) in enumerate(inputs):
            room = self.context - len(ids)
            if room < 1:
                raise ApiError(400, f"the prompt has {len(ids)} tokens and the context holds {self.context}, which "
                                    "leaves no room for a new token; shorten the prompt", "prompt",
                               "context_length_exceeded")
            budget = params.max_tokens or (room if params.chat else DEFAULT_COMPLETION_TOKENS)
            for j in range(params.n):
                sampling = Sampling(params.temperature, params.top_p, params.top_k, seed, i * params.n + j)
                out.append(Sequence(ids, prompt, min(budget, room), sampling, tuple(stop + extra), i * params.n + j,
                                    params.logprobs))
        self.metrics.prompt(sum(len(s.prompt) for s in out))
        return out

    def _inputs(self, params: Params) -> List[Any]:
        """``(model input, the prompt's own ids, stop strings the prompt adds)`` per prompt."""
        if params.chat:
            if self.prompts.chat is None:
                raise ApiError(400, "this model has no chat template: start lmkit serve with --chat_template FILE (a "
                                    "Jinja chat template), or use /v1/completions", "messages", "no_chat_template")
            ids, extra = self.prompts.messages(params.messages)
            return [(ids, ids, extra)]
        lead = 0 if self.prompts.start_id is None else 1
        inputs = [self.prompts.text(p) if isinstance(p, str) else self.prompts.started(p) for p in params.prompts]
        return [(ids, ids[lead:], []) for ids in inputs]

    def echo(self, sequence: Sequence, top: Optional[int]) -> Dict[str, Any]:
        """The prompt's share of a completion's ``logprobs`` (``echo``): its tokens scored by the model."""
        lead = len(sequence.ids) - len(sequence.prompt)
        chosen, best, best_ids = self.slots.score(sequence.ids)
        tokens = [self.prompts.token_text(t) for t in sequence.prompt]
        logprobs: List[Optional[float]] = []
        tops: List[Optional[Dict[str, float]]] = []
        for k in range(len(sequence.prompt)):
            at = lead + k - 1  # the score of input token lead + k
            if at < 0:
                logprobs.append(None)
                tops.append(None)
                continue
            logprobs.append(float(chosen[at]))
            tops.append({self.prompts.token_text(t): float(v) for t, v in
                         zip(best_ids[at][:top or 0], best[at][:top or 0])} if top else {})
        return logprobs_object(tokens, logprobs, tops)


class Collector:
    """The replies of one request, from the engine's events (a non-streamed response's choices)."""

    def __init__(self, server: Server, params: Params, sequences: List[Sequence]) -> None:
        self.server, self.params, self.sequences = server, params, sequences
        self.text = {s.index: "" for s in sequences}
        self.entries: Dict[int, List[Dict[str, Any]]] = {s.index: [] for s in sequences}
        self.reasons: Dict[int, Optional[str]] = {s.index: None for s in sequences}

    def add(self, index: int, text: str, entries: List[Dict[str, Any]], reason: Optional[str]) -> None:
        self.text[index] += text
        self.entries[index] += entries
        self.reasons[index] = reason

    @property
    def done(self) -> bool:
        return all(r is not None for r in self.reasons.values())

    def failure(self) -> Optional[str]:
        """``timeout``, ``error`` or ``cancelled`` when a sequence ended so; else None."""
        return next((r for r in self.reasons.values() if r in ("timeout", "error", "cancelled")), None)

    def choices(self) -> List[Dict[str, Any]]:
        out = []
        for s in self.sequences:
            text, logprobs = self.text[s.index], None
            if self.params.chat:
                choice = {"index": s.index, "message": {"role": "assistant", "content": text}}
            else:
                if self.params.logprobs is not None:
                    logprobs = self._logprobs(s)
                prompt_text = self.server.prompts.tokenizer.decode(s.prompt) if self.params.echo else ""
                choice = {"index": s.index, "text": prompt_text + text}
            choice.update(logprobs=logprobs, finish_reason=self.reasons[s.index])
            out.append(choice)
        return out

    def _logprobs(self, s: Sequence) -> Dict[str, Any]:
        token_text = self.server.prompts.token_text
        top = self.params.logprobs
        new = logprobs_object([token_text(e["token"]) for e in self.entries[s.index]],
                              [e["logprob"] for e in self.entries[s.index]],
                              [{token_text(t): v for t, v in e["top"]} for e in self.entries[s.index]])
        if not self.params.echo:
            return new
        echoed = self.server.echo(s, top)
        start = sum(len(t) for t in echoed["tokens"])
        return {key: echoed[key] + new[key] if key != "text_offset" else
                echoed[key] + [start + o for o in new[key]] for key in new}

    def usage(self) -> Dict[str, int]:
        from lmkit.serve.protocol import usage
        prompts = {s.index // self.params.n: len(s.prompt) for s in self.sequences}
        return usage(sum(prompts.values()), sum(len(s.generated) for s in self.sequences))
