#!/usr/bin/env python
"""Trains with lmkit's Trainer and two callbacks of your own: one prints the loss, one stops the run early.

    python examples/early_stopping.py --train_file input.txt --valid_file valid.txt --tokenizer char
    mpirun -np 2 python examples/early_stopping.py --train_file input.txt --valid_file valid.txt \
        --set run.eval_every_steps=100

A callback (:mod:`lmkit.train.callbacks`) watches a run without subclassing
the trainer, as Keras' callbacks and Hugging Face's ``TrainerCallback`` do.
``LossPrinter`` prints every loss the trainer reads back (every
``run.log_every_steps`` steps). ``EarlyStopping`` ends the run once the
validation loss has not improved by ``--min_delta`` for ``--patience``
evaluations in a row (every ``run.eval_every_steps`` steps, or at each
epoch's end). Rank 0 alone evaluates, so rank 0 alone asks to stop; the
request rides in the training step's all-reduce, and every rank ends at the
same step, with a checkpoint there.
"""
import argparse
import math

import tensorflow as tf

from lmkit import distributed as dist
from lmkit.cli.common import parse_overrides, run_main  # run_main: a crashed rank stops the job
from lmkit.config import load_config
from lmkit.models.build import build_run_model
from lmkit.train import Callback, Trainer
from lmkit.train.run_data import load_run_data


class LossPrinter(Callback):
    """Prints the loss per token of every step whose loss the trainer read back (rank 0)."""

    def on_step_end(self, info, control):
        if info.rank == 0 and info.loss is not None:  # DIST: every rank calls it; one prints
            print(f"step {info.step}: loss {info.loss:.4f}", flush=True)


class EarlyStopping(Callback):
    """Ends the run when the validation loss has not improved by ``min_delta`` for ``patience`` evaluations."""

    def __init__(self, patience: int, min_delta: float = 0.0) -> None:
        self.patience, self.min_delta = patience, min_delta
        self.best, self.worse = math.inf, 0

    def on_eval_end(self, info, control):  # rank 0: it alone evaluates
        if info.loss < self.best - self.min_delta:
            self.best, self.worse = info.loss, 0
            return
        self.worse += 1
        if self.worse >= self.patience:
            print(f"no improvement of the validation loss for {self.worse} evaluation(s): stopping "
                  f"(best {self.best:.4f}, now {info.loss:.4f} after step {info.step})", flush=True)
            control.should_stop = True  # every rank ends at the same step, with a checkpoint


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train_file", required=True, help="UTF-8 text, one sentence or paragraph a line")
    p.add_argument("--valid_file", required=True, help="evaluated by rank 0; its loss decides the stop")
    p.add_argument("--config", default="config_tiny_transformer", help="a config of configs/ or a .py file")
    p.add_argument("--tokenizer", default=None, help="word, sentencepiece, char or byte (default: the config's)")
    p.add_argument("--model_dir", default="runs/early_stopping", help="tokenizer, checkpoints and results")
    p.add_argument("--patience", type=int, default=3, help="evaluations without improvement before the stop")
    p.add_argument("--min_delta", type=float, default=0.0, help="the least fall of the loss that counts")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    args = p.parse_args(argv)
    overrides = parse_overrides(args.set)  # --set run.eval_every_steps=100
    overrides.update(data="text", train_file=args.train_file, valid_file=args.valid_file,
                     **({"tokenizer": args.tokenizer} if args.tokenizer else {}))
    config = load_config(args.config, overrides)

    dist.init(backend=config.distribution.backend, num_gpus=config.distribution.num_gpus)  # DIST
    # DIST: rank 0 trains the tokenizer and encodes the text while the others wait; then every rank reads it.
    data = load_run_data(config, args.model_dir)
    config = data.config  # the tokenizer's vocab_size
    tf.random.set_seed(config.run.seed)
    with dist.scope():  # DIST: the native backend keeps one copy per replica
        model = build_run_model(config)
    callbacks = [LossPrinter(), EarlyStopping(args.patience, args.min_delta)]
    trainer = Trainer(model, config, model_dir=args.model_dir, vocab=data.vocab, callbacks=callbacks)
    trainer.fit(data.train, data.valid, data.test, words=data.words)
    return 0


if __name__ == "__main__":
    run_main(main)
