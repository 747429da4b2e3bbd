"""``generate``: text in, text out, for language models and encoder-decoders alike.

    import lmkit
    from lmkit.decoding import GenerationConfig
    texts = lmkit.generate("runs/plays", ["ROMEO:"], max_new_tokens=200, seed=0)
    texts = lmkit.generate("runs/plays", "ROMEO:", GenerationConfig(strategy="top_k", top_k=20))
    outputs = lmkit.generate("runs/reverse", ["a b c", "d e"], strategy="beam")  # an encoder-decoder
    texts = lmkit.generate(model, ["the company said"], tokenizer=tokenizer, strategy="greedy")
    reply = lmkit.generate("models/chat-model", [{"role": "user", "content": "Hi"}])  # a conversation

The model comes from a run folder, a Hugging Face folder or an object
(:func:`lmkit.decoding.source.load_generator`); the settings travel in one
:class:`~lmkit.decoding.config.GenerationConfig`, whose fields may also be
given as keywords (they win over the config's), and what a folder's
``generation_config.json`` asks fills in what neither gives. The generation
is planned and checked first (:func:`lmkit.decoding.plan.plan_generation`),
then run: a language model continues prompts
(:func:`lmkit.decoding.text.continue_prompts`), an encoder-decoder decodes
sources (:func:`lmkit.decoding.transduction.transduce_sources`). Either way
the result is one :class:`~lmkit.decoding.text.Generation` per sample, or its text.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Union

from lmkit.decoding.config import GenerationConfig
from lmkit.decoding.plan import plan_generation
from lmkit.decoding.prompts import Prompt
from lmkit.decoding.text import Generation
from lmkit.decoding.transduction import OnBatch

__all__ = ["Generation", "generate"]


def generate(source: Any,
             inputs: Union[Prompt, Sequence[Prompt]] = None,
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
      source: a model folder (an lmkit run, or a Hugging Face folder), a
        :class:`~lmkit.decoding.source.Generator`, or a model object (then pass ``tokenizer``).
      inputs: a language model's prompts (texts, token ids, or conversations ``[{"role": "user", "content":
        ...}]`` laid out by the folder's chat template; None: one sample from the start of a line) or an
        encoder-decoder's sources (texts); one, or a list.
      config: a :class:`~lmkit.decoding.config.GenerationConfig`. Each setting left out is what the model
        folder's ``generation_config.json`` asks for (or, for a run fine-tuned from a Hugging Face folder,
        that folder's), else lmkit's default: ``top_p`` 0.9 at temperature 1.0 for a language model, greedy
        for an encoder-decoder; 50 new tokens for a language model, the decoder's ``max_positions - 1``
        for an encoder-decoder.
      tokenizer: the tokenizer of a model object (a folder brings its own).
      checkpoint: a ``ckpt-<step>`` folder of a run (default the newest).
      sampler: a :class:`lmkit.decoding.Sampler` of your own; it wins over the config's strategy (and the
        folder's settings are not read).
      stream: a function that takes text (``sys.stdout.write``): a language model's one sample is written
        to it while it is generated.
      on_batch: an encoder-decoder's progress, ``on_batch(rows done, rows in all)``.
      return_samples: return :class:`~lmkit.decoding.text.Generation` objects (text, ids, why it stopped,
        the seed) instead of strings.
      **options: fields of the config as keywords (``max_new_tokens=20, seed=0``); they win over ``config``.

    Returns:
      One string per sample (a language model's: the prompt and its continuation; an encoder-decoder's:
      the output), prompt by prompt, sample by sample.

    Raises:
      UsageError: a bad setting or input, named in the message (``prompts=`` and ``strategy=<a Sampler>``,
        0.2's spellings, name ``inputs`` and ``sampler=``).
    """
    plan = plan_generation(source, inputs, config, tokenizer=tokenizer, checkpoint=checkpoint, sampler=sampler,
                           stream=stream is not None, **options)
    samples = plan.run(stream=stream, on_batch=on_batch)
    return samples if return_samples else [s.text for s in samples]
