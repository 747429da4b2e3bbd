"""Text in, text out: :func:`generate`, the generation that ``lmkit generate`` runs.

    import lmkit
    texts = lmkit.generate("runs/plays", ["ROMEO:"], max_new_tokens=200, seed=0)
    texts = lmkit.generate(model, ["the company said"], tokenizer=tokenizer, strategy="greedy")

On top of :func:`lmkit.decoding.decode` (token ids, one compiled loop) this
module does what text needs:

* **line breaks are text**: a tokenizer's line-break id (lmkit's ``eos_id``)
  is written like any other token; a sample ends at ``max_length`` /
  ``max_new_tokens``, at a stop string, or at an end-of-document token where
  the model has one (a Hugging Face folder's ``eos_token_id``, every id of
  its ``generation_config.json``: GPT-2's ``<|endoftext|>``, Llama 3's
  ``<|end_of_text|>`` and ``<|eot_id|>``). ``stop_at_eos=True`` also ends a
  sample at its first line break (one line per sample);
* **longer than the context**: a transformer that has filled its
  ``max_positions`` goes on from the last half of them (the key/value cache
  rebuilt from that window, one compiled loop reused for every window);
  LSTMs carry their state and need no window;
* **the prompt as encoded for the model**: a Hugging Face model reads the
  prompt's tokens as ``transformers``' ``tokenizer(prompt)`` gives them
  (Llama's start token first; nothing before them for GPT-2 and Qwen2);
  lmkit's own models start after a line break, as every line of their
  training text does (``start_token`` changes either);
* **stop strings**: ``stop=["\\n\\n"]`` ends a sample where the string first
  appears in the generated text (the string not included).
"""

from __future__ import annotations

import dataclasses
import os
import unicodedata
from typing import Any, Iterable, List, Optional, Sequence, Tuple, Union

from lmkit.core.errors import UsageError

__all__ = ["Generation", "generate", "generate_samples", "load_for_generation", "trained_context",
           "default_context", "check_hf_checkpoint", "hf_folder_tokenizer", "readable",
           "end_of_document_ids", "check_stop_strings"]

# How much of a full window a transformer keeps when it slides: the last half.
SLIDE_KEEP = 0.5


@dataclasses.dataclass(frozen=True)
class Generation:
    """One sample.

    Attributes:
      text: the prompt, then the continuation (a stop string cut off).
      ids: the prompt's ids, then the generated ones (a start token not included).
      prompt_index, sample_index: which prompt, and which of its samples.
      prompt_length: how many of ``ids`` are the prompt's.
      prompt_text: the prompt as the tokenizer reads it back.
      stopped_by: why the sample ended: ``"length"``, ``"eos"`` (a line
        break with ``stop_at_eos``, or the end-of-document token) or the stop
        string that ended it.
    """

    text: str
    ids: List[int]
    prompt_index: int
    sample_index: int
    prompt_length: int
    prompt_text: str
    stopped_by: str

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


def check_hf_checkpoint(model_dir: str, checkpoint: Optional[str]) -> None:
    """UsageError for a checkpoint asked of a Hugging Face folder (it has one set of weights)."""
    if checkpoint:
        raise UsageError(f"--checkpoint applies to lmkit training runs; {model_dir} is a Hugging Face "
                         "folder with one set of weights")


def hf_folder_tokenizer(model_dir: str, checkpoint: Optional[str]) -> Any:
    """The tokenizer of a Hugging Face folder, once the folder is checked (a model lmkit reads, no
    ``--checkpoint`` asked of it); no TensorFlow needed.

    Raises:
      UsageError: a ``checkpoint``, or a folder lmkit cannot read (naming the file and the key).
    """
    from lmkit.hub.hf import check_pretrained, read_tokenizer
    check_hf_checkpoint(model_dir, checkpoint)
    check_pretrained(model_dir)
    return read_tokenizer(model_dir)


def trained_context(model_dir: str) -> Optional[int]:
    """The window length a run trained its model on (``num_steps``), or None when any position will do.

    A transformer learns its position embeddings only where training put
    tokens: a run with ``num_steps`` 64 and ``max_positions`` 128 never
    trained positions 64-127, so generation slides at 64. Pretrained models
    (Hugging Face folders, runs with ``init_from``) keep their
    ``max_positions``.
    """
    from lmkit.hub.hf import is_hf_folder
    if is_hf_folder(model_dir):
        return None
    from lmkit.core.layout import read_config_dict
    config = read_config_dict(model_dir)
    if config.get("init_from"):
        return None
    steps = config.get("num_steps")
    return int(steps) if isinstance(steps, int) and steps > 0 else None


def default_context(model_dir: str, sampler: Any) -> Optional[int]:
    """The ``context`` generation uses for a run folder when none is asked for.

    :func:`trained_context` for the strategies that slide their window; None
    (the model's whole ``max_positions``) for beam search, which cannot slide.
    """
    from lmkit.decoding.beam import BeamSampler
    return None if isinstance(sampler, BeamSampler) else trained_context(model_dir)


def load_for_generation(model_dir: str, checkpoint: Optional[str] = None,
                        tokenizer: Any = None) -> Tuple[Any, Any, str]:
    """``(model, tokenizer, description)`` of an lmkit run folder or a Hugging Face folder
    (GPT-2, Llama, Qwen2, Mistral: :data:`lmkit.hub.hf.FAMILIES`).

    ``tokenizer``: a Hugging Face folder's tokenizer when the caller has read it already.
    """
    from lmkit.hub.hf import is_hf_folder
    if is_hf_folder(model_dir):
        check_hf_checkpoint(model_dir, checkpoint)
        from lmkit.hub.hf import load_pretrained
        model, tokenizer, hf_config = load_pretrained(model_dir, tokenizer)  # reads the tokenizer when None
        return model, tokenizer, f"{hf_config['model_type']} (Hugging Face folder)"
    from lmkit.core.layout import resolve_checkpoint
    from lmkit.train.checkpoint import load_model
    model, tokenizer, config = load_model(model_dir, resolve_checkpoint(model_dir, checkpoint))
    return model, tokenizer, config.model


def _start_id(tokenizer: Any, start_token: Optional[bool], unprompted: bool = False) -> Optional[int]:
    """The token put before every prompt.

    lmkit's own models start after a line break (``eos_id``), where every
    line of their training text starts. A Hugging Face model reads the prompt
    as ``transformers`` encodes it (``tokenizer(prompt)``): after the start
    token its tokenizer puts first (Llama's ``<s>`` / ``<|begin_of_text|>``),
    or as given where it puts none (GPT-2, Qwen2); ``start_token`` True puts
    ``<|endoftext|>`` (GPT-2's document start) there instead, False nothing.
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


def generate_samples(model: Any,
                     tokenizer: Any,
                     prompts: Sequence[Sequence[int]],
                     *,
                     max_new_tokens: Sequence[int],
                     sampler: Any,
                     num_samples: int = 1,
                     seed: Optional[int] = None,
                     stop: Sequence[str] = (),
                     stop_at_eos: bool = False,
                     start_token: Optional[bool] = None,
                     repetition_penalty: float = 1.0,
                     min_new_tokens: int = 0,
                     stream: Any = None,
                     jit_compile: Optional[bool] = None,
                     context: Optional[int] = None,
                     rules: Any = None) -> Tuple[List[Generation], Optional[int]]:
    """Samples from token-id prompts; the engine of :func:`generate` and ``lmkit generate``.

    Args:
      prompts: token ids of each prompt (may be empty: start at a line start).
      max_new_tokens: tokens to generate for each prompt (at most).
      sampler: a :class:`lmkit.decoding.Sampler`.
      num_samples: samples per prompt (beam search: the best hypotheses of one search).
      repetition_penalty, min_new_tokens: as in :func:`lmkit.decoding.decode`
        (``min_new_tokens`` holds back the end tokens: the end of a document,
        and ``stop_at_eos``'s line break).
      stream: a function that takes text (e.g. ``sys.stdout.write``): the
        one sample is written to it while it is generated, the prompt first
        (the loop then runs without XLA and waits for each token).
      context: the positions a transformer reads before its window slides
        (at most its ``max_positions``, the default; :func:`trained_context`
        gives a run's). RNNs have no window.
      rules: a :class:`lmkit.decoding.constraints.Constraints` (a model folder's
        ``no_repeat_ngram_size`` and forced tokens). Past a slide the n-grams are
        those of the window, the forced first token is not forced again, and a
        forced last token is forced only where no window slides.

    Returns:
      ``(samples, seed)``: the samples in prompt order, then sample order,
      and the seed used (None for beam search).

    Raises:
      UsageError: an empty prompt with no start token, beam search past the
        model's context, a bad stop string.
    """
    from lmkit import decoding
    from lmkit.decoding.beam import BeamSampler
    from lmkit.decoding.prompts import check_seed

    stop = check_stop_strings(stop, tokenizer) if stop else []
    start_id = _start_id(tokenizer, start_token, unprompted=bool(prompts) and not any(prompts))
    if start_id is None and any(not p for p in prompts):
        raise UsageError("an empty prompt needs a start token, and this tokenizer has none; give a prompt")
    # What ends a sample (the decode loop stops at any of them): the end of a document, and with
    # stop_at_eos the end of a line.
    ends = list(dict.fromkeys(([tokenizer.eos_id] if stop_at_eos and tokenizer.eos_id is not None else [])
                              + end_of_document_ids(tokenizer)))
    eos_id = ends or None
    window = getattr(model, "max_positions", None)  # None: an RNN, no limit
    if context is not None:
        if isinstance(context, bool) or not isinstance(context, int) or context < 2:
            raise UsageError(f"context = {context!r} must be an integer >= 2 (positions the model reads)")
        if window is not None:
            window = min(window, context)
    beam = isinstance(sampler, BeamSampler)
    lead = 0 if start_id is None else 1
    rows: List[List[int]] = []  # the model's input per row: start token, prompt (cut to fit the window)
    targets: List[int] = []  # the full length each row should reach (start token included)
    owner: List[Tuple[int, int]] = []  # (prompt, sample) of each row
    for i, p in enumerate(prompts):
        for j in range(1 if beam else num_samples):
            rows.append(([] if start_id is None else [start_id]) + list(p))
            targets.append(lead + len(p) + int(max_new_tokens[i]))
            owner.append((i, j))
    longest = max(targets)
    if window is not None and beam and longest > window:
        raise UsageError(f"beam search cannot go past the model's context of {window} tokens "
                         f"(asked for {longest - lead} with the prompt); ask for fewer tokens or use "
                         "another --strategy, which slides the window")
    if window is not None:  # the model reads the last window - 1 tokens of a long prompt
        rows = [r[max(0, len(r) - window + 1):] for r in rows]
    seed = None if beam else check_seed(seed)
    prompt_texts = [tokenizer.decode(list(p)) for p in prompts]

    def done(n: int, g: List[int]) -> bool:
        i = owner[n][0]
        return bool((g and g[-1] in ends)
                    or lead + len(prompts[i]) + len(g) >= targets[n]
                    or (stop and _cut_at_stop(tokenizer, list(prompts[i]), g, prompt_texts[i], stop)[2]))

    if not isinstance(min_new_tokens, int) or min_new_tokens < 0:
        raise UsageError(f"min_new_tokens = {min_new_tokens!r} must be an integer >= 0")
    rules_of_window: Any = None if rules is None or not rules.active else rules
    if rules_of_window is not None and window is not None and longest > window:  # the window slides
        rules_of_window = dataclasses.replace(rules_of_window, forced_last_id=None)
    options: dict = dict(repetition_penalty=repetition_penalty, rules=rules_of_window)
    streamer = None
    if stream is not None:
        if beam or len(rows) != 1:
            raise UsageError("streaming writes one sample as it comes; give one prompt and one sample "
                             "(not beam search), or turn streaming off")
        streamer = _TextStreamer(tokenizer, list(prompts[0]), targets[0] - lead - len(prompts[0]), ends,
                                 stop, stream)
        options["on_token"] = streamer
    if min_new_tokens:
        options["min_new_tokens"] = [min_new_tokens] * len(rows)
    result = decoding.decode(model, longest if window is None else min(window, longest), sampler,
                             prompts=rows, eos_id=eos_id, seed=seed, jit_compile=jit_compile, **options)
    samples: List[Tuple[int, int, List[int], str]] = []  # (prompt, sample, generated ids, why)
    if beam:
        for i in range(len(prompts)):
            for j in range(num_samples):
                if result.beam_scores[i, j] > -float("inf"):  # -inf marks an unused slot
                    ids = result.beam_ids[i, j, :result.beam_lengths[i, j]].tolist()[len(rows[i]):]
                    samples.append((i, j, ids, "eos" if ids and ids[-1] in ends else "length"))
    else:
        generated = [seq[len(r):] for seq, r in zip(result.sequences(include_prompt=True), rows)]
        chunk = 0
        ended = [done(n, g) for n, g in enumerate(generated)]
        while window is not None and not all(ended):
            # Slide: go on from the last part of a full window, the cache rebuilt from it. Every
            # window has the same shape, so the compiled loop is reused.
            keep = max(1, int(window * SLIDE_KEEP))
            context = [(([] if start_id is None else [start_id]) + list(prompts[owner[n][0]]) + g)[-keep:]
                       for n, g in enumerate(generated)]
            chunk += 1
            if min_new_tokens:  # what each row still owes, counted from this window's prompt
                options["min_new_tokens"] = [max(0, min_new_tokens - len(g)) for g in generated]
            if rules_of_window is not None:  # the first new token came in the first window
                options["rules"] = dataclasses.replace(rules_of_window, forced_first_id=None)
            more = decoding.decode(model, window, sampler, prompts=context, eos_id=eos_id,
                                   seed=_chunk_seed(seed, chunk), jit_compile=jit_compile, **options)
            for n, seq in enumerate(more.sequences(include_prompt=True)):
                if not ended[n]:
                    generated[n] = generated[n] + seq[keep:]
                    ended[n] = done(n, generated[n])
        for n, g in enumerate(generated):
            i, j = owner[n]
            g = g[:max(0, targets[n] - lead - len(prompts[i]))]
            why = "eos" if g and g[-1] in ends else "length"
            samples.append((i, j, g, why))
    out = []
    for i, j, g, why in samples:
        prompt = list(prompts[i])
        text = None
        if stop:
            g, text, which = _cut_at_stop(tokenizer, prompt, g, prompt_texts[i], stop)
            why = which or why
        if why == "eos":
            g = g[:-1]  # the end token is not text
        if text is None:
            text = tokenizer.decode(prompt + g)
        out.append(Generation(text=text, ids=prompt + g, prompt_index=i, sample_index=j,
                              prompt_length=len(prompt), prompt_text=prompt_texts[i], stopped_by=why))
    if streamer is not None:
        streamer.finish(out[0].text)
    return out, seed


def _as_list(prompts: Union[None, str, Iterable[str]]) -> List[Optional[str]]:
    if prompts is None:
        return [None]
    if isinstance(prompts, str):
        return [prompts]
    return list(prompts)


def generate(model: Any,
             prompts: Union[None, str, Sequence[str]] = None,
             *,
             tokenizer: Any = None,
             max_length: Optional[int] = None,
             max_new_tokens: Optional[int] = None,
             strategy: Union[None, str, Any] = None,
             temperature: Optional[float] = None,
             top_k: Optional[int] = None,
             top_p: Optional[float] = None,
             min_p: Optional[float] = None,
             beam_width: Optional[int] = None,
             length_penalty: Optional[float] = None,
             num_samples: int = 1,
             seed: Optional[int] = None,
             stop: Sequence[str] = (),
             stop_at_eos: bool = False,
             start_token: Optional[bool] = None,
             repetition_penalty: Optional[float] = None,
             min_new_tokens: int = 0,
             no_repeat_ngram_size: Optional[int] = None,
             checkpoint: Optional[str] = None,
             context: Optional[int] = None,
             return_samples: bool = False) -> Union[List[str], List[Generation]]:
    """Continues each prompt; the Python face of ``lmkit generate`` (same options, same code).

    Args:
      model: a model folder (an lmkit run or a Hugging Face GPT-2 folder), or
        a language model object (then pass ``tokenizer``).
      prompts: a string or a list of strings; None: one sample from the start
        of a line.
      tokenizer: the tokenizer of a model object (read from the folder otherwise).
      max_length: tokens per sample, prompt included (as ``--max_length``).
      max_new_tokens: tokens to generate after the prompt (wins over
        ``max_length``; default 50 new tokens when neither is given).
      strategy: ``greedy``, ``sample``, ``top_k``, ``top_p``, ``beam``, or a
        :class:`lmkit.decoding.Sampler`; ``temperature``, ``top_k``,
        ``top_p``, ``min_p`` (top_p's), ``beam_width``, ``length_penalty`` set
        the named ones.
        Left out (None), each is what a Hugging Face folder's (or, for a
        run fine-tuned from one, that folder's) ``generation_config.json``
        asks for (:func:`lmkit.hub.hf.model_generation_preset`:
        Llama 3's temperature 0.6 and top-p 0.9 with top-k 50), else lmkit's
        default (:data:`lmkit.decoding.registry.DEFAULTS`: ``top_p`` 0.9,
        temperature 1.0; ``top_k`` 40 for the ``top_k`` strategy, no limit
        for ``top_p``).
      num_samples: samples per prompt.
      seed: the same seed gives the same samples; None draws one.
      stop: strings that end a sample (not included in it).
      stop_at_eos: end each sample at its first line break (as well as at the
        end of a document).
      start_token: put the start token before each prompt (default: yes for
        lmkit's models; for a Hugging Face one, the token its tokenizer puts
        first, if any: Llama's ``<s>``).
      repetition_penalty: > 1 makes tokens already in the sample less likely
        (CTRL's penalty, as in ``transformers``); 1 (the default unless the
        folder's ``generation_config.json`` sets one) = off.
      min_new_tokens: new tokens before the end token may be chosen.
      no_repeat_ngram_size: n > 0: no n-gram twice in a sample, its prompt included (default 0, or the
        folder's ``generation_config.json``'s, with its forced first and last tokens).
      checkpoint: a ``ckpt-<step>`` folder of a run (default the latest).
      context: positions a transformer reads before its window slides
        (default: a run's ``num_steps``, see :func:`trained_context`; a
        model object's ``max_positions``; beam search, which cannot slide,
        keeps ``max_positions`` unless this is given).
      return_samples: return :class:`Generation` objects (text, ids, why it
        stopped) instead of strings.

    Returns:
      One string (prompt and continuation) per sample, prompt by prompt.

    Raises:
      UsageError: a bad option or prompt, named in the message.
    """
    if isinstance(model, (str, os.PathLike)):
        if tokenizer is not None:
            raise UsageError("tokenizer= is for a model object; a model folder brings its own")
        folder: Optional[str] = os.fspath(model)
        model, tokenizer, _ = load_for_generation(folder, checkpoint)
    elif tokenizer is None:
        raise UsageError("generate(model_object, ...) needs tokenizer=; or pass a model folder")
    else:
        folder = None
    for name, value, ok in (("num_samples", num_samples, num_samples >= 1),
                            ("max_length", max_length, max_length is None or max_length >= 1),
                            ("max_new_tokens", max_new_tokens, max_new_tokens is None or max_new_tokens >= 1)):
        if not ok:
            raise UsageError(f"{name} = {value!r} must be >= 1")
    ids = []
    for text in _as_list(prompts):
        encoded = tokenizer.encode(text) if text else []
        if text and not encoded:
            raise UsageError(f"prompt {text!r} is empty after tokenization")
        ids.append(encoded)
    budget = [max_new_tokens if max_new_tokens is not None
              else (max_length - len(p) if max_length is not None else 50) for p in ids]
    for text, p, b in zip(_as_list(prompts), ids, budget):
        if b < 1:
            raise UsageError(f"prompt {text!r} has {len(p)} tokens, leaving none to generate within "
                             f"max_length {max_length}; use max_length {len(p) + 1} or more, or max_new_tokens")
    from lmkit.decoding.registry import resolve_settings, rules_of_settings, sampler_of_settings
    from lmkit.decoding.sampler import Sampler
    from lmkit.hub.hf import model_generation_preset
    own = isinstance(strategy, Sampler)
    preset = model_generation_preset(folder)[0] if folder is not None and not own else {}
    name, settings = resolve_settings(None if own else strategy, dict(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, beam_width=beam_width,
        length_penalty=length_penalty, repetition_penalty=repetition_penalty,
        no_repeat_ngram_size=no_repeat_ngram_size), preset)
    sampler = strategy if own else sampler_of_settings(name, settings)
    if context is None and folder is not None:
        context = default_context(folder, sampler)
    samples, _ = generate_samples(model, tokenizer, ids, max_new_tokens=budget, sampler=sampler,
                                  num_samples=num_samples, seed=seed, stop=stop, stop_at_eos=stop_at_eos,
                                  start_token=start_token, repetition_penalty=settings["repetition_penalty"],
                                  min_new_tokens=min_new_tokens, context=context, rules=rules_of_settings(settings))
    return samples if return_samples else [s.text for s in samples]
