"""``lmkit evaluate``: perplexity of a trained model on a text, per token and per word; BLEU of an encoder-decoder.

    lmkit evaluate --model_dir runs/wt2 --text_file data/wikitext-2/test.txt
    lmkit evaluate --model_dir runs/config_small --split test --data_path data/ptb
    lmkit evaluate --model_dir runs/reverse --source_file test.src --target_file test.tgt --json

The text is encoded with the run's own tokenizer (or PTB vocabulary) and read
in order, ``--batch_size`` rows of ``--num_steps`` tokens at a time (a
recurrent state carries across windows; a transformer starts each window
afresh). --model_dir may also be a Hugging Face language model's folder
(a family lmkit reads, or one lmkit exported), read with its own tokenizer in
windows of its max_positions, so a pretrained model and a run fine-tuned
from it compare on the same text (pass the same --num_steps). Perplexity per word divides the
total negative log-likelihood by the whitespace-separated words of the same
text (plus one per line, whose end is predicted too), so models with
different tokenizers compare. Runs in one process. A run trained on your own
text keeps the encoded file in the data cache (``--data_cache``, the run's
setting by default): the first evaluation of a file encodes it with every
core, later ones (and the run's own splits, which ``lmkit train`` encoded)
only map it; progress lines go to stderr.

A file of conversations or prompt/completion records (JSON Lines, Parquet, a
datasets folder: the records lmkit train reads as examples, found from the
first record's fields) is scored per assistant token: the loss of every
token the assistant's turns add (a completion's), over their number, as
lmkit train's validation reports it; each record read once, one a row.

An encoder-decoder's run (trained on pairs) is evaluated on line-aligned
--source_file and --target_file (default: the run's --split, test): the
perplexity of the targets given the sources (per target token, the end id
included), then each source decoded (--strategy greedy by default, or beam
with --beam_width and --length_penalty; a Hugging Face folder's
generation_config.json asking for beams decodes as lmkit generate does there,
with transformers' beam search and the file's lengths) and compared with its target: corpus
BLEU (sacrebleu, the standard implementation, 13a tokenization) and exact
match (the share of outputs equal to their target). --output writes the
outputs, one a line.

Output: one line on stdout (or a JSON object with --json). Exit status: 0
done, 2 bad input (one ``error:`` line on stderr), 1 a crash.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from lmkit.cli.common import check_model_dir, model_dir_parser, user_modules_importable
from lmkit.cli.flags import add_beam_flags, config_of_flags
from lmkit.core.errors import UsageError
from lmkit.core.layout import CONFIG_FILE, resolve_checkpoint
from lmkit.core.progress import rate_progress, stderr_line

__all__ = ["build_parser", "main"]


def build_parser(prog: str = "lmkit evaluate") -> argparse.ArgumentParser:
    """The flags of ``lmkit evaluate``."""
    p = model_dir_parser(prog, __doc__)
    what = p.add_mutually_exclusive_group()
    what.add_argument("--text_file", default=None, help="any UTF-8 text, one sentence or paragraph a line, or a "
                                                        "source of another format, as lmkit train's --train_file")
    what.add_argument("--split", choices=["valid", "test", "train"], default=None,
                      help="a split of the run's own data (default: test when --text_file is not given)")
    p.add_argument("--data_path", default="data/ptb", help="PTB runs: the folder with ptb.*.txt")
    p.add_argument("--batch_size", type=int, default=None,
                   help="rows read side by side; default: the run's eval_batch_size or batch_size (a Hugging "
                        "Face folder: 8)")
    p.add_argument("--num_steps", type=int, default=None,
                   help="tokens a window reads (a transformer sees no further back); default: the run's "
                        "num_steps, a Hugging Face folder's max_positions")
    p.add_argument("--data_cache", default=None, metavar="DIR",
                   help="runs on your own text: where encoded text is kept and reused (default: the run's "
                        "data_cache, else $LMKIT_DATA_CACHE, else ~/.cache/lmkit/tokens); 'none' encodes "
                        "into memory")
    pairs = p.add_argument_group("encoder-decoders")
    pairs.add_argument("--source_file", default=None, metavar="PATH", help="sources, one a line")
    pairs.add_argument("--target_file", default=None, metavar="PATH", help="their references, line-aligned")
    pairs.add_argument("--strategy", choices=["greedy", "beam"], default=None,
                       help="how outputs are decoded (default greedy, or beam where a Hugging Face folder's "
                            "generation_config.json asks for beams)")
    add_beam_flags(pairs)
    pairs.add_argument("--max_new_tokens", type=int, default=None,
                       help="the longest output (default: the model's max_positions - 1)")
    pairs.add_argument("--output", default=None, metavar="PATH", help="write the outputs there, one a line")
    p.add_argument("--skip_bad_records", action="store_true",
                   help="conversations and completions: count and leave out bad records instead of stopping")
    p.add_argument("--json", action="store_true", help="print a JSON object instead of a line")
    p.add_argument("--verbose", action="store_true",
                   help="keep TensorFlow's start-up log lines (also LMKIT_VERBOSE=1)")
    return p


def _text_path(args: argparse.Namespace, config) -> str:
    """The file to evaluate: --text_file, or the run's split."""
    if args.text_file is not None:
        return args.text_file
    split = args.split or "test"
    if config.data.kind == "text":
        path = getattr(config.data, f"{split}_file")
        if not path:
            raise UsageError(f"the run in {args.model_dir} had no {split}_file; pass --text_file")
        return path
    from lmkit.data.ptb import find_ptb
    folder = find_ptb(args.data_path)
    if folder is None:
        raise UsageError(f"--data_path {args.data_path} holds no PTB files (ptb.{split}.txt); "
                         "pass the --data_path of the run, or --text_file")
    return os.path.join(folder, f"ptb.{split}.txt")


def main(argv: Optional[Sequence[str]] = None, prog: str = "lmkit evaluate") -> int:
    """Evaluates as the flags say; returns the exit status."""
    args = build_parser(prog).parse_args(argv)
    from lmkit.decoding.source import open_folder
    folder = open_folder(args.model_dir)
    if not folder.hugging_face:
        check_model_dir(args.model_dir)
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError(f"--batch_size {args.batch_size} must be >= 1")
    if args.num_steps is not None and args.num_steps < 1:
        raise UsageError(f"--num_steps {args.num_steps} must be >= 1")
    from lmkit.core.preemption import set_doing  # what a signal stopped, in its message
    if folder.conditional:
        set_doing(f"evaluating {args.model_dir} on source/target pairs")
        return _evaluate_pairs(args, folder)
    if args.source_file or args.target_file:
        raise UsageError(f"--source_file and --target_file evaluate an encoder-decoder, but {args.model_dir} holds a "
                         "language model; pass --text_file")
    return _evaluate_text(args, folder)


def _evaluate_text(args: argparse.Namespace, folder: Any) -> int:
    """Perplexity of a language model on a text, per token and per word."""
    from lmkit.config import TrainConfig
    from lmkit.core.layout import read_config_dict
    from lmkit.core.preemption import set_doing
    from lmkit.data.formats import DATASET_SPLITS, Source
    from lmkit.data.text import load_text_data
    from lmkit.data.token_cache import cache_root

    if folder.hugging_face:  # a pretrained model's folder: its own tokenizer, no run config and no splits
        if args.text_file is None:
            raise UsageError(f"{args.model_dir} is a Hugging Face folder, which has no data splits; pass --text_file")
        config, checkpoint, tokenizer = None, None, folder.tokenizer(args.checkpoint)
        cache = cache_root(args.data_cache or "")
    else:
        config = TrainConfig.from_dict(read_config_dict(args.model_dir),
                                       source=f"{args.model_dir}/{CONFIG_FILE}")
        if config.data.kind == "text":  # the run's tokenizer, saved in model_dir, keys the cache
            cache = cache_root(config.data.data_cache if args.data_cache is None else args.data_cache)
        elif args.data_cache is not None:
            raise UsageError(f"--data_cache is for runs on your own text, but {args.model_dir} trained on PTB "
                             "(its word ids are read in memory); leave it out")
        else:
            cache = None
        checkpoint = resolve_checkpoint(args.model_dir, args.checkpoint)
        tokenizer = folder.tokenizer()
    path = _text_path(args, config)
    if _holds_examples(path, config):  # conversations, completions: per assistant token
        return _evaluate_examples(args, folder, config, (checkpoint, tokenizer, cache), path)
    named = "--text_file" if args.text_file else f"the run's {args.split or 'test'} file"
    # checks the file (no TF yet), then encodes it or maps its cached ids
    set_doing(f"reading {path}" + ("" if cache is None else " (through the data cache)"))
    if config is not None and config.data.kind == "text":  # the run's records hold their text where it says
        path = Source(path, text_field=config.data.text_field, text_column=config.data.text_column,
                      dataset_split=DATASET_SPLITS[args.split or "test"])
    text = load_text_data(tokenizer, path, cache_dir=cache, log=stderr_line, names={"train": named})
    user_modules_importable()

    from lmkit import distributed as dist

    dist.init(backend="local")
    set_doing(f"loading the model of {args.model_dir}")
    generator = folder.load(checkpoint, tokenizer if folder.hugging_face else None)
    model = generator.model
    if folder.hugging_face:
        num_steps, batch = args.num_steps or model.max_positions, args.batch_size or 8
    else:
        tokenizer, config = generator.tokenizer, generator.config
        num_steps = args.num_steps or config.data.num_steps
        batch = args.batch_size or config.data.eval_batch_size or config.data.batch_size
    limit = getattr(model, "max_positions", None)
    if args.num_steps is not None and limit is not None and args.num_steps > limit:
        raise UsageError(f"--num_steps {args.num_steps} exceeds the {limit} positions the model holds "
                         f"(max_positions); use --num_steps {limit} or fewer")
    return _report_perplexity(args, model, tokenizer, text, path, num_steps, batch)


def _holds_examples(path: str, config: Any) -> bool:
    """Whether ``path`` is read as examples with loss weights: a run trained on them names its data_format, or
    the file's first record has messages or a prompt."""
    from lmkit.data.chat import holds_examples
    if config is not None and config.data.kind == "text" and config.data.data_format:
        return True
    return os.path.exists(path) and holds_examples(path, "--text_file")


def _evaluate_examples(args: argparse.Namespace, folder: Any, config: Any, read: Tuple[Any, Any, Any],
                       path: str) -> int:
    """Perplexity per weighted target (per assistant token) of a file of conversations or completions."""
    from lmkit.core.preemption import set_doing
    from lmkit.data.example_cache import cached_examples, check_bad_records, encode_examples
    from lmkit.data.packing import fit_examples
    from lmkit.train.chat_data import chat_encoder, hf_chat_encoder

    checkpoint, tokenizer, cache = read
    encoder = hf_chat_encoder(folder.path, tokenizer) if config is None else chat_encoder(config, tokenizer)
    options = dict(data_format=None if config is None else config.data.data_format or None, what="--text_file",
                   skip_bad_records=args.skip_bad_records, log=stderr_line)
    set_doing(f"reading {path}" + ("" if cache is None else " (through the data cache)"))
    found = (encode_examples(encoder, [path], **options) if cache is None else
             cached_examples(cache, encoder, [path], **options))
    check_bad_records(found, args.skip_bad_records, "--text_file")
    user_modules_importable()
    from lmkit import distributed as dist
    from lmkit.train.evaluation import ExampleEvaluator
    from lmkit.train.metrics import perplexity

    dist.init(backend="local")
    set_doing(f"loading the model of {args.model_dir}")
    model = folder.load(checkpoint, tokenizer if folder.hugging_face else None).model
    num_steps = args.num_steps or (model.max_positions if config is None else config.data.num_steps)
    batch = args.batch_size or (8 if config is None else config.data.eval_batch_size or config.data.batch_size)
    examples, fitted = fit_examples(found.examples, num_steps + 1)
    for line in found.report.lines("--text_file") + fitted.lines("--text_file", num_steps + 1):
        stderr_line(line)
    set_doing(f"evaluating {path}")
    total, weight = ExampleEvaluator(model, num_steps, batch).total_loss(examples)
    loss = total / max(weight, 1.0)
    report = {"model_dir": args.model_dir, "text": path, "records": found.report.records, "examples": len(examples),
              "weighted_tokens": int(weight), "loss_per_token": loss, "perplexity": perplexity(loss)}
    return _print_report(args, report, f"{path}: perplexity {report['perplexity']:.2f} per assistant token "
                         f"({int(weight)} weighted tokens in {len(examples)} examples)")


def _print_report(args: argparse.Namespace, report: dict, line: str) -> int:
    """Prints ``report`` as JSON with --json, else ``line``; the command's exit status (0)."""
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else line, flush=True)
    return 0


def _report_perplexity(args: argparse.Namespace, model: Any, tokenizer: Any, text: Any, path: str, num_steps: int,
                       batch: int) -> int:
    """Reads ``text`` in windows of ``num_steps`` tokens, ``batch`` rows at a time, and prints the perplexity."""
    from lmkit.core.preemption import set_doing
    from lmkit.data.batching import num_bptt_batches
    from lmkit.train.evaluation import Evaluator, word_perplexity
    from lmkit.train.metrics import perplexity

    # Long evaluations say how far they are, every few seconds, on stderr.
    per_batch = batch * num_steps
    total = per_batch * num_bptt_batches(len(text.train), batch, num_steps)  # the windows mean_loss reads
    update, done = rate_progress(stderr_line, f"evaluating {path}", total, unit="tokens", every=5.0), [0]

    def on_batch() -> None:
        done[0] += per_batch
        update(done[0])

    set_doing(f"evaluating {path}")
    loss = Evaluator(model, num_steps, batch).mean_loss(text.train, on_batch=on_batch)
    tokens, words = len(text.train), text.train_words
    report = {"model_dir": args.model_dir, "text": path, "tokenizer": tokenizer.name,
              "tokens": tokens, "words": words, "loss_per_token": loss,
              "perplexity": perplexity(loss), "word_perplexity": word_perplexity(loss, tokens, words)}
    return _print_report(args, report, f"{path}: perplexity {report['perplexity']:.2f} per token ({tokens} tokens), "
                         f"{report['word_perplexity']:.2f} per word ({words} words)")


def _pair_paths(args: argparse.Namespace, config) -> "tuple[str, str]":
    """The sources and references to evaluate: the flags, or the run's --split."""
    if args.text_file is not None:
        raise UsageError(f"{args.model_dir} holds an encoder-decoder: pass --source_file and --target_file, "
                         "not --text_file")
    if bool(args.source_file) != bool(args.target_file):
        raise UsageError("give both --source_file and --target_file (line i of one goes with line i of the other)")
    if args.source_file:
        return args.source_file, args.target_file
    if config is None:
        raise UsageError(f"{args.model_dir} is a Hugging Face folder, which has no data splits; pass --source_file "
                         "and --target_file")
    split = args.split or "test"
    prefix = "" if split == "train" else f"{split}_"
    source, target = getattr(config.data, f"{prefix}source_file"), getattr(config.data, f"{prefix}target_file")
    if not source:
        raise UsageError(f"the run in {args.model_dir} had no {prefix}source_file; pass --source_file and "
                         "--target_file")
    return source, target


def _evaluate_pairs(args: argparse.Namespace, folder: Any) -> int:
    """Perplexity, BLEU and exact match of an encoder-decoder on line-aligned pairs."""
    from lmkit.config import TrainConfig
    from lmkit.core.layout import read_config_dict
    from lmkit.data.paired import encode_pairs, read_pairs
    from lmkit.decoding.source import source_tokenizer_of_run
    from lmkit.decoding.transduction import score

    if args.data_cache is not None:
        raise UsageError(f"--data_cache is for language models; {args.model_dir} holds an encoder-decoder, whose "
                         "pairs are read in memory (their text is needed for BLEU anyway); leave it out")
    hf_folder = folder.hugging_face  # no run config: the tokenizers and sizes of the folder
    config = None if hf_folder else TrainConfig.from_dict(read_config_dict(args.model_dir),
                                                          source=f"{args.model_dir}/{CONFIG_FILE}")
    checkpoint = args.checkpoint if hf_folder else resolve_checkpoint(args.model_dir, args.checkpoint)
    source_path, target_path = _pair_paths(args, config)
    sources, references = read_pairs(source_path, target_path)  # checks the files: no TF yet
    if not hf_folder:
        tokenizer = folder.tokenizer()
        source_tokenizer = source_tokenizer_of_run(args.model_dir, config.data.share_vocab)
    user_modules_importable()

    from lmkit import distributed as dist
    from lmkit.data.paired import SpecialIds
    from lmkit.train.evaluation import PairEvaluator
    from lmkit.train.metrics import perplexity

    dist.init(backend="local")
    generator = folder.load(checkpoint)
    if hf_folder:
        tokenizer, source_tokenizer = generator.tokenizer, generator.source_tokenizer
    # Perplexity over the pairs the model can read; BLEU and exact match over every line.
    max_source = generator.model.source_positions.max_positions if hf_folder else config.model["max_source_positions"]
    pairs = encode_pairs(sources, references, source_tokenizer.encode, tokenizer.encode,
                         max_source_length=max_source, max_target_length=generator.model.max_positions - 1)
    batch = args.batch_size or (32 if hf_folder else config.data.eval_batch_size or config.data.batch_size)
    total, tokens = PairEvaluator(generator.model, batch, SpecialIds.of(tokenizer)).total_loss(pairs)
    loss = total / max(tokens, 1)
    outputs, plan = _decode_pairs(args, generator, sources, source_path, batch)
    if args.output:
        from lmkit.core.fileio import atomic_write_text
        atomic_write_text(args.output, "".join(text.replace("\n", " ") + "\n" for text in outputs))
    scores = score(outputs, references)
    report = {"model_dir": args.model_dir, "source_file": source_path, "target_file": target_path,
              "pairs": len(sources), "scored_pairs": len(pairs), "target_tokens": tokens,
              "loss_per_token": loss, "perplexity": perplexity(loss), **_decoding(plan.settings), **scores}
    skipped = "" if len(pairs) == len(sources) else f" of {len(pairs)} readable pairs ({pairs.report.summary()})"
    return _print_report(args, report, f"{target_path}: perplexity {report['perplexity']:.2f} per token ({tokens} "
                         f"target tokens{skipped}), BLEU {scores['bleu']:.2f}, exact match "
                         f"{100 * scores['exact_match']:.1f}% of {len(sources)} ({plan.settings.strategy})")


def _decode_pairs(args: argparse.Namespace, generator: Any, sources: Sequence[str], source_path: str,
                  batch: int) -> Tuple[List[str], Any]:
    """``(outputs, plan)``: each source decoded as ``lmkit generate`` decodes it (the flags, else what the model
    folder's generation_config.json asks for: beam search or not, its rules on tokens and its lengths, fitted
    to the decoder; else greedy), ``batch`` sources side by side. Decoding stays deterministic: a folder that
    asks for sampling is decoded greedily (with its rules and lengths)."""
    import sys

    from lmkit.decoding.checks import flag_spelling
    from lmkit.decoding.plan import plan_generation

    with flag_spelling():
        plan = plan_generation(generator, sources, config_of_flags(args, batch_size=batch), deterministic=True)
    note = plan.note()
    if note:
        sys.stderr.write(note + "\n")
    update = rate_progress(stderr_line, f"decoding {source_path}", len(sources), unit="sources", every=5.0)
    samples = plan.run(on_batch=lambda done, _: update(done))
    return [sample.text for sample in samples], plan


def _decoding(settings: Any) -> Dict[str, Any]:
    """The report's ``strategy``, beam search's settings, and ``decoding``: the strategy's settings, the rules on
    tokens and the lengths."""
    from lmkit.decoding.registry import RULE_KEYS
    sampler = settings.sampler().get_config()
    beam = {"beam_width": settings.beam_width, "length_penalty": settings.length_penalty,
            "beam_scoring": settings.beam_scoring} if settings.strategy == "beam" else {}
    return {"strategy": settings.strategy, **beam,
            "decoding": {**sampler, **{key: getattr(settings, key) for key in RULE_KEYS},
                         "min_new_tokens": settings.min_new_tokens, "max_new_tokens": settings.max_new_tokens}}
