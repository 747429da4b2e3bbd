"""``lmkit generate``: text from a trained model folder.

    lmkit generate --model_dir runs/config_small --prompt "the company said" \\
        --strategy top_p --top_p 0.9 --num_samples 5 --max_length 50 --seed 0

The model, its tokenizer (or PTB vocabulary) and its config are read from
--model_dir, as the training run left them; a model of your own class is
rebuilt from the import path stored in its config (its module must be
importable: installed, on PYTHONPATH or in the current folder). --model_dir
may also be a Hugging Face GPT-2 folder (config.json with model_type gpt2,
model.safetensors, tokenizer.json or vocab.json + merges.txt): its weights
and tokenizer are read directly (docs/gpt2.md).

Output: one line per sample on stdout, ``[<prompt>.<sample>] text``: the
prompt, then the continuation, detokenized (sentencepiece pieces joined,
bytes decoded as UTF-8). Warnings (prompt words missing from a word
vocabulary) and the seed of a sampled run go to stderr; with --verbose also
the time to build and load the model, the first call's time (it compiles the
decode loop with XLA, once per batch size, length and strategy) and the
tokens/sec of a second call of the compiled loop.
Every sample starts at a sentence boundary (the tokenizer's end-of-sentence
token) and ends at the next generated one (not printed) or after
--max_length tokens. With --strategy beam the samples of a prompt are the
best --num_samples hypotheses of one beam search.

Exit status: 0 done, 2 bad input (one ``error:`` line on stderr), 1 a crash.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from typing import Any, List, Optional, Sequence, Tuple

from lmkit.cli.common import check_model_dir, model_dir_parser, user_modules_importable
from lmkit.decoding.registry import SAMPLER_NAMES, SAMPLERS
from lmkit.errors import UsageError
from lmkit.hf import is_hf_folder, read_gpt2_config, read_tokenizer
from lmkit.layout import resolve_checkpoint

__all__ = ["build_parser", "check_args", "main"]


def build_parser(prog: str = "lmkit generate") -> argparse.ArgumentParser:
    """The flags of ``lmkit generate``; a bad flag prints the usage and exits with status 2."""
    p = model_dir_parser(prog, __doc__)
    p.add_argument("--prompt", action="append", default=None,
                   help="text to continue (repeatable; default: the start of a sentence)")
    p.add_argument("--strategy", choices=SAMPLER_NAMES, default="top_p")
    p.add_argument("--temperature", type=float, default=1.0, help="sample, top_k, top_p")
    p.add_argument("--top_k", type=int, default=40)
    p.add_argument("--top_p", type=float, default=0.9)
    p.add_argument("--beam_width", type=int, default=4)
    p.add_argument("--length_penalty", type=float, default=0.6, help="GNMT alpha for beam search")
    p.add_argument("--num_samples", type=int, default=1, help="samples per prompt")
    p.add_argument("--max_length", type=int, default=50, help="tokens per sample, prompt included")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the random strategies (default: drawn, and printed to stderr)")
    p.add_argument("--verbose", action="store_true",
                   help="print the load time and the generation speed to stderr, and keep "
                        "TensorFlow's start-up log lines (also LMKIT_VERBOSE=1)")
    return p


def check_args(args: argparse.Namespace) -> Tuple[Any, List[List[int]], List[List[str]]]:
    """Checks the flags, the model folder and the prompts; needs no TensorFlow, so it answers at once.

    Returns:
      ``(tokenizer, prompt ids, unknown words of each prompt)``; a run
      without --prompt has one empty prompt (start at a sentence boundary).

    Raises:
      UsageError: a flag out of range, a missing model folder or tokenizer,
        a prompt that is empty after tokenization or too long, naming the
        flag and the fix.
    """
    from lmkit.data.tokenizers import tokenizer_of_run

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
    if is_hf_folder(args.model_dir):  # a Hugging Face GPT-2 folder, read as it is
        if args.checkpoint:
            raise UsageError(f"--checkpoint applies to lmkit training runs; {args.model_dir} is a Hugging Face "
                             "folder with one set of weights")
        read_gpt2_config(args.model_dir)
        tokenizer = read_tokenizer(args.model_dir)
    else:
        check_model_dir(args.model_dir)
        tokenizer = tokenizer_of_run(args.model_dir)
    vocab = getattr(tokenizer, "vocab", None) if tokenizer.name == "word" else None
    prompts, unknown = [], []
    for text in args.prompt or [None]:
        if text is None:
            prompts.append([])
            unknown.append([])
            continue
        ids = tokenizer.encode(text) if text.strip() else []
        if tokenizer.eos_id is not None:  # line breaks typed in a prompt are not sentence ends
            ids = [i for i in ids if i != tokenizer.eos_id]
        if not ids:
            raise UsageError(f"--prompt {text!r} is empty after tokenization; give at least one "
                             "word, or leave --prompt out to start at a sentence boundary")
        if len(ids) >= args.max_length:
            raise UsageError(f"--prompt {text!r} has {len(ids)} tokens, leaving none to generate "
                             f"within --max_length {args.max_length} (the prompt counts); "
                             f"use --max_length {len(ids) + 1} or more")
        prompts.append(ids)
        unknown.append([w for w in text.split() if w not in vocab] if vocab is not None else [])
    return tokenizer, prompts, unknown


# Characters that end a line for str.splitlines; a sample stays on its line.
_LINE_BREAKS = {c: repr(c)[1:-1] for c in "\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"}


def one_line(text: str) -> str:
    """``text`` on one line: a line break inside it shows as ``\\n``, other breaks escaped too."""
    return text.replace("\n", "\\n").translate(str.maketrans(_LINE_BREAKS))


def _describe_unknown(unknown: Sequence[str], vocab: Any) -> str:
    """``'The' (try 'the'), 'zzz'``: the unknown words, with a lower-case hint when it helps."""
    parts = []
    for w in dict.fromkeys(unknown):  # unique, in order
        hint = f" (try {w.lower()!r})" if w.lower() != w and w.lower() in vocab else ""
        parts.append(f"{w!r}{hint}")
    return ", ".join(parts)


def build_sampler(args: argparse.Namespace):
    """The --strategy sampler, from the registry, with the flags its constructor takes."""
    from lmkit.registry import import_object

    flags = {"temperature": args.temperature, "k": args.top_k, "p": args.top_p,
             "beam_width": args.beam_width, "length_penalty": args.length_penalty}
    cls = import_object(SAMPLERS[args.strategy], "sampler")
    takes = inspect.signature(cls.__init__).parameters
    return cls(**{k: v for k, v in flags.items() if k in takes})


def main(argv: Optional[Sequence[str]] = None, prog: str = "lmkit generate") -> int:
    """Generates as the flags say; returns the exit status (errors are raised, see ``run_main``)."""
    args = build_parser(prog).parse_args(argv)
    tokenizer, prompts, unknown = check_args(args)
    hf_folder = is_hf_folder(args.model_dir)
    checkpoint = None if hf_folder else resolve_checkpoint(args.model_dir, args.checkpoint)
    user_modules_importable()

    from lmkit import decoding, dist
    from lmkit.train.checkpoint import load_model

    dist.init(backend="local")  # one process: threads and devices set before TensorFlow starts
    start = time.perf_counter()
    if hf_folder:
        from lmkit.hf import load_gpt2
        model, _, _ = load_gpt2(args.model_dir, tokenizer)  # the tokenizer check_args read
        model_name = "gpt2 (Hugging Face folder)"
    else:
        model, _, config = load_model(args.model_dir, checkpoint)
        model_name = config.model
    loaded = time.perf_counter() - start

    # Starting after an end-of-sentence token makes the prompt the beginning
    # of a sentence, as in training.
    start_id = tokenizer.eos_id if tokenizer.eos_id is not None else tokenizer.bos_id
    if start_id is None and any(not ids for ids in prompts):
        raise UsageError(f"the tokenizer of {args.model_dir} has no end- or start-of-sentence token "
                         "to start from; give a --prompt")
    # decode counts the start token in its max_length; --max_length does not.
    decode_length = args.max_length + (start_id is not None)
    limit = getattr(model, "max_positions", None)
    if limit is not None and decode_length > limit:
        raise UsageError(f"--max_length {args.max_length} is more than the model can hold: "
                         f"max_positions {limit}, one of them taken by the start token; use "
                         f"--max_length {limit - (start_id is not None)} or less")
    vocab = getattr(tokenizer, "vocab", None)
    for i, words in enumerate(unknown):
        if words:
            sys.stderr.write(f"warning: prompt {i}: {_describe_unknown(words, vocab)} not in the "
                             f"vocabulary of {args.model_dir} ({len(vocab)} words); read as "
                             f"{vocab.id_to_token(vocab.unk_id)}\n")

    beam = args.strategy == "beam"
    # Beam search returns num_samples hypotheses of one search per prompt;
    # the other strategies sample each prompt num_samples times.
    rows = prompts if beam else [ids for ids in prompts for _ in range(args.num_samples)]
    sampler = build_sampler(args)

    def run() -> Any:
        return decoding.decode(model, decode_length, sampler, prompts=rows, eos_id=tokenizer.eos_id,
                               start_id=start_id, seed=None if beam else args.seed)

    start = time.perf_counter()
    result = run()
    first_call = time.perf_counter() - start
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
    generated = 0
    for i, j, ids in samples:
        if start_id is not None:
            ids = ids[1:]
        # Only a generated end of sentence ends a row.
        if len(ids) > len(prompts[i]) and ids[-1] == tokenizer.eos_id:
            ids = ids[:-1]
        generated += len(ids) - len(prompts[i])
        print(f"[{i}.{j}] {one_line(tokenizer.decode(ids))}", flush=True)
    if args.verbose:
        start = time.perf_counter()
        run()  # the compiled loop again (the same seed: the same work)
        seconds = time.perf_counter() - start
        sys.stderr.write(f"model {model_name} loaded in {loaded:.1f} s; first call (compiling the decode loop "
                         f"included) {first_call:.2f} s; compiled: {generated} tokens in {seconds:.2f} s, "
                         f"{generated / max(seconds, 1e-9):.0f} tokens/sec\n")
    return 0
