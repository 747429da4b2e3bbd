"""``generate``: the one entry point of text generation, for language models and encoder-decoders alike.

    import lmkit
    from lmkit.decoding import GenerationConfig
    texts = lmkit.generate("runs/plays", ["ROMEO:"], max_new_tokens=200, seed=0)
    texts = lmkit.generate("runs/plays", "ROMEO:", GenerationConfig(strategy="top_k", top_k=20))
    outputs = lmkit.generate("runs/reverse", ["a b c", "d e"], strategy="beam")  # an encoder-decoder
    texts = lmkit.generate(model, ["the company said"], tokenizer=tokenizer, strategy="greedy")

The model comes from a run folder, a Hugging Face folder or an object
(:func:`lmkit.decoding.source.load_generator` decides which, and whether it
is a language model or an encoder-decoder); the settings travel in one
:class:`~lmkit.decoding.config.GenerationConfig`, whose fields may also be
given as keywords (they win over the config's), and what a folder's
``generation_config.json`` asks fills in what neither gives. A language model
continues prompts (:func:`lmkit.decoding.text.continue_prompts`: line breaks
as text, windows past the context, stop strings, streaming); an
encoder-decoder decodes sources (:func:`lmkit.decoding.transduction.transduce_sources`).
Either way the result is one :class:`~lmkit.decoding.text.Generation` per
sample, or its text.
"""

from __future__ import annotations

import warnings
from typing import Any, List, Optional, Sequence, Tuple, Union

from lmkit.core.errors import UsageError
from lmkit.decoding.config import GenerationConfig
from lmkit.decoding.source import Generator, load_generator
from lmkit.decoding.text import Generation, continue_prompts
from lmkit.decoding.transduction import OnBatch, transduce_sources

__all__ = ["Generation", "generate", "generate_samples"]

#: One input: a text, token ids (a language model's prompt), or None (a language model's empty prompt).
Input = Union[None, str, Sequence[int]]


def generate(source: Any,
             inputs: Union[Input, Sequence[Input]] = None,
             config: Optional[GenerationConfig] = None,
             *,
             tokenizer: Any = None,
             checkpoint: Optional[str] = None,
             sampler: Any = None,
             stream: Any = None,
             on_batch: Optional[OnBatch] = None,
             return_samples: bool = False,
             **options: Any) -> Union[List[str], List[Generation]]:
    """Continues each prompt, or decodes each source; the Python face of ``lmkit generate`` (the same code).

    Args:
      source: a model folder (an lmkit run, or a Hugging Face folder: GPT-2, Llama, Qwen2, Mistral,
        Gemma, BART), a :class:`~lmkit.decoding.source.Generator`, or a model object (then pass ``tokenizer``).
      inputs: a language model's prompts (texts or token ids; None: one sample from the start of a
        line) or an encoder-decoder's sources (texts); one, or a list.
      config: a :class:`~lmkit.decoding.config.GenerationConfig`. Each setting left out is what the
        model folder's ``generation_config.json`` asks for (a Hugging Face folder's, or for a run
        fine-tuned from one, that folder's: Llama 3's temperature 0.6 and top-p 0.9 with top-k 50),
        else lmkit's default: ``top_p`` 0.9 at temperature 1.0 for a language model, greedy for an
        encoder-decoder; 50 new tokens for a language model (``max_length`` counts the prompt,
        ``max_new_tokens`` wins over it), the decoder's ``max_positions - 1`` for an encoder-decoder.
      tokenizer: the tokenizer of a model object (a folder brings its own).
      checkpoint: a ``ckpt-<step>`` folder of a run (default the newest).
      sampler: a :class:`lmkit.decoding.Sampler` of your own; it wins over the config's strategy (and
        the folder's settings are not read).
      stream: a function that takes text (``sys.stdout.write``): a language model's one sample is
        written to it while it is generated.
      on_batch: an encoder-decoder's progress, ``on_batch(rows done, rows in all)``.
      return_samples: return :class:`~lmkit.decoding.text.Generation` objects (text, ids, why it
        stopped, the seed) instead of strings.
      **options: fields of the config as keywords (``max_new_tokens=20, seed=0``); they win over
        ``config``. An unknown one is an error naming it.

    Returns:
      One string per sample (a language model's: the prompt and its continuation; an
      encoder-decoder's: the output), prompt by prompt, sample by sample.

    Raises:
      UsageError: a bad option or input, named in the message.
    """
    if "prompts" in options:  # the old name of inputs
        warnings.warn("generate(prompts=...) is deprecated; pass them as generate(source, inputs)",
                      DeprecationWarning, stacklevel=2)
        inputs = options.pop("prompts")
    if "strategy" in options and options["strategy"] is not None and not isinstance(options["strategy"], str):
        warnings.warn("generate(strategy=<a Sampler>) is deprecated; pass it as generate(sampler=...)",
                      DeprecationWarning, stacklevel=2)
        sampler = options.pop("strategy")
    generator = load_generator(source, checkpoint=checkpoint, tokenizer=tokenizer)
    given = (config or GenerationConfig()).replace(**options)
    settings = generator.settings(given, own_sampler=sampler is not None)
    if generator.conditional:
        if stream is not None:
            raise UsageError("stream writes a language model's sample as it comes; an encoder-decoder's outputs "
                             "come a batch at a time (use on_batch)")
        samples = transduce_sources(generator, _sources(inputs), settings, sampler=sampler, on_batch=on_batch)
    else:
        samples = _continue(generator, inputs, settings, sampler, stream)
    return samples if return_samples else [s.text for s in samples]


def _as_list(inputs: Union[Input, Sequence[Input]]) -> List[Input]:
    if inputs is None or isinstance(inputs, str):
        return [inputs]
    inputs = list(inputs)
    if inputs and all(isinstance(i, int) and not isinstance(i, bool) for i in inputs):
        return [inputs]  # one prompt's token ids
    return inputs


def _sources(inputs: Union[Input, Sequence[Input]]) -> List[str]:
    sources = _as_list(inputs)
    for number, text in enumerate(sources, start=1):
        if not isinstance(text, str):
            raise UsageError(f"source {number} = {text!r}: an encoder-decoder decodes texts, one per source")
    return sources  # type: ignore[return-value]


def _prompt_ids(tokenizer: Any, inputs: Union[Input, Sequence[Input]]) -> Tuple[List[Any], List[List[int]]]:
    """``(prompts as given, their token ids)``; a text is encoded, token ids pass as they are."""
    prompts, ids = _as_list(inputs), []
    for text in prompts:
        if text is None or isinstance(text, str):
            encoded = tokenizer.encode(text) if text else []
            if text and not encoded:
                raise UsageError(f"prompt {text!r} is empty after tokenization")
        else:
            encoded = [int(i) for i in text]
        ids.append(encoded)
    return prompts, ids


def _continue(generator: Generator, inputs: Union[Input, Sequence[Input]], settings: GenerationConfig,
              sampler: Any, stream: Any) -> List[Generation]:
    """A language model's samples: the budgets of new tokens, the window's default, then the decode."""
    num_samples, max_length, max_new = settings.num_samples, settings.max_length, settings.max_new_tokens
    for name, value, ok in (("num_samples", num_samples, num_samples >= 1),
                            ("max_length", max_length, max_length is None or max_length >= 1),
                            ("max_new_tokens", max_new, max_new is None or max_new >= 1)):
        if not ok:
            raise UsageError(f"{name} = {value!r} must be >= 1")
    prompts, ids = _prompt_ids(generator.tokenizer, inputs)
    budgets = [max_new if max_new is not None else (max_length - len(p) if max_length is not None else 50)
               for p in ids]
    for text, p, budget in zip(prompts, ids, budgets):
        if budget < 1:
            raise UsageError(f"prompt {text!r} has {len(p)} tokens, leaving none to generate within "
                             f"max_length {max_length}; use max_length {len(p) + 1} or more, or max_new_tokens")
    sampler = settings.sampler() if sampler is None else sampler
    if settings.context is None:
        from lmkit.decoding.beam import BeamSampler
        # A run's trained window for the strategies that slide it; beam search cannot slide.
        context = None if isinstance(sampler, BeamSampler) else generator.trained_context()
        settings = settings.replace(context=context)
    return continue_prompts(generator.model, generator.tokenizer, ids, budgets, settings, sampler=sampler,
                            stream=stream)


def generate_samples(model: Any, tokenizer: Any, prompts: Sequence[Sequence[int]], *, max_new_tokens: Sequence[int],
                     sampler: Any, rules: Any = None, stream: Any = None, config: Optional[GenerationConfig] = None,
                     **options: Any) -> Tuple[List[Generation], Optional[int]]:
    """Samples from token-id prompts with a sampler of the caller's: :func:`continue_prompts` with
    lmkit's defaults for what ``config`` and ``**options`` (its fields as keywords) leave out.

    Args:
      prompts: token ids of each prompt; max_new_tokens: tokens to generate for each (at most).
      sampler: a :class:`lmkit.decoding.Sampler`.
      rules: a :class:`lmkit.decoding.constraints.Constraints` (wins over the config's rules on tokens).
      stream: as in :func:`generate`.

    Returns:
      ``(samples, seed)``: the samples in prompt order, then sample order, and the seed used (None for
      beam search).
    """
    given = (config or GenerationConfig()).replace(**options)
    if rules is not None:
        given = given.replace(**rules.get_config())
    settings, _ = given.resolve()
    samples = continue_prompts(model, tokenizer, prompts, max_new_tokens, settings, sampler=sampler, stream=stream)
    from lmkit.decoding.beam import BeamSampler
    seed = None if isinstance(sampler, BeamSampler) else (samples[0].seed if samples else settings.seed)
    return samples, seed
