"""Sources in, targets out: an encoder-decoder over many sources, and its outputs scored.

    from lmkit.decoding import generate
    from lmkit.decoding.transduction import load_seq2seq, score
    outputs = generate("runs/reverse", ["a b c", "d e"], strategy="beam", beam_width=4)
    score(outputs, ["c b a", "e d"])  # {"bleu": ..., "exact_match": ...}
    run = load_seq2seq("runs/reverse")  # loaded once, decoded many times
    generate(run, ["a b c"], num_samples=3, strategy="top_p", seed=0)  # 3 outputs

:func:`transduce_sources` is what :func:`lmkit.decoding.generate` runs for an
encoder-decoder (``lmkit generate --source_file``, ``lmkit evaluate
--source_file``), its settings planned and checked
(:func:`lmkit.decoding.plan.plan_generation`): the sources are tokenized with the model's source
tokenizer, sorted by length and decoded ``batch_size`` at a time (each batch
padded to a length bucket of :func:`lmkit.data.paired.padded_length`, so the
compiled loop sees few shapes), every row starting from the target's start id
and ending at its end id; the outputs come back in the order of the sources,
``num_samples`` per source (sampled, or the best of one beam search). Any
strategy of :mod:`lmkit.decoding` decodes. :func:`score` computes corpus BLEU
with sacrebleu (the standard implementation; ``pip install
"lmkit[seq2seq]"``) and exact match.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from lmkit.core.errors import UsageError
from lmkit.decoding.config import GenerationConfig
from lmkit.decoding.source import Generator, open_folder
from lmkit.decoding.text import Generation

__all__ = ["load_seq2seq", "score", "transduce_sources"]

#: ``on_batch(done, total)``: rows decoded so far (a source times its samples), after every batch.
OnBatch = Callable[[int, int], None]


def load_seq2seq(model_dir: str, checkpoint: Optional[str] = None) -> Generator:
    """The encoder-decoder of a training run's folder or of a Hugging Face folder, with its tokenizers:
    :func:`lmkit.decoding.source.load_generator`, checked to be an encoder-decoder.

    Raises:
      UsageError: a language model's folder, or what loading raises.
    """
    folder = open_folder(model_dir)
    if not folder.conditional:
        raise UsageError(f"{model_dir} holds a language model, not an encoder-decoder; --source_file and "
                         "--target_file are for encoder-decoders")
    return folder.load(checkpoint)


def _strategy(config: GenerationConfig, sampler: Any) -> str:
    """The strategy of ``sampler``, or the config's when it is None (``"sample"`` for any per-token random one)."""
    if sampler is None:
        return config.strategy
    from lmkit.decoding.beam import BeamSampler
    from lmkit.decoding.samplers import GreedySampler
    return "beam" if isinstance(sampler, BeamSampler) else "greedy" if isinstance(sampler, GreedySampler) else "sample"


def _encoded(generator: Any, sources: Sequence[str]) -> List[List[int]]:
    """The sources' ids (an empty one: none); a source longer than the encoder reads is a UsageError."""
    max_source = getattr(getattr(generator.model, "source_positions", None), "max_positions", None)
    encoded = [generator.source_tokenizer.encode(text) if text.strip() else [] for text in sources]
    for number, ids in enumerate(encoded, start=1):
        if max_source is not None and len(ids) > max_source:
            raise UsageError(f"source {number} has {len(ids)} tokens, more than the model reads "
                             f"(max_source_positions {max_source}); shorten or split that line")
    return encoded


def transduce_sources(generator: Any, sources: Sequence[str], config: GenerationConfig, *, sampler: Any = None,
                      on_batch: Optional[OnBatch] = None) -> List[Generation]:
    """``num_samples`` outputs per source, sources in order: the encoder-decoder's half of
    :func:`lmkit.decoding.generate`, which plans and checks its settings.

    With a sampling strategy each source is decoded ``num_samples`` times (as rows of the same batches,
    each with its own random draws: batch ``b`` uses ``seed + b``); with beam search the outputs are the
    best ``num_samples`` finished hypotheses of one search per source, best first (fewer when the search
    finished fewer); greedy writes one output per source. An empty source gives ``num_samples`` empty
    outputs.

    Args:
      generator: a :class:`lmkit.decoding.source.Generator` of an encoder-decoder.
      sources: the source texts (one line each).
      config: a resolved :class:`GenerationConfig`, fitted to the decoder (:meth:`GenerationConfig.fit_decoder`):
        ``max_new_tokens`` bounds an output (the end id included; default the decoder's
        ``max_positions - 1``), ``batch_size`` sources go side by side, ``seed`` (drawn when planned).
      sampler: the strategy (default the config's).
      on_batch: ``on_batch(rows done, rows in all)`` after every batch (progress).

    Raises:
      UsageError: a source longer than the model reads (naming its line).
    """
    strategy = _strategy(config, sampler)
    beam, num_samples = strategy == "beam", config.num_samples
    sampler = config.sampler() if sampler is None else sampler
    seed = None if beam or strategy == "greedy" else config.seed
    encoded = _encoded(generator, sources)
    found: List[List[List[int]]] = [[] for _ in encoded]  # each source's outputs' ids
    copies = 1 if beam else num_samples  # rows per source
    todo = [i for i in sorted((i for i, ids in enumerate(encoded) if ids), key=lambda i: len(encoded[i]))
            for _ in range(copies)]
    batch_size = config.batch_size
    for b, start in enumerate(range(0, len(todo), batch_size)):
        rows = todo[start:start + batch_size]
        result = _decode_batch(generator, [encoded[i] for i in rows], config, sampler,
                               None if seed is None else seed + b)
        for row, i in enumerate(rows):
            found[i].extend(_outputs(result, row, num_samples if beam else 1))
        if on_batch is not None:
            on_batch(min(start + batch_size, len(todo)), len(todo))
    outputs = [[[]] * num_samples if not ids else found[i] for i, ids in enumerate(encoded)]
    return _generations(generator.tokenizer, outputs, seed)


def _outputs(result: Any, row: int, best: int) -> List[List[int]]:
    """Row ``row``'s output ids (after the start id): a beam search's ``best`` finished hypotheses, else its one."""
    if best > 1:
        found = [result.beam_ids[row, k, 1:result.beam_lengths[row, k]].tolist()
                 for k in range(best) if result.beam_scores[row, k] > -float("inf")]
        if found:
            return found
    return [result.ids[row, 1:result.lengths[row]].tolist()]


def _decode_batch(generator: Any, batch: List[List[int]], config: GenerationConfig, sampler: Any,
                  seed: Optional[int]) -> Any:
    """One batch of sources decoded (padded to ``batch_size`` rows: one batch shape, one compiled loop)."""
    import tensorflow as tf

    from lmkit.data.paired import SpecialIds, pad_rows, padded_length
    from lmkit.decoding.loop import decode

    model, special = generator.model, SpecialIds.of(generator.tokenizer)
    new_tokens = model.max_positions - 1 if config.max_new_tokens is None else config.max_new_tokens
    filled = batch + [batch[0]] * (config.batch_size - len(batch))
    source, lengths = pad_rows([np.asarray(ids, np.int32) for ids in filled], special.pad,
                               padded_length(max(len(ids) for ids in filled)))
    mask = np.arange(source.shape[1])[np.newaxis] < lengths[:, np.newaxis]
    condition = model.encode(tf.constant(source), tf.constant(mask))
    return decode(model, new_tokens + 1, sampler, prompts=[[special.bos]] * len(filled), condition=condition,
                  rules=config.rules(), eos_id=special.eos, pad_id=special.pad, jit_compile=config.jit_compile,
                  seed=seed, min_new_tokens=config.min_new_tokens)


def _generations(tokenizer: Any, outputs: List[List[List[int]]], seed: Optional[int]) -> List[Generation]:
    """The :class:`Generation` of each output's ids (its end id dropped), sources in order."""
    from lmkit.data.paired import SpecialIds
    eos = SpecialIds.of(tokenizer).eos
    out = []
    for i, samples in enumerate(outputs):
        for j, ids in enumerate(samples):
            ended = bool(ids) and ids[-1] == eos
            ids = ids[:-1] if ended else ids
            out.append(Generation(text=tokenizer.decode(ids), ids=list(ids), prompt_index=i, sample_index=j,
                                  prompt_length=0, prompt_text="", stopped_by="eos" if ended else "length",
                                  seed=seed))
    return out


def score(hypotheses: Sequence[str], references: Sequence[str]) -> Dict[str, Any]:
    """Corpus BLEU (sacrebleu's default 13a tokenization) and exact match of outputs against references.

    Returns:
      ``{"bleu": float (0-100), "bleu_signature": str, "exact_match": float (0-1), "sentences": int}``.

    Raises:
      UsageError: different numbers of hypotheses and references, or sacrebleu missing.
    """
    if len(hypotheses) != len(references):
        raise UsageError(f"{len(hypotheses)} outputs but {len(references)} references; they must align")
    try:
        import sacrebleu
    except ImportError:
        raise UsageError("BLEU needs sacrebleu: pip install \"lmkit[seq2seq]\" (or pip install sacrebleu)") from None
    metric = sacrebleu.metrics.BLEU()
    bleu = metric.corpus_score(list(hypotheses), [list(references)])
    exact = float(np.mean([h.strip() == r.strip() for h, r in zip(hypotheses, references)])) if references else 0.0
    return {"bleu": float(bleu.score), "bleu_signature": str(metric.get_signature()), "exact_match": exact,
            "sentences": len(references)}
