#!/usr/bin/env python
"""Writes a synthetic transduction task as line-aligned files, to train an encoder-decoder on.

    python examples/make_pairs.py --task reverse --out data/reverse
    lmkit train --config config_seq2seq --source_file data/reverse/train.src \
        --target_file data/reverse/train.tgt --valid_source_file data/reverse/valid.src \
        --valid_target_file data/reverse/valid.tgt --model_dir runs/reverse

Tasks (``lmkit.data.synthetic``): copy, reverse, sort. The validation and
test sources never appear among the training ones.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lmkit.data.synthetic import TASKS, write_task  # noqa: E402  (no TensorFlow)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--task", choices=sorted(TASKS), default="reverse")
    p.add_argument("--out", required=True, help="the folder for {train,valid,test}.{src,tgt}")
    p.add_argument("--train", type=int, default=20000, help="training pairs")
    p.add_argument("--valid", type=int, default=500)
    p.add_argument("--test", type=int, default=500)
    p.add_argument("--symbols", type=int, default=20, help="distinct symbols (s0, s1, ...)")
    p.add_argument("--min_length", type=int, default=3)
    p.add_argument("--max_length", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    paths = write_task(args.out, args.task, train=args.train, valid=args.valid, test=args.test,
                       symbols=args.symbols, min_length=args.min_length, max_length=args.max_length, seed=args.seed)
    print(f"{args.task}: {args.train} training, {args.valid} validation, {args.test} test pairs in {args.out} "
          f"({', '.join(sorted(os.path.basename(p) for p in paths.values()))})")


if __name__ == "__main__":
    main()
