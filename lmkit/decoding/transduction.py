"""Sources in, targets out: an encoder-decoder run over many sources, and its outputs scored.

    from lmkit.decoding.transduction import load_seq2seq, transduce, score
    run = load_seq2seq("runs/reverse")
    outputs = transduce(run, ["a b c", "d e"], strategy="beam", beam_width=4)
    score(outputs, ["c b a", "e d"])  # {"bleu": ..., "exact_match": ...}
    transduce_samples(run, ["a b c"], num_samples=3, strategy="top_p", seed=0)  # [[3 outputs]]

:func:`transduce` is what ``lmkit generate --source_file`` and ``lmkit
evaluate --source_file`` run: the sources are tokenized with the run's source
tokenizer, sorted by length and decoded ``batch_size`` at a time (each batch
padded to a length bucket of :func:`lmkit.data.paired.padded_length`, so the
compiled loop sees few shapes), every row starting from the target's start id
and ending at its end id; the outputs come back in the order of the sources
(:func:`transduce_samples`: several per source, sampled or the best of one
beam search). Any strategy of
:mod:`lmkit.decoding` decodes: greedy, sampling, top-k, top-p, or beam search
with a length penalty. :func:`score` computes corpus BLEU with sacrebleu (the
standard implementation; ``pip install "lmkit[seq2seq]"``) and exact match.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from lmkit.core.errors import UsageError

__all__ = ["Seq2SeqRun", "is_seq2seq_run", "load_seq2seq", "source_tokenizer_of_run", "transduce",
           "transduce_samples", "score"]


@dataclasses.dataclass
class Seq2SeqRun:
    """A trained encoder-decoder with its tokenizers: what :func:`transduce` needs."""

    model: Any
    source_tokenizer: Any
    tokenizer: Any  # the target side's
    config: Any


def is_seq2seq_run(model_dir: str) -> bool:
    """Whether ``model_dir`` holds an encoder-decoder: a run whose config.json says data = "pairs", or a
    Hugging Face folder of an encoder-decoder family (BART)."""
    from lmkit.hub.hf import family_of, is_hf_folder
    if is_hf_folder(model_dir):
        try:
            return bool(getattr(family_of(model_dir), "conditional", False))
        except UsageError:  # a family lmkit does not read: the language-model path says so
            return False
    from lmkit.core.layout import CONFIG_FILE
    path = os.path.join(model_dir, CONFIG_FILE)
    if not os.path.isfile(path):
        return False
    from lmkit.core.layout import read_config_dict
    return read_config_dict(model_dir).get("data") == "pairs"


def source_tokenizer_of_run(model_dir: str, share_vocab: bool) -> Any:
    """The source side's tokenizer: the run's own one, or the one in ``<model_dir>/source_tokenizer``."""
    from lmkit.data.tokenizers import load_tokenizer, tokenizer_of_run
    from lmkit.core.layout import SOURCE_TOKENIZER_DIR
    if share_vocab:  # the same ids; a BART folder's tokenizer ends sources with </s>
        return tokenizer_of_run(model_dir).source_side()
    return load_tokenizer(os.path.join(model_dir, SOURCE_TOKENIZER_DIR))


def load_seq2seq(model_dir: str, checkpoint: Optional[str] = None) -> Seq2SeqRun:
    """The encoder-decoder, its tokenizers and config from a training run's folder, or from a Hugging
    Face folder of an encoder-decoder family (BART: :func:`lmkit.hub.hf_bart.load_seq2seq`).

    Raises:
      UsageError: not an encoder-decoder's run (naming what it is), or what
        :func:`lmkit.train.checkpoint.load_model` raises.
    """
    from lmkit.hub.hf import family_of, is_hf_folder
    if is_hf_folder(model_dir):
        from lmkit.decoding.generation import check_hf_checkpoint
        check_hf_checkpoint(model_dir, checkpoint)
        family = family_of(model_dir)
        if not getattr(family, "conditional", False):
            raise UsageError(f"{model_dir} holds a language model, not an encoder-decoder; --source_file and "
                             "--target_file are for encoder-decoders")
        return family.load_seq2seq(model_dir)
    from lmkit.train.checkpoint import load_model
    model, tokenizer, config = load_model(model_dir, checkpoint)
    if not getattr(model, "conditional", False):
        raise UsageError(f"{model_dir} holds a language model ({config.model}), not an encoder-decoder; "
                         "--source_file and --target_file are for runs trained on pairs")
    return Seq2SeqRun(model, source_tokenizer_of_run(model_dir, config.share_vocab), tokenizer, config)


def transduce(run: Seq2SeqRun, sources: Sequence[str], *, strategy: str = "greedy", beam_width: int = 4,
              length_penalty: float = 0.6, temperature: float = 1.0, top_k: Optional[int] = None, top_p: float = 0.9,
              max_new_tokens: Optional[int] = None, min_new_tokens: int = 0, batch_size: int = 32,
              seed: Optional[int] = None, jit_compile: Optional[bool] = None, sampler: Any = None,
              rules: Any = None, on_batch: Optional[Callable[[int, int], None]] = None) -> List[str]:
    """One output text per source text, in the sources' order.

    Args:
      run: from :func:`load_seq2seq` (or a :class:`Seq2SeqRun` of your own model and tokenizers).
      sources: the source texts (one line each; an empty one gives an empty output).
      strategy: ``greedy``, ``sample``, ``top_k``, ``top_p`` or ``beam`` (:data:`lmkit.decoding.SAMPLER_NAMES`).
      beam_width, length_penalty: beam search's width and GNMT alpha.
      temperature, top_k, top_p: the sampling strategies' settings (``top_k`` default 40 for ``top_k``;
        given with ``top_p``, the nucleus is taken among the ``top_k`` most likely tokens).
      max_new_tokens: the most target tokens (the end id included); default the
        model's ``max_positions - 1``.
      min_new_tokens: target tokens before the end id may be chosen.
      batch_size: sources decoded side by side.
      seed: the sampling strategies' seed (batch ``b`` uses ``seed + b``); None draws one.
      jit_compile: compile the decode loop with XLA (default: as :func:`lmkit.decoding.decode`).
      sampler: a sampler built already (``lmkit generate`` builds one from the flags and the model
        folder's ``generation_config.json``, e.g. ``BeamSampler(scoring="transformers", ...)``); it wins
        over ``beam_width`` to ``top_p``, and ``strategy`` names its kind.
      rules: a :class:`lmkit.decoding.constraints.Constraints` (a folder's ``no_repeat_ngram_size`` and
        forced first and last tokens), for every strategy; None for none.
      on_batch: called with ``(sources done, sources in all)`` after every batch (progress).

    Raises:
      UsageError: a bad setting, or a source longer than the model reads (naming its line).
    """
    return [outputs[0] for outputs in transduce_samples(
        run, sources, num_samples=1, strategy=strategy, beam_width=beam_width, length_penalty=length_penalty,
        temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens, batch_size=batch_size, seed=seed, jit_compile=jit_compile,
        sampler=sampler, rules=rules, on_batch=on_batch)]


def transduce_samples(run: Seq2SeqRun, sources: Sequence[str], *, num_samples: int = 1, strategy: str = "greedy",
                      beam_width: int = 4, length_penalty: float = 0.6, temperature: float = 1.0,
                      top_k: Optional[int] = None, top_p: float = 0.9, max_new_tokens: Optional[int] = None,
                      min_new_tokens: int = 0, batch_size: int = 32, seed: Optional[int] = None,
                      jit_compile: Optional[bool] = None, sampler: Any = None, rules: Any = None,
                      on_batch: Optional[Callable[[int, int], None]] = None) -> List[List[str]]:
    """``num_samples`` output texts per source text, in the sources' order.

    With a sampling strategy each source is decoded ``num_samples`` times
    (as rows of the same batches, each with its own random draws); with
    ``beam`` the outputs are the best ``num_samples`` finished hypotheses of
    one search per source, best first (fewer when the search finished fewer).
    ``greedy`` writes one output per source. An empty source gives
    ``num_samples`` empty outputs. The other arguments are
    :func:`transduce`'s; ``on_batch`` counts rows (a source times its samples).

    Raises:
      UsageError: a bad setting (``num_samples`` above 1 with greedy, or
        above ``beam_width``), or a source longer than the model reads.
    """
    import tensorflow as tf

    from lmkit.data.paired import SpecialIds, padded_length, pad_rows
    from lmkit.decoding import decode

    model, special = run.model, SpecialIds.of(run.tokenizer)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UsageError(f"batch_size = {batch_size!r} must be a positive integer")
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise UsageError(f"num_samples = {num_samples!r} must be a positive integer")
    if isinstance(min_new_tokens, bool) or not isinstance(min_new_tokens, int) or min_new_tokens < 0:
        raise UsageError(f"min_new_tokens = {min_new_tokens!r} must be an integer >= 0")
    if sampler is not None:
        beam_width = getattr(sampler, "beam_width", beam_width)
    beam = strategy == "beam"
    if num_samples > 1 and strategy == "greedy":
        raise UsageError(f"num_samples = {num_samples}: greedy decoding writes one output per source; "
                         "use a sampling strategy (sample, top_k, top_p) or beam")
    if beam and num_samples > beam_width:
        raise UsageError(f"num_samples = {num_samples} exceeds beam_width = {beam_width}: beam search keeps "
                         f"beam_width hypotheses; use beam_width = {num_samples}")
    limit = model.max_positions - 1
    new_tokens = limit if max_new_tokens is None else max_new_tokens
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or not 1 <= new_tokens <= limit:
        raise UsageError(f"max_new_tokens = {max_new_tokens!r} must be in [1, {limit}]: the decoder holds "
                         f"max_positions = {model.max_positions} positions, the start id included")
    if min_new_tokens >= new_tokens:
        raise UsageError(f"min_new_tokens = {min_new_tokens} leaves no room for the end id within "
                         f"max_new_tokens = {new_tokens}")
    if sampler is None:
        from lmkit.decoding.registry import resolve_settings, sampler_of_settings
        sampler = sampler_of_settings(strategy, resolve_settings(strategy, dict(
            temperature=temperature, top_k=top_k, top_p=top_p, beam_width=beam_width,
            length_penalty=length_penalty))[1])
    if seed is None and not beam and strategy != "greedy":
        from lmkit.decoding.prompts import check_seed
        seed = check_seed(None)
    max_source = getattr(getattr(model, "source_positions", None), "max_positions", None)
    encoded = [run.source_tokenizer.encode(text) if text.strip() else [] for text in sources]
    for number, ids in enumerate(encoded, start=1):
        if max_source is not None and len(ids) > max_source:
            raise UsageError(f"source {number} has {len(ids)} tokens, more than the model reads "
                             f"(max_source_positions {max_source}); shorten or split that line")
    outputs: List[List[str]] = [[""] * num_samples if not ids else [] for ids in encoded]
    copies = 1 if beam else num_samples  # rows per source
    todo = [i for i in sorted((i for i, ids in enumerate(encoded) if ids), key=lambda i: len(encoded[i]))
            for _ in range(copies)]

    def text_of(ids: List[int]) -> str:
        if ids and ids[-1] == special.eos:
            ids = ids[:-1]
        return run.tokenizer.decode(ids)

    for b, start in enumerate(range(0, len(todo), batch_size)):
        rows = todo[start:start + batch_size]
        filled = rows + [rows[0]] * (batch_size - len(rows))  # one batch shape: one compiled loop
        source, lengths = pad_rows([np.asarray(encoded[i], np.int32) for i in filled], special.pad,
                                   padded_length(max(len(encoded[i]) for i in filled)))
        mask = np.arange(source.shape[1])[np.newaxis] < lengths[:, np.newaxis]
        condition = model.encode(tf.constant(source), tf.constant(mask))
        options = {} if beam else {"seed": None if seed is None else seed + b}
        if min_new_tokens:
            options["min_new_tokens"] = min_new_tokens
        result = decode(model, new_tokens + 1, sampler, prompts=[[special.bos]] * len(filled),
                        eos_id=special.eos, pad_id=special.pad, condition=condition, jit_compile=jit_compile,
                        rules=rules, **options)
        for row, i in enumerate(rows):
            if beam and num_samples > 1:
                found = [result.beam_ids[row, k, 1:result.beam_lengths[row, k]].tolist()
                         for k in range(num_samples) if result.beam_scores[row, k] > -float("inf")]
                outputs[i].extend(text_of(ids) for ids in found or [result.ids[row, 1:result.lengths[row]].tolist()])
            else:
                outputs[i].append(text_of(result.ids[row, 1:result.lengths[row]].tolist()))
        if on_batch is not None:
            on_batch(min(start + batch_size, len(todo)), len(todo))
    return outputs


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
