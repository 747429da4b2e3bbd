#!/usr/bin/env python
"""Generates text from a trained lmkit language model.

    python examples/generate.py --model_dir runs/config_small \
        --prompt "the company said" --strategy top_p --top_p 0.9 \
        --num_samples 5 --max_length 50 --seed 0

The model is rebuilt from the config and vocabulary stored in --model_dir by
the training examples (single-process or distributed), so the config need not
be passed again.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lmkit.train.cli import run_main  # noqa: E402

STRATEGIES = ("greedy", "sample", "top_k", "top_p", "beam")


def parse_args(argv):
    from lmkit.train.cli import _Parser
    p = _Parser(prog="generate.py", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model_dir", required=True, help="the --model_dir of a training run")
    p.add_argument("--checkpoint", default=None, help="a ckpt-<step> folder (default: the latest)")
    p.add_argument("--prompt", action="append", default=None,
                   help="text to continue (repeatable; default: start of a sentence)")
    p.add_argument("--strategy", choices=STRATEGIES, default="top_p")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top_k", type=int, default=40)
    p.add_argument("--top_p", type=float, default=0.9)
    p.add_argument("--beam_width", type=int, default=4)
    p.add_argument("--length_penalty", type=float, default=0.6, help="GNMT alpha for beam search")
    p.add_argument("--num_samples", type=int, default=1, help="samples per prompt")
    p.add_argument("--max_length", type=int, default=50, help="tokens per sample, prompt included")
    p.add_argument("--seed", type=int, default=None)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from lmkit import decoding
    from lmkit.errors import UsageError
    from lmkit.train.checkpoint import load_model

    if args.num_samples < 1 or args.max_length < 2:
        raise UsageError(f"--num_samples {args.num_samples} and --max_length {args.max_length} "
                         "must be >= 1 and >= 2")
    model, vocab, config = load_model(args.model_dir, args.checkpoint)
    if config.model == "transformer" and args.max_length > config.max_positions:
        raise UsageError(f"--max_length {args.max_length} exceeds the model's max_positions "
                         f"{config.max_positions}; use at most {config.max_positions}")
    prompts_text = args.prompt or [""]
    prompts = []
    for text in prompts_text:
        ids = vocab.encode(text.split()) if text.strip() else []
        prompts.extend([ids] * args.num_samples)
    start = vocab.eos_id
    kwargs = dict(prompts=prompts, eos_id=vocab.eos_id, start_id=start)
    if args.strategy == "beam":
        result = decoding.beam_search(model, args.max_length, beam_width=args.beam_width,
                                      length_penalty=args.length_penalty, **kwargs)
    else:
        params = {"greedy": {}, "sample": {"temperature": args.temperature},
                  "top_k": {"k": args.top_k, "temperature": args.temperature},
                  "top_p": {"p": args.top_p, "temperature": args.temperature}}[args.strategy]
        try:
            sampler = decoding.get_sampler(args.strategy, **params)
        except ValueError as exc:  # e.g. --top_p 1.5
            raise UsageError(str(exc)) from None
        result = decoding.decode(model, args.max_length, sampler, seed=args.seed, **kwargs)
    for i, ids in enumerate(result.sequences(include_prompt=True)):
        ids = ids[1:]  # drop the start token
        words = [w for w in vocab.decode(ids)]
        if words and words[-1] == "<eos>":
            words = words[:-1]
        print(f"[{i // args.num_samples}.{i % args.num_samples}] {' '.join(words)}", flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
