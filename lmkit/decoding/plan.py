"""A generation checked before any model is built: its settings resolved, its prompts encoded; then run.

    from lmkit.decoding.plan import plan_generation
    plan = plan_generation("runs/plays", ["ROMEO:"], max_new_tokens=40)  # no TensorFlow yet: bad input fails now
    plan.settings.strategy, plan.note()  # what will run, and what the folder's generation_config.json chose
    samples = plan.run()                 # loads the model once, then decodes

:func:`lmkit.generate` is ``plan_generation(...).run(...)``; ``lmkit generate``
and ``lmkit evaluate`` call the two halves apart, to answer bad input before
TensorFlow starts and to time the load. Planning resolves the settings (given,
then the folder's ``generation_config.json``, then lmkit's defaults:
:meth:`GenerationConfig.resolve`), checks what fits the kind of model (a
language model's prompts and stop strings, an encoder-decoder's sources),
encodes the prompts (:mod:`lmkit.decoding.prompts`: texts, token ids or
conversations laid out by the folder's chat template), and draws the seed of a
random strategy, so it can be reported before the samples come.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Optional, Tuple

from lmkit.core.errors import UsageError
from lmkit.decoding.checks import spelled
from lmkit.decoding.config import LENGTH_KEYS, GenerationConfig
from lmkit.decoding.prompts import (
    as_prompts,
    encode_prompt,
    is_conversation,
    prompt_text,
    unknown_words,
    unknown_words_warning,
)
from lmkit.decoding.registry import RULE_KEYS
from lmkit.decoding.source import Generator, ModelFolder, load_generator, open_folder

__all__ = ["GenerationPlan", "plan_generation"]

#: A language model's settings: an encoder-decoder writes one output per source, bounded by max_new_tokens.
LANGUAGE_MODEL_ONLY = ("max_length", "context", "stop", "stop_at_eos", "start_token", "repetition_penalty")
#: The settings a preset's note names, and which strategies use each (None: every strategy).
_USED_BY: Dict[str, Optional[Tuple[str, ...]]] = {
    "strategy": None, "temperature": ("sample", "top_k", "top_p"), "top_k": ("top_k", "top_p"), "top_p": ("top_p",),
    "min_p": ("top_p",), "repetition_penalty": ("greedy", "sample", "top_k", "top_p"), "beam_width": ("beam",),
    "beam_scoring": ("beam",), "length_penalty": ("beam",), "early_stopping": ("beam",), "min_new_tokens": None,
    "max_new_tokens": None, **{key: None for key in RULE_KEYS}}


@dataclasses.dataclass
class GenerationPlan:
    """What :meth:`run` will do, checked: the resolved settings and the encoded prompts.

    Attributes:
      settings: the resolved :class:`GenerationConfig` (an encoder-decoder's lengths fitted to its decoder
        once the model is loaded); used: the values the model folder's ``generation_config.json`` gave.
      conditional: an encoder-decoder (its inputs are sources); inputs: the prompts or sources as given.
      ids, budgets: a language model's prompts encoded, and the new tokens each may take.
      sampler: the caller's own :class:`~lmkit.decoding.sampler.Sampler` (None: the settings' strategy).
      folder, generator, checkpoint, tokenizer: where the model comes from, and its (target side's) tokenizer.
      preset_source: the folder whose ``generation_config.json`` gave ``used``.
      warnings: lines for the user (prompt words a word vocabulary lacks).
    """

    settings: GenerationConfig
    used: Dict[str, Any]
    conditional: bool
    inputs: List[Any] = dataclasses.field(default_factory=list)
    ids: List[List[int]] = dataclasses.field(default_factory=list)
    budgets: List[int] = dataclasses.field(default_factory=list)
    sampler: Any = None
    folder: Optional[ModelFolder] = None
    generator: Optional[Generator] = None
    checkpoint: Optional[str] = None
    tokenizer: Any = None
    preset_source: Optional[str] = None
    warnings: List[str] = dataclasses.field(default_factory=list)

    @property
    def strategy(self) -> str:
        """The strategy that decodes: the settings', or the kind of the caller's own sampler."""
        if self.sampler is None:
            return self.settings.strategy
        from lmkit.decoding.beam import BeamSampler
        from lmkit.decoding.samplers import GreedySampler
        return "beam" if isinstance(self.sampler, BeamSampler) else \
            "greedy" if isinstance(self.sampler, GreedySampler) else "sample"

    @property
    def single(self) -> bool:
        """One input and one sample: the whole output is one sample's text."""
        return len(self.inputs) == 1 and self.settings.num_samples == 1

    @property
    def streams(self) -> bool:
        """Whether the sample can be written while it is generated (a language model's one per-token sample)."""
        return not self.conditional and self.single and self.strategy != "beam"

    @property
    def where(self) -> str:
        """The model's folder, for messages."""
        return self.folder.path if self.folder is not None else "the model"

    def note(self) -> Optional[str]:
        """``<folder>/generation_config.json: strategy top_p, temperature 0.6, ...``: the values the folder's file
        gave that this decode uses, or None when it uses none."""
        used = [f"{key} {value}" for key, value in self.used.items()
                if _USED_BY.get(key, ()) is None or self.strategy in _USED_BY.get(key, ())]
        if not used:
            return None
        return (f"{self.preset_source}/generation_config.json: {', '.join(used)} (as transformers' generate; "
                "a value given overrides each)")

    def load(self) -> Generator:
        """The model with its tokenizers, loaded once (an encoder-decoder's lengths then fitted to it)."""
        if self.generator is None:
            hugging_face = self.folder.hugging_face
            self.generator = self.folder.load(self.checkpoint, self.tokenizer if hugging_face else None)
            if self.conditional:
                self._fit()
        return self.generator

    def _fit(self) -> None:
        self.settings, self.used = self.settings.fit_decoder(self.generator.model.max_positions, self.used)

    def run(self, stream: Any = None, on_batch: Any = None) -> list:
        """Loads the model (once) and decodes: one :class:`~lmkit.decoding.text.Generation` per sample.

        Args:
          stream: a function that takes text: a language model's one sample is written to it as it comes.
          on_batch: an encoder-decoder's progress, ``on_batch(rows done, rows in all)``.
        """
        if stream is not None:
            self._check_stream()
        generator = self.load()
        if self.conditional:
            from lmkit.decoding.transduction import transduce_sources
            return transduce_sources(generator, self.inputs, self.settings, sampler=self.sampler, on_batch=on_batch)
        from lmkit.decoding.text import continue_prompts
        return continue_prompts(generator.model, generator.tokenizer, self.ids, self.budgets, self.settings,
                                sampler=self.sampler, stream=stream)

    def _check_stream(self) -> None:
        if self.conditional:
            raise UsageError(f"{spelled('stream')} writes a language model's sample as it comes; an encoder-decoder's "
                             "outputs come a batch at a time (use on_batch)")
        if not self.streams:
            raise UsageError(f"{spelled('stream')} writes one sample as it comes: give one {spelled('prompt')}, "
                             f"{spelled('num_samples', 1)} and a per-token {spelled('strategy')} (not beam), or "
                             "turn streaming off")


def plan_generation(source: Any, inputs: Any = None, config: Optional[GenerationConfig] = None, *,
                    tokenizer: Any = None, checkpoint: Optional[str] = None, sampler: Any = None,
                    stream: bool = False, deterministic: bool = False, **options: Any) -> GenerationPlan:
    """The checked plan of :func:`lmkit.generate` (arguments as its); builds no model when ``source`` is a folder.

    Args:
      stream: the sample will be streamed (checked now: one sample of a language model, not beam search).
      deterministic: leave a folder's sampling settings out (its rules on tokens and lengths stay): greedy
        unless a strategy is given or the folder asks for beams (``lmkit evaluate``'s BLEU).

    Raises:
      UsageError: a bad setting, input or source, named in the message.
    """
    if "prompts" in options:
        raise UsageError("generate(prompts=...) was removed in lmkit 0.3; pass them as generate(source, inputs)")
    given = (config or GenerationConfig()).replace(**options)
    if sampler is not None:
        _check_sampler(sampler)
    folder, generator, tokenizer = _source(source, tokenizer, checkpoint)
    conditional = generator.conditional if generator is not None else folder.conditional
    preset, preset_source = (GenerationConfig(), None)
    if sampler is None and folder is not None:  # a sampler of the caller's own: the folder's file is not read
        preset, preset_source = folder.generation_config()
    if deterministic and preset.strategy not in (None, "beam"):
        preset = GenerationConfig(**{k: v for k, v in preset.given().items() if k in (*LENGTH_KEYS, *RULE_KEYS)})
    settings, used = given.resolve(preset, "greedy" if conditional else "top_p")
    plan = GenerationPlan(settings, used, conditional, sampler=sampler, folder=folder, generator=generator,
                          checkpoint=checkpoint, tokenizer=tokenizer, preset_source=preset_source)
    if conditional:
        _plan_sources(plan, inputs, given)
    else:
        _plan_prompts(plan, inputs, given)
    if stream:
        plan._check_stream()
    if plan.settings.seed is None and plan.strategy not in ("greedy", "beam"):  # drawn now: reported before the samples
        from lmkit.decoding.batch import check_seed
        plan.settings = plan.settings.replace(seed=check_seed(None))
    return plan


def _check_sampler(sampler: Any) -> None:
    from lmkit.decoding.sampler import Sampler
    if not isinstance(sampler, Sampler):
        raise UsageError(f"sampler = {sampler!r} is not an lmkit.decoding Sampler; "
                         "build one with lmkit.decoding.get_sampler(name, ...)")


def _source(source: Any, tokenizer: Any, checkpoint: Optional[str]) -> Tuple[Any, Any, Any]:
    """``(folder, generator, tokenizer)``: a folder is looked at (no model built); anything else is loaded."""
    if isinstance(source, (str, os.PathLike, ModelFolder)):
        if tokenizer is not None:
            raise UsageError("tokenizer= is for a model object; a model folder brings its own")
        folder = source if isinstance(source, ModelFolder) else open_folder(source)
        return folder, None, folder.tokenizer(checkpoint)
    generator = load_generator(source, checkpoint=checkpoint, tokenizer=tokenizer)
    return generator.folder, generator, generator.tokenizer


def _plan_sources(plan: GenerationPlan, inputs: Any, given: GenerationConfig) -> None:
    """An encoder-decoder's sources and settings, checked."""
    for key in LANGUAGE_MODEL_ONLY:
        if getattr(given, key) not in (None, ()):
            raise UsageError(f"{spelled(key)} applies to language models; {plan.where} holds an encoder-decoder, "
                             f"which writes one line per source ({spelled('max_new_tokens')} bounds it)")
    sources = as_prompts(inputs)
    for number, text in enumerate(sources, start=1):
        if not isinstance(text, str):
            raise UsageError(f"source {number} = {text!r}: an encoder-decoder decodes texts, one per source"
                             + (" (chat conversations are for language models)" if is_conversation(text) else ""))
    num_samples, strategy = plan.settings.num_samples, plan.strategy
    if num_samples > 1 and strategy == "greedy":
        raise UsageError(f"{spelled('num_samples', num_samples)}: greedy decoding writes one output per source; use "
                         f"{spelled('strategy', 'sample')}, top_k, top_p or beam")
    width = getattr(plan.sampler, "beam_width", num_samples)
    if strategy == "beam" and num_samples > width:
        raise UsageError(f"num_samples = {num_samples} exceeds the BeamSampler's beam_width = {width}")
    plan.inputs = sources
    if plan.generator is not None:
        plan._fit()


def _plan_prompts(plan: GenerationPlan, inputs: Any, given: GenerationConfig) -> None:
    """A language model's prompts encoded, its budgets of new tokens, stop strings and window, checked."""
    from lmkit.decoding.text import check_stop_strings
    prompts = as_prompts(inputs)
    if not prompts:
        raise UsageError("no prompts: give at least one (None, or an empty text, starts at the beginning of a line)")
    template = _chat_template(plan) if any(is_conversation(p) for p in prompts) else None
    settings = plan.settings
    if template is not None:  # the end of the assistant's turn ends a sample; the template writes the start token
        ends = () if not template.eos_token or template.eos_token in settings.stop else (template.eos_token,)
        settings = settings.replace(stop=settings.stop + ends,
                                    start_token=False if given.start_token is None else given.start_token)
    if settings.stop:
        check_stop_strings(settings.stop, plan.tokenizer)
    ids = [encode_prompt(plan.tokenizer, prompt, template) for prompt in prompts]
    max_length, max_new = settings.max_length, settings.max_new_tokens
    budgets = [max_new if max_new is not None else 50 if max_length is None else max_length - len(p) for p in ids]
    for prompt, p, budget in zip(prompts, ids, budgets):
        if budget < 1:
            raise UsageError(f"{spelled('prompt')} {prompt_text(prompt)!r} has {len(p)} tokens, leaving none to "
                             f"generate within {spelled('max_length', max_length)} (the prompt counts); use "
                             f"{spelled('max_length', len(p) + 1)} or more, or {spelled('max_new_tokens')}")
    if settings.context is None and plan.strategy != "beam" and plan.folder is not None:
        settings = settings.replace(context=plan.folder.trained_context())  # beam search cannot slide
    plan.settings, plan.inputs, plan.ids, plan.budgets = settings, prompts, ids, budgets
    plan.warnings = [unknown_words_warning(n, words, plan.tokenizer, plan.folder and plan.folder.path)
                     for n, words in enumerate(unknown_words(plan.tokenizer, p) for p in prompts) if words]


def _chat_template(plan: GenerationPlan) -> Any:
    """The chat template of the model's folder: a Hugging Face folder's, or that of the folder a run started from."""
    from lmkit.hub.chat import read_chat_template
    source = plan.folder.pretrained_source() if plan.folder is not None else None
    if source is None:
        raise UsageError(f"a conversation is laid out by its model's chat template, and {plan.where} has none: give "
                         "a Hugging Face chat model's folder, or a run fine-tuned from one (while that folder is "
                         "there)")
    return read_chat_template(source)
