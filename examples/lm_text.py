#!/usr/bin/env python
"""Trains a small GPT on your own text, on 1 or N workers, composed from lmkit's modules.

    python examples/lm_text.py --train_file input.txt --valid_file valid.txt --tokenizer char
    mpirun -np 2 python examples/lm_text.py --train_file input.txt --config config_tiny_transformer

What ``lmkit train`` builds for ``model = "transformer"``: lmkit's tokenizer and
token cache (:func:`lmkit.train.run_data.load_run_data`), word and position
embeddings, a causal transformer decoder, the softmax, the loss, the optimizer
and its warmup and schedule, with each epoch's windows in a new order. Every
line that is there only because several workers train is marked ``# DIST``.
On the same config and seed it trains as ``lmkit train`` does, to rounding
(tests/examples/test_lm_text.py), and ``lmkit generate --model_dir`` reads what
it writes.
"""
import argparse
import itertools
import json
import math
import os

import tensorflow as tf

from lmkit import distributed as dist
from lmkit.cli.common import parse_overrides, run_main  # run_main: a crashed rank stops the job
from lmkit.config import load_config
from lmkit.core.errors import UsageError
from lmkit.data import BpttBatches, WindowBatches
from lmkit.layers import (
    OutputProjection,
    PositionEmbedder,
    TransformerDecoder,
    WordEmbedder,
    dropout,
    initialize_like_gpt2,
    uniform_initializer,
)
from lmkit.optim import LearningRatePolicy, build_optimizer, clip_gradients
from lmkit.train import dropout_generator
from lmkit.train.checkpoint import CheckpointManager
from lmkit.train.losses import window_loss
from lmkit.train.run_data import load_run_data

# The model section's keys this example builds as lmkit's transformer does, with that constructor's defaults
# (None: every config states it; nanoGPT's recipe, config_tiny_transformer, sets the last four).
ARGUMENTS = {"vocab_size": None, "hidden_size": None, "num_layers": 2, "num_heads": 4, "ffn_dim": 0,
             "max_positions": 512, "dropout": 0.0, "pre_layer_norm": True, "tie_weights": False, "init_scale": 0.1,
             "activation": "gelu", "use_bias": True, "output_bias": True, "initialization": "uniform"}


class TinyGPT(tf.Module):
    """Token + position embeddings -> causal transformer -> softmax (GPT-2's layout).

    The attributes are named as in :class:`lmkit.models.gpt2.model.TransformerLanguageModel`, so
    the two share checkpoints and ``lmkit generate`` rebuilds this model from ``config.json``.
    """

    def __init__(self, section) -> None:  # the config's model section (the constructor arguments)
        super().__init__(name="transformer_language_model")
        m = {key: section.get(key, default) for key, default in ARGUMENTS.items()}  # stated, or the default
        self.rate = m["dropout"]  # while training
        init, dim = uniform_initializer(m["init_scale"]), m["hidden_size"]
        with self.name_scope:
            self.embedder = WordEmbedder(vocab_size=m["vocab_size"], dim=dim, initializer=init, name="embedder")
            self.position_embedder = PositionEmbedder(max_positions=m["max_positions"], dim=dim,
                                                      init_scale=m["init_scale"], name="position_embedder")
            self.decoder = TransformerDecoder(num_layers=m["num_layers"], dim=dim, num_heads=m["num_heads"],
                                              ffn_dim=m["ffn_dim"], dropout=m["dropout"],
                                              pre_layer_norm=m["pre_layer_norm"], max_positions=m["max_positions"],
                                              init_scale=m["init_scale"], activation=m["activation"],
                                              use_bias=m["use_bias"], name="decoder")
            self.projection = OutputProjection(dim=dim, vocab_size=m["vocab_size"],
                                               tied_embedder=self.embedder if m["tie_weights"] else None,
                                               use_bias=m["output_bias"], initializer=init, name="projection")
        if m["initialization"] == "gpt2":  # normal draws, the residual projections smaller
            initialize_like_gpt2(self, self.decoder.layers, m["init_scale"])

    def __call__(self, ids, training=False):
        positions = tf.range(tf.shape(ids)[1])[tf.newaxis, :]  # [1, time]
        x = self.embedder(ids) + self.position_embedder(positions)  # [batch, time, dim]
        h, _ = self.decoder(dropout(x, self.rate, training), None, training)  # [batch, time, dim]
        return self.projection(h)  # [batch, time, vocab] float32 logits


def make_train_step(model, optimizer, policy, config):
    """One compiled optimizer step on this process's windows; the collectives run inside it."""
    variables = list(model.trainable_variables)

    def replica_step(x, y):
        with tf.GradientTape() as tape:  # summed over the window (or its mean: loss_reduction), mean over the rows
            loss = window_loss(y, model(x, training=True), config.optimization.loss_reduction)
        grads = tape.gradient(loss, variables)
        grads = dist.average_gradients(grads, config.distribution.sparse_as_dense,  # DIST: the global mean
                                       config.distribution.compression)
        loss = dist.allreduce(loss, op="average")  # DIST: the global batch's loss, the same on every rank
        grads, _ = clip_gradients(grads, config.optimization.max_grad_norm,  # after averaging: the same everywhere
                                  config.optimization.max_grad_norm_per_layer)
        optimizer.learning_rate.assign(policy(optimizer.iterations))  # warmup, then the schedule
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    def step(x, y):
        return dist.first(dist.run(replica_step, (x, y)))  # DIST: once per replica; the loss agrees on all

    return tf.function(step, autograph=False)  # lmkit's modules trace without AutoGraph (a faster start)


def make_evaluate(model, config):
    """``evaluate(ids)``: the mean loss per token of ``ids`` in order (one process, no collective)."""
    batch, num_steps = config.data.eval_batch_size or config.data.batch_size, config.data.num_steps
    forward = tf.function(lambda x, y: window_loss(y, model(x)), autograph=False)

    def evaluate(ids) -> float:
        batches = BpttBatches(ids, batch, num_steps)  # the whole stream, in order: evaluation is not sharded
        return sum(float(forward(tf.constant(x), tf.constant(y))) for x, y in batches) / (len(batches) * num_steps)

    return evaluate


def train(config, data, model_dir: str) -> dict:
    """Trains for the config's plan (epochs or steps); returns rank 0's perplexities (as results.json)."""
    rank, size = dist.rank(), dist.size()  # DIST: this process, of how many
    seed, num_steps = config.run.seed, config.data.num_steps
    tf.random.set_seed(seed)  # the initial values; rank 0's reach every rank below anyway
    with dist.scope():  # DIST: the native backend keeps one copy per replica (Horovod: nothing)
        model, optimizer = TinyGPT(config.model), build_optimizer(config)
        # Dropout draws from the global generator: seeded per rank, as lmkit train does (other rows, other masks).
        tf.random.set_global_generator(dropout_generator(seed, rank))  # DIST

    def windows(epoch):  # DIST: this rank's rows of every global batch, in the epoch's order (the same on all)
        return WindowBatches(data.train, config.data.batch_size, num_steps, epoch=epoch, seed=seed,
                             rank=rank, size=size, sampling=config.data.sampling)

    steps = len(windows(0))
    policy = LearningRatePolicy.from_config(config, world_size=dist.num_replicas(),  # DIST: lr scaling, warmup
                                            steps_per_epoch=steps)
    optimizer.build(model.trainable_variables)
    dist.broadcast_variables([*model.variables, *optimizer.variables])  # DIST: every rank starts from rank 0's
    train_step, evaluate = make_train_step(model, optimizer, policy, config), make_evaluate(model, config)
    checkpoints = CheckpointManager(os.path.join(model_dir, "checkpoints"),
                                    tf.train.Checkpoint(model=model, optimizer=optimizer))
    results = {"world_size": size, "epochs": []}
    per_token = 1 if config.optimization.loss_reduction == "mean" else num_steps  # a step's loss over this
    planned = config.planned_steps  # a plan in steps (max_steps, max_tokens) ends inside an epoch; None: epochs
    epochs = config.epochs_to_run(steps)
    for epoch in range(epochs):
        count = steps if planned is None else min(steps, planned - epoch * steps)
        total = sum(float(train_step(tf.constant(x), tf.constant(y))) for x, y in itertools.islice(windows(epoch),
                                                                                                  count))
        lr = float(optimizer.learning_rate.numpy())
        if rank == 0:  # DIST: rank 0 alone evaluates, logs and saves; no collective on this path
            stats = {"epoch": epoch + 1, "learning_rate": lr,
                     "train_perplexity": math.exp(total / (count * per_token)),
                     "valid_perplexity": None if data.valid is None else math.exp(evaluate(data.valid))}
            results["epochs"].append(stats)
            valid = "-" if stats["valid_perplexity"] is None else f"{stats['valid_perplexity']:.2f}"
            print(f"Epoch {epoch + 1}/{epochs}: lr {lr:.4g} | train ppl {stats['train_perplexity']:.2f} "
                  f"| valid ppl {valid} ({size} worker(s))", flush=True)
            checkpoints.save(int(optimizer.iterations.numpy()), {"epoch": epoch + 1})
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train_file", required=True, help="UTF-8 text, one sentence or paragraph a line")
    p.add_argument("--valid_file", default=None, help="evaluated by rank 0 after every epoch")
    p.add_argument("--config", default="config_tiny_transformer", help="a config of configs/ or a .py file")
    p.add_argument("--tokenizer", default=None, help="word, sentencepiece, char or byte (default: the config's)")
    p.add_argument("--model_dir", default="runs/lm_text", help="tokenizer, checkpoints and results")
    p.add_argument("--num_epochs", type=int, default=None, help="override the config's num_epochs")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    args = p.parse_args(argv)
    overrides = parse_overrides(args.set)  # --set batch_size=40 --set optimizer=adam
    overrides.update(data="text", train_file=args.train_file, valid_file=args.valid_file or "",
                     **({"tokenizer": args.tokenizer} if args.tokenizer else {}))
    if args.num_epochs:  # the flag's plan replaces the config's (in epochs, steps or tokens)
        overrides.update(num_epochs=args.num_epochs, max_steps=0, max_tokens=0)
    config = load_config(args.config, overrides)
    unknown = sorted(set(config.model.arguments) - set(ARGUMENTS))
    if config.model.name != "transformer" or unknown:
        raise UsageError(f"this example trains lmkit's plain transformer (with {', '.join(ARGUMENTS)}); "
                         f"{args.config} has model {config.model.name!r}"
                         + (f" with {', '.join(unknown)}" if unknown else "") + " (lmkit train takes any)")

    # DIST: Horovod under mpirun (one rank a process), else one process (or the native backend's replicas)
    dist.init(backend=config.distribution.backend, num_gpus=config.distribution.num_gpus)  # DIST
    # DIST: rank 0 trains the tokenizer into model_dir and encodes the text into the token cache while the
    # others wait; then every rank maps the same ids. The config's vocab_size becomes the tokenizer's.
    data = load_run_data(config, args.model_dir)
    config = data.config
    if dist.rank() == 0:  # DIST: what lmkit generate reads back (the tokenizer is there already)
        with open(os.path.join(args.model_dir, "config.json"), "w") as f:
            f.write(config.to_json())
    results = train(config, data, args.model_dir)
    if dist.rank() == 0:  # DIST
        with open(os.path.join(args.model_dir, "results.json"), "w") as f:
            json.dump(results, f, indent=2)
    dist.barrier()  # DIST: every rank leaves after rank 0's evaluation
    return 0


if __name__ == "__main__":
    run_main(main)
