"""A language model's text: prompts continued into samples, what :func:`lmkit.decoding.generate` runs for one.

On top of :func:`lmkit.decoding.decode` (token ids, one compiled loop)
:func:`continue_prompts` does what text needs:

* **line breaks are text**: a tokenizer's line-break id (lmkit's ``eos_id``)
  is written like any other token; a sample ends at its budget of new
  tokens, at a stop string, or at an end-of-document token where the model
  has one (a Hugging Face folder's ``eos_token_id``, every id of its
  ``generation_config.json``: ``<|endoftext|>``, or an instruct model's
  ``<|end_of_text|>`` and ``<|eot_id|>``). ``stop_at_eos`` also ends a
  sample at its first line break (one line per sample);
* **longer than the context**: a transformer that has filled its
  ``max_positions`` (or the ``context`` asked for) goes on from the last half
  of them (the key/value cache rebuilt from that window, one compiled loop
  reused for every window); LSTMs carry their state and need no window;
* **the prompt as encoded for the model**: a Hugging Face model reads the
  prompt's tokens as ``transformers``' ``tokenizer(prompt)`` gives them
  (the start token first where its tokenizer puts one, else nothing);
  lmkit's own models start after a line break, as every line of their
  training text does (``start_token`` changes either);
* **stop strings**: ``stop=["\\n\\n"]`` ends a sample where the string first
  appears in the generated text (the string not included);
* **streaming**: one sample written while it is generated.
"""

from __future__ import annotations

import dataclasses
import unicodedata
from typing import Any, List, Optional, Sequence, Tuple

from lmkit.core.errors import UsageError
from lmkit.decoding.config import GenerationConfig

__all__ = ["Generation", "check_stop_strings", "continue_prompts", "end_of_document_ids", "readable"]

# How much of a full window a transformer keeps when it slides: the last half.
SLIDE_KEEP = 0.5


@dataclasses.dataclass(frozen=True)
class Generation:
    """One sample: a language model's continuation of a prompt, or an encoder-decoder's output for a source.

    Attributes:
      text: the prompt, then the continuation (a stop string cut off); an encoder-decoder's output alone.
      ids: the prompt's ids, then the generated ones (a start token not included; an encoder-decoder's:
        the output's, its start and end ids not included).
      prompt_index, sample_index: which prompt (or source), and which of its samples.
      prompt_length: how many of ``ids`` are the prompt's (0 for an encoder-decoder).
      prompt_text: the prompt as the tokenizer reads it back ("" for an encoder-decoder).
      stopped_by: why the sample ended: ``"length"``, ``"eos"`` (a line
        break with ``stop_at_eos``, or the end-of-document token) or the stop
        string that ended it.
      seed: the seed that gives this sample again (None for greedy and beam search).
    """

    text: str
    ids: List[int]
    prompt_index: int
    sample_index: int
    prompt_length: int
    prompt_text: str
    stopped_by: str
    seed: Optional[int] = None

    @property
    def continuation(self) -> str:
        """The generated text alone."""
        return self.text[len(self.prompt_text):] if self.text.startswith(self.prompt_text) else self.text


def end_of_document_ids(tokenizer: Any) -> List[int]:
    """The tokens that end a document: a Hugging Face model's end ids (its folder's ``eos_token_id``,
    one or several, else ``<|endoftext|>``: :attr:`HFTokenizer.end_ids`), or none.

    lmkit's own tokenizers mark line ends only (their ``eos_id``), so text
    generation runs to the length asked for.
    """
    return list(getattr(tokenizer, "end_ids", None) or [])


def check_stop_strings(stop: Sequence[str], tokenizer: Any) -> List[str]:
    """``stop`` as a list; UsageError for an empty string or one the tokenizer cannot produce."""
    stop = [stop] if isinstance(stop, str) else list(stop or [])
    for s in stop:
        if not isinstance(s, str) or not s:
            raise UsageError(f"stop string {s!r} is empty; give the text that should end a sample, "
                             "e.g. --stop '\\n\\n'")
        ids = tokenizer.encode(s)
        unk = getattr(tokenizer, "unk_id", None)
        if not ids or (unk is not None and unk in ids) or tokenizer.decode(ids) != s:
            raise UsageError(f"stop string {s!r} cannot be produced by this model's {tokenizer.name} "
                             f"tokenizer (it reads back as {tokenizer.decode(ids)!r}); use text made "
                             "of the tokenizer's symbols")
    return stop


_KEEP_CONTROLS = {"\n", "\t"}


def readable(text: str) -> str:
    """``text`` with control characters other than line breaks and tabs shown escaped (``\\x07``).

    A byte or character model can write any code point; a raw control byte
    would move the terminal's cursor or ring its bell.
    """
    if all(c in _KEEP_CONTROLS or unicodedata.category(c) != "Cc" for c in text):
        return text
    return "".join(c if c in _KEEP_CONTROLS or unicodedata.category(c) != "Cc"
                   else repr(c)[1:-1] for c in text)


def start_id_of(tokenizer: Any, start_token: Optional[bool], unprompted: bool = False) -> Optional[int]:
    """The token put before every prompt.

    lmkit's own models start after a line break (``eos_id``), where every
    line of their training text starts. A Hugging Face model reads the prompt
    as ``transformers`` encodes it (``tokenizer(prompt)``): after the start
    token its tokenizer puts first (``<s>``, ``<|begin_of_text|>``), or as
    given where it puts none; ``start_token`` True puts ``<|endoftext|>`` (a
    document's start) there instead, False nothing.
    Without a prompt (``unprompted``) a Hugging Face model starts a document
    with its start token, else ``<|endoftext|>`` (as ``generate()`` without
    inputs starts from the model's ``bos_token_id``): an empty prompt always
    needs one.
    """
    if getattr(tokenizer, "name", None) == "hf":
        if start_token is False:
            return None
        first = tokenizer.start_ids
        own = first[0] if len(first) == 1 else None
        if own is None and (start_token or unprompted):
            return tokenizer.bos_id
        return own
    if start_token is False:
        return None
    return tokenizer.eos_id if tokenizer.eos_id is not None else tokenizer.bos_id


class _TextStreamer:
    """Writes one sample's text while it is generated (``on_token`` of the decode loop).

    Text is written once it cannot change: held back are the last characters
    that could still begin a stop string, and a trailing U+FFFD (a byte
    model's character whose UTF-8 bytes have not all come).
    """

    def __init__(self, tokenizer: Any, prompt: List[int], budget: int, end_ids: Sequence[int],
                 stop: Sequence[str], write: Any) -> None:
        self.tokenizer, self.prompt, self.budget, self.end_ids = tokenizer, prompt, budget, set(end_ids)
        self.stop, self.write = list(stop), write
        self.prompt_text = tokenizer.decode(prompt)
        self.generated: List[int] = []
        self.shown = 0
        self.done = False
        self.hold = max((len(x) for x in self.stop), default=1) - 1
        self._show(self.prompt_text, len(self.prompt_text))

    def _show(self, text: str, end: int) -> None:
        if end > self.shown:
            self.write(text[self.shown:end])
            self.shown = end

    def __call__(self, tokens: Any, generated: Any) -> None:
        if self.done or not bool(generated[0]):
            return
        token = int(tokens[0])
        if token in self.end_ids:
            self.done = True
            return
        self.generated.append(token)
        text = self.tokenizer.decode(self.prompt + self.generated)
        start = len(self.prompt_text) if text.startswith(self.prompt_text) else 0
        hits = [i for i in (text.find(x, start) for x in self.stop) if i >= 0]
        self.done = bool(hits) or len(self.generated) >= self.budget
        end = min(hits) if hits else len(text)
        if not self.done:
            end -= self.hold
            while end > self.shown and text[end - 1] == "\ufffd":
                end -= 1
        self._show(text, end)

    def finish(self, final_text: str) -> None:
        """Writes what the stream held back (the sample's text is ``final_text``)."""
        self._show(final_text, len(final_text))


def _chunk_seed(seed: int, chunk: int) -> int:
    """The seed of the ``chunk``-th window: ``seed`` for the first, a mix of both after it."""
    return seed if chunk == 0 else (seed * 6364136223846793005 + chunk * 1442695040888963407) % 2 ** 63


def _cut_at_stop(tokenizer: Any, prompt: List[int], generated: List[int], prompt_text: str,
                 stop: Sequence[str]) -> Tuple[List[int], Optional[str], Optional[str]]:
    """``(generated ids up to the stop, text before the stop, the stop string)``; no stop: (ids, None, None)."""
    text = tokenizer.decode(prompt + generated)
    start = len(prompt_text) if text.startswith(prompt_text) else 0
    found = [(text.find(s, start), s) for s in stop]
    found = [(i, s) for i, s in found if i >= 0]
    if not found:
        return generated, None, None
    at, which = min(found)
    for k in range(1, len(generated) + 1):  # the fewest tokens whose text holds the stop string
        if tokenizer.decode(prompt + generated[:k]).find(which, start) >= 0:
            return generated[:k], text[:at], which
    return generated, text[:at], which


def _window(model: Any, context: Optional[int]) -> Optional[int]:
    """The positions a transformer reads before its window slides (None: an RNN, no limit)."""
    window = getattr(model, "max_positions", None)
    return window if context is None or window is None else min(window, context)


class _Samples:
    """The rows of one :func:`continue_prompts` (one per sample; beam search: one per prompt), the
    arguments checked, and the decode of each window."""

    def __init__(self, model: Any, tokenizer: Any, prompts: Sequence[Sequence[int]], budgets: Sequence[int],
                 config: GenerationConfig, beam: bool) -> None:
        from lmkit.decoding.batch import check_seed
        self.model, self.tokenizer, self.config, self.beam = model, tokenizer, config, beam
        self.prompts = [list(p) for p in prompts]
        self.stop = list(config.stop or ())  # checked when the generation was planned
        self.start_id = start_id_of(tokenizer, config.start_token, unprompted=bool(prompts) and not any(prompts))
        if self.start_id is None and any(not p for p in prompts):
            raise UsageError("an empty prompt needs a start token, and this tokenizer has none; give a prompt")
        # What ends a sample (the decode loop stops at any of them): the end of a document, and with
        # stop_at_eos the end of a line.
        self.ends = list(dict.fromkeys(([tokenizer.eos_id] if config.stop_at_eos and tokenizer.eos_id is not None
                                        else []) + end_of_document_ids(tokenizer)))
        self.window = _window(model, config.context)
        self.lead = 0 if self.start_id is None else 1
        self.rows: List[List[int]] = []  # the model's input per row: start token, prompt (cut to fit the window)
        self.targets: List[int] = []  # the full length each row should reach (start token included)
        self.owner: List[Tuple[int, int]] = []  # (prompt, sample) of each row
        for i, p in enumerate(self.prompts):
            for j in range(1 if beam else config.num_samples):
                self.rows.append(self._started(p))
                self.targets.append(self.lead + len(p) + int(budgets[i]))
                self.owner.append((i, j))
        self.longest = max(self.targets)
        if self.window is not None and beam and self.longest > self.window:
            raise UsageError(f"beam search cannot go past the model's context of {self.window} tokens "
                             f"(asked for {self.longest - self.lead} with the prompt); ask for fewer tokens or use "
                             "another --strategy, which slides the window")
        if self.window is not None:  # the model reads the last window - 1 tokens of a long prompt
            self.rows = [r[max(0, len(r) - self.window + 1):] for r in self.rows]
        self.seed = None if beam else check_seed(config.seed)
        self.prompt_texts = [tokenizer.decode(p) for p in self.prompts]

    def _started(self, ids: List[int]) -> List[int]:
        return ([] if self.start_id is None else [self.start_id]) + ids

    def done(self, n: int, generated: List[int]) -> bool:
        """Whether row ``n``, having generated ``generated``, is finished."""
        i = self.owner[n][0]
        return bool((generated and generated[-1] in self.ends)
                    or self.lead + len(self.prompts[i]) + len(generated) >= self.targets[n]
                    or (self.stop and _cut_at_stop(self.tokenizer, self.prompts[i], generated, self.prompt_texts[i],
                                                   self.stop)[2]))

    def decode(self, sampler: Any, rows: List[List[int]], max_length: int, chunk: int, rules: Any,
               min_new_tokens: Any, on_token: Any = None) -> Any:
        """One window of every row: :func:`lmkit.decoding.decode` with the text's end ids and seed."""
        from lmkit.decoding.loop import decode
        config = self.config
        return decode(self.model, max_length, sampler, prompts=rows, rules=rules, on_token=on_token,
                      eos_id=self.ends or None, seed=None if self.seed is None else _chunk_seed(self.seed, chunk),
                      jit_compile=config.jit_compile, use_cache=config.use_cache, compiled=config.compiled,
                      repetition_penalty=config.repetition_penalty, min_new_tokens=min_new_tokens)

    def beam_samples(self, result: Any) -> List[Tuple[int, int, List[int], str]]:
        """``(prompt, sample, generated ids, why it ended)`` of a beam search's best hypotheses."""
        samples = []
        for i in range(len(self.prompts)):
            for j in range(self.config.num_samples):
                if result.beam_scores[i, j] > -float("inf"):  # -inf marks an unused slot
                    ids = result.beam_ids[i, j, :result.beam_lengths[i, j]].tolist()[len(self.rows[i]):]
                    samples.append((i, j, ids, "eos" if ids and ids[-1] in self.ends else "length"))
        return samples

    def finish(self, samples: List[Tuple[int, int, List[int], str]]) -> List[Generation]:
        """The :class:`Generation` of each ``(prompt, sample, generated ids, why)``: stop strings cut, an
        end token dropped."""
        out = []
        for i, j, g, why in samples:
            prompt = self.prompts[i]
            text = None
            if self.stop:
                g, text, which = _cut_at_stop(self.tokenizer, prompt, g, self.prompt_texts[i], self.stop)
                why = which or why
            if why == "eos":
                g = g[:-1]  # the end token is not text
            if text is None:
                text = self.tokenizer.decode(prompt + g)
            out.append(Generation(text=text, ids=prompt + g, prompt_index=i, sample_index=j,
                                  prompt_length=len(prompt), prompt_text=self.prompt_texts[i], stopped_by=why,
                                  seed=self.seed))
        return out


def continue_prompts(model: Any, tokenizer: Any, prompts: Sequence[Sequence[int]], budgets: Sequence[int],
                     config: GenerationConfig, *, sampler: Any = None, stream: Any = None) -> List[Generation]:
    """Samples from token-id prompts: the language model's half of :func:`lmkit.decoding.generate`, which plans
    its arguments (:func:`lmkit.decoding.plan.plan_generation`).

    Args:
      model: a language model; tokenizer: its tokenizer.
      prompts: token ids of each prompt (may be empty: start at a line start); budgets: new tokens of each.
      config: a resolved :class:`GenerationConfig`: ``num_samples`` (beam search: the best hypotheses of one
        search), ``seed``, ``stop``, ``stop_at_eos``, ``start_token``, ``repetition_penalty``,
        ``min_new_tokens``, ``context`` (positions read before the window slides), ``jit_compile`` and the
        rules on tokens (past a slide: the window's n-grams, no forced first token again, a forced last
        token only where no window slides). A model with more ids than its tokenizer never picks those.
      sampler: the strategy (default the config's).
      stream: a function that takes text: the one sample is written to it as it comes (no XLA then).

    Returns:
      The samples in prompt order, then sample order.

    Raises:
      UsageError: an empty prompt with no start token, beam search past the model's context, streaming more
        than one sample.
    """
    from lmkit.decoding.beam import BeamSampler
    sampler = config.sampler() if sampler is None else sampler
    run = _Samples(model, tokenizer, prompts, budgets, config, isinstance(sampler, BeamSampler))
    rules = config.rules()
    limit = getattr(tokenizer, "vocab_size", None)
    if limit is not None and int(model.vocab_size) > int(limit):  # a vocabulary padded past the tokenizer's
        rules = dataclasses.replace(rules, vocab_limit=int(limit))  # (nanoGPT's 50,304): those ids name no text
    rules = None if not rules.active else rules
    if rules is not None and run.window is not None and run.longest > run.window:  # the window slides
        rules = dataclasses.replace(rules, forced_last_id=None)
    streamer = None
    if stream is not None:
        if run.beam or len(run.rows) != 1:
            raise UsageError("streaming writes one sample as it comes; give one prompt and one sample "
                             "(not beam search), or turn streaming off")
        streamer = _TextStreamer(tokenizer, run.prompts[0], run.targets[0] - run.lead - len(run.prompts[0]),
                                 run.ends, run.stop, stream)
    min_new = config.min_new_tokens
    length = run.longest if run.window is None else min(run.window, run.longest)
    result = run.decode(sampler, run.rows, length, 0, rules, [min_new] * len(run.rows) if min_new else 0, streamer)
    if run.beam:
        samples = run.beam_samples(result)
    else:
        generated = [seq[len(r):] for seq, r in zip(result.sequences(include_prompt=True), run.rows)]
        generated = _slide(run, sampler, generated, rules, streamer)
        samples = []
        for n, g in enumerate(generated):
            i, j = run.owner[n]
            g = g[:max(0, run.targets[n] - run.lead - len(run.prompts[i]))]
            samples.append((i, j, g, "eos" if g and g[-1] in run.ends else "length"))
    out = run.finish(samples)
    if streamer is not None:
        streamer.finish(out[0].text)
    return out


def _slide(run: _Samples, sampler: Any, generated: List[List[int]], rules: Any, streamer: Any) -> List[List[int]]:
    """Goes on past a full window until every row is done: from the last part of it, the cache rebuilt
    from that (the ``streamer`` still writing). Every window has the same shape, so the compiled loop is
    reused."""
    ended = [run.done(n, g) for n, g in enumerate(generated)]
    chunk, min_new = 0, run.config.min_new_tokens
    if rules is not None:  # the first new token came in the first window
        rules = dataclasses.replace(rules, forced_first_id=None)
    while run.window is not None and not all(ended):
        keep = max(1, int(run.window * SLIDE_KEEP))
        context = [run._started(run.prompts[run.owner[n][0]] + g)[-keep:] for n, g in enumerate(generated)]
        chunk += 1
        # What each row still owes, counted from this window's prompt.
        owed = [max(0, min_new - len(g)) for g in generated] if min_new else 0
        more = run.decode(sampler, context, run.window, chunk, rules, owed, streamer)
        for n, seq in enumerate(more.sequences(include_prompt=True)):
            if not ended[n]:
                generated[n] = generated[n] + seq[keep:]
                ended[n] = run.done(n, generated[n])
    return generated
