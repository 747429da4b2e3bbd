"""``lmkit evaluate``: perplexity of a trained model on a text, per token and per word.

    lmkit evaluate --model_dir runs/wt2 --text_file ../shared/data/wikitext-2/test.txt
    lmkit evaluate --model_dir runs/config_small --split test --data_path data/ptb

The text is encoded with the run's own tokenizer (or PTB vocabulary) and read
in order, ``--batch_size`` rows of ``num_steps`` tokens at a time (a
recurrent state carries across windows). Perplexity per word divides the
total negative log-likelihood by the whitespace-separated words of the same
text (plus one per line, whose end is predicted too), so models with
different tokenizers compare. Runs in one process.

Output: one line on stdout (or a JSON object with --json). Exit status: 0
done, 2 bad input (one ``error:`` line on stderr), 1 a crash.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Optional, Sequence

from lmkit.cli.common import check_model_dir, model_dir_parser, user_modules_importable
from lmkit.errors import UsageError
from lmkit.layout import CONFIG_FILE, resolve_checkpoint

__all__ = ["build_parser", "main"]


def build_parser(prog: str = "lmkit evaluate") -> argparse.ArgumentParser:
    """The flags of ``lmkit evaluate``."""
    p = model_dir_parser(prog, __doc__)
    what = p.add_mutually_exclusive_group()
    what.add_argument("--text_file", default=None, help="any UTF-8 text, one sentence or paragraph a line")
    what.add_argument("--split", choices=["valid", "test", "train"], default=None,
                      help="a split of the run's own data (default: test when --text_file is not given)")
    p.add_argument("--data_path", default="data/ptb", help="PTB runs: the folder with ptb.*.txt")
    p.add_argument("--batch_size", type=int, default=None,
                   help="rows read side by side; default: the run's eval_batch_size or batch_size")
    p.add_argument("--json", action="store_true", help="print a JSON object instead of a line")
    p.add_argument("--verbose", action="store_true",
                   help="keep TensorFlow's start-up log lines (also LMKIT_VERBOSE=1)")
    return p


def _text_path(args: argparse.Namespace, config) -> str:
    """The file to evaluate: --text_file, or the run's split."""
    if args.text_file is not None:
        return args.text_file
    split = args.split or "test"
    if config.data == "text":
        path = getattr(config, f"{split}_file")
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
    check_model_dir(args.model_dir)
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError(f"--batch_size {args.batch_size} must be >= 1")
    from lmkit.config import TrainConfig
    from lmkit.data.text import load_text_data
    from lmkit.data.tokenizers import tokenizer_of_run
    from lmkit.train.checkpoint import read_config_dict

    config = TrainConfig.from_dict(read_config_dict(args.model_dir),
                                   source=f"{args.model_dir}/{CONFIG_FILE}")
    checkpoint = resolve_checkpoint(args.model_dir, args.checkpoint)
    path = _text_path(args, config)
    text = load_text_data(tokenizer_of_run(args.model_dir), path)  # checks the file: no TF yet
    user_modules_importable()

    from lmkit import distributed as dist
    from lmkit.train.checkpoint import load_model
    from lmkit.train.evaluation import Evaluator, word_perplexity
    from lmkit.train.metrics import perplexity

    dist.init(backend="local")
    model, tokenizer, config = load_model(args.model_dir, checkpoint)
    batch = args.batch_size or config.eval_batch_size or config.batch_size
    loss = Evaluator(model, config.num_steps, batch).mean_loss(text.train)
    tokens, words = len(text.train), text.train_words
    report = {"model_dir": args.model_dir, "text": path, "tokenizer": tokenizer.name,
              "tokens": tokens, "words": words, "loss_per_token": loss,
              "perplexity": perplexity(loss), "word_perplexity": word_perplexity(loss, tokens, words)}
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(f"{path}: perplexity {report['perplexity']:.2f} per token ({tokens} tokens), "
              f"{report['word_perplexity']:.2f} per word ({words} words)", flush=True)
    return 0
