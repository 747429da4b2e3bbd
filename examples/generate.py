#!/usr/bin/env python
"""Generates text from a trained lmkit language model.

    python examples/generate.py --model_dir runs/config_small \
        --prompt "the company said" --strategy top_p --top_p 0.9 \
        --num_samples 5 --max_length 50 --seed 0

The model is rebuilt from the config and vocabulary stored in --model_dir by
the training examples (single-process or distributed), so the config need not
be passed again.

Output: one line per sample on stdout, ``[<prompt>.<sample>] words...``, the
prompt words first. Warnings (prompt words missing from the vocabulary) and
the seed of a sampled run go to stderr. Every sample starts at a sentence
boundary (PTB's ``<eos>``) and ends at the next generated ``<eos>`` (not
printed) or after --max_length words. With ``--strategy beam`` the samples
of a prompt are the best --num_samples hypotheses of one beam search.

Exit status: 0 done, 2 bad input (one ``error:`` line on stderr), 1 a crash.
"""
import argparse
import os
import sys
from typing import List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# None of these imports TensorFlow: flags and the folder are checked at once.
from lmkit.decoding.registry import SAMPLER_NAMES  # noqa: E402
from lmkit.errors import CheckpointError, UsageError  # noqa: E402
from lmkit.layout import CONFIG_FILE, resolve_checkpoint  # noqa: E402


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """Parses the flags; a bad flag prints the usage and exits with status 2."""
    p = argparse.ArgumentParser(prog="generate.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model_dir", required=True, help="the --model_dir of a training run")
    p.add_argument("--checkpoint", default=None,
                   help="a ckpt-<step> folder, as a path or a name in <model_dir>/checkpoints "
                        "(default: the latest)")
    p.add_argument("--prompt", action="append", default=None,
                   help="words to continue (repeatable; default: the start of a sentence)")
    p.add_argument("--strategy", choices=SAMPLER_NAMES, default="top_p")
    p.add_argument("--temperature", type=float, default=1.0, help="sample, top_k, top_p")
    p.add_argument("--top_k", type=int, default=40)
    p.add_argument("--top_p", type=float, default=0.9)
    p.add_argument("--beam_width", type=int, default=4)
    p.add_argument("--length_penalty", type=float, default=0.6, help="GNMT alpha for beam search")
    p.add_argument("--num_samples", type=int, default=1, help="samples per prompt")
    p.add_argument("--max_length", type=int, default=50, help="words per sample, prompt included")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the random strategies (default: drawn, and printed to stderr)")
    return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> List[List[str]]:
    """Checks the flags and the model folder; needs no TensorFlow, so it answers at once.

    Returns:
      The prompts as word lists, one per --prompt (``[[]]`` without --prompt:
      start at a sentence boundary).

    Raises:
      UsageError: a flag out of range, a missing model folder, an empty or
        too long prompt, naming the flag and the fix.
    """
    limits = [
        ("--num_samples", args.num_samples, args.num_samples >= 1, "must be >= 1"),
        ("--max_length", args.max_length, args.max_length >= 1, "must be >= 1"),
        ("--beam_width", args.beam_width, args.beam_width >= 1, "must be >= 1"),
        ("--temperature", args.temperature, args.temperature > 0, "must be > 0 (use 1e-3 for near-greedy)"),
        ("--top_k", args.top_k, args.top_k >= 1, "must be >= 1"),
        ("--top_p", args.top_p, 0 < args.top_p <= 1, "must be in (0, 1]"),
        ("--seed", args.seed, args.seed is None or args.seed >= 0, "must be >= 0"),
    ]
    for flag, value, ok, need in limits:
        if not ok:
            raise UsageError(f"{flag} {value} {need}")
    if args.strategy == "beam" and args.num_samples > args.beam_width:
        raise UsageError(f"--num_samples {args.num_samples} exceeds --beam_width {args.beam_width}: "
                         f"beam search keeps beam_width hypotheses; use --beam_width {args.num_samples}")
    if not os.path.isdir(args.model_dir):
        raise UsageError(f"--model_dir {args.model_dir} does not exist; pass the --model_dir of a "
                         "training run (examples/lm_ptb.py or lm_ptb_distributed.py)")
    if not os.path.isfile(os.path.join(args.model_dir, CONFIG_FILE)):
        raise UsageError(f"--model_dir {args.model_dir} holds no {CONFIG_FILE}, so no training run "
                         "wrote it; pass the --model_dir of a training run")
    prompts = []
    for text in args.prompt or [None]:
        if text is None:
            prompts.append([])
            continue
        words = text.split()
        if not words:
            raise UsageError(f"--prompt {text!r} is empty; give at least one word, or leave "
                             "--prompt out to start at a sentence boundary")
        if len(words) >= args.max_length:
            raise UsageError(f"--prompt {text!r} has {len(words)} words, leaving none to generate "
                             f"within --max_length {args.max_length} (the prompt counts); "
                             f"use --max_length {len(words) + 1} or more")
        prompts.append(words)
    return prompts


def encode_prompt(words: Sequence[str], vocab) -> Tuple[List[int], List[str]]:
    """Word ids of a prompt, out-of-vocabulary words as ``<unk>``.

    Returns:
      ``(ids, unknown_words)``.

    Raises:
      UsageError: a word is unknown and the vocabulary has no ``<unk>``.
    """
    unknown = [w for w in words if w not in vocab]
    if unknown and vocab.unk_id is None:
        raise UsageError(f"prompt word {unknown[0]!r} is not in the vocabulary, which has no "
                         "unknown-word token; use words of the training data")
    return vocab.encode(words), unknown


def describe_unknown(unknown: Sequence[str], vocab) -> str:
    """``'The' (try 'the'), 'zzz'``: the unknown words, with a lower-case hint when it helps."""
    parts = []
    for w in dict.fromkeys(unknown):  # unique, in order
        hint = f" (try {w.lower()!r})" if w.lower() != w and w.lower() in vocab else ""
        parts.append(f"{w!r}{hint}")
    return ", ".join(parts)


def build_sampler(args: argparse.Namespace):
    """The --strategy sampler, from the registry, with the flags its constructor takes."""
    import inspect

    from lmkit.decoding.registry import SAMPLERS
    from lmkit.registry import import_object

    flags = {"temperature": args.temperature, "k": args.top_k, "p": args.top_p,
             "beam_width": args.beam_width, "length_penalty": args.length_penalty}
    cls = import_object(SAMPLERS[args.strategy], "sampler")
    takes = inspect.signature(cls.__init__).parameters
    return cls(**{k: v for k, v in flags.items() if k in takes})


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    prompt_words = check_args(args)

    import tensorflow as tf

    from lmkit import decoding
    from lmkit.train.checkpoint import load_model

    checkpoint = resolve_checkpoint(args.model_dir, args.checkpoint)
    try:
        model, vocab, config = load_model(args.model_dir, checkpoint)
    except (AssertionError, tf.errors.OpError) as exc:  # weights that do not fit config.json
        raise CheckpointError(f"the checkpoint in {args.model_dir} does not match its {CONFIG_FILE} "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                              "pass the --model_dir of one training run, unchanged") from None

    # PTB marks sentence boundaries with <eos>: starting after one makes the
    # prompt the beginning of a sentence, as in training.
    start_id = vocab.eos_id if vocab.eos_id is not None else vocab.bos_id
    if start_id is None and any(not words for words in prompt_words):
        raise UsageError(f"the vocabulary of {args.model_dir} has no <eos> or <bos> to start "
                         "from; give a --prompt")
    # decode counts the start token in its max_length; --max_length does not.
    decode_length = args.max_length + (start_id is not None)
    if config.model == "transformer" and decode_length > config.max_positions:
        limit = config.max_positions - (start_id is not None)
        raise UsageError(f"--max_length {args.max_length} is more than the model can hold: "
                         f"max_positions {config.max_positions}, one of them taken by the start "
                         f"token; use --max_length {limit} or less")

    prompts = []
    for i, words in enumerate(prompt_words):
        ids, unknown = encode_prompt(words, vocab)
        if unknown:
            sys.stderr.write(f"warning: prompt {i}: {describe_unknown(unknown, vocab)} not in the "
                             f"vocabulary of {args.model_dir} ({len(vocab)} words); read as "
                             f"{vocab.id_to_token(vocab.unk_id)}\n")
        prompts.append(ids)

    sampler = build_sampler(args)
    beam = args.strategy == "beam"
    # Beam search returns num_samples hypotheses of one search per prompt;
    # the other strategies sample each prompt num_samples times.
    rows = prompts if beam else [ids for ids in prompts for _ in range(args.num_samples)]
    result = decoding.decode(model, decode_length, sampler, prompts=rows, eos_id=vocab.eos_id,
                             start_id=start_id, seed=None if beam else args.seed)
    samples: List[Tuple[int, int, List[int]]] = []  # (prompt, sample, ids with the prompt)
    if beam:
        for i in range(len(prompts)):
            for j in range(args.num_samples):
                if result.beam_scores[i, j] > -float("inf"):  # -inf marks an unused slot
                    samples.append((i, j, result.beam_ids[i, j, :result.beam_lengths[i, j]].tolist()))
    else:
        if args.seed is None and args.strategy != "greedy":
            sys.stderr.write(f"seed {result.seed} (pass --seed {result.seed} to repeat)\n")
        for n, ids in enumerate(result.sequences(include_prompt=True)):
            samples.append((n // args.num_samples, n % args.num_samples, ids))

    for i, j, ids in samples:
        if start_id is not None:
            ids = ids[1:]
        # Only a generated <eos> ends a row (one typed in the prompt does not).
        if len(ids) > len(prompts[i]) and ids[-1] == vocab.eos_id:
            ids = ids[:-1]
        print(f"[{i}.{j}] {' '.join(vocab.decode(ids))}", flush=True)
    return 0


if __name__ == "__main__":
    # Flags and the model folder are checked before TensorFlow loads (several
    # seconds), so a typo answers at once; run_main then maps the outcome of
    # main to one message and an exit status.
    try:
        check_args(parse_args(sys.argv[1:]))
    except UsageError as exc:
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(exc.exit_code)
    from lmkit.train.cli import run_main

    run_main(main)
