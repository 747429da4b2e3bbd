#!/usr/bin/env python
"""Trains the PTB language model of Zaremba et al. (2014) on N workers, composed from lmkit's modules.

    mpirun -np 2 python examples/lm_ptb_distributed.py --config config_small   # Horovod, 2 ranks
    python examples/lm_ptb_distributed.py --config config_small                # one process

The script builds what ``lmkit train`` builds for ``model = "lstm"``: the PTB
reader, the word embedder, the LSTM decoder, the softmax, the loss, the
optimizer and its schedule. Every line that is there only because several
workers train is marked ``# DIST``: take them out and it trains alone. On the
same config and seed it trains as ``lmkit train`` does, to rounding
(tests/examples/test_lm_ptb_distributed.py), and ``lmkit generate --model_dir``
reads what it writes.
"""
import argparse
import itertools
import json
import math
import os
import time

import tensorflow as tf

from lmkit import distributed as dist
from lmkit.cli.common import parse_overrides, run_main  # run_main: a crashed rank stops the job
from lmkit.config import load_config
from lmkit.core.errors import UsageError
from lmkit.data import BpttBatches
from lmkit.layers import OutputProjection, RNNDecoder, WordEmbedder, uniform_initializer
from lmkit.optim import LearningRatePolicy, build_optimizer, clip_gradients
from lmkit.train import dropout_generator
from lmkit.train.checkpoint import CheckpointManager
from lmkit.train.losses import window_loss
from lmkit.train.run_data import load_ptb_everywhere


class LSTMLanguageModel(tf.Module):
    """Embedder -> multi-layer LSTM -> softmax; every variable from uniform(-init_scale, init_scale).

    The attributes are named as in :class:`lmkit.models.rnn.model.RNNLanguageModel`, so the two
    share checkpoints and ``lmkit generate`` rebuilds this model from ``config.json``.
    """

    def __init__(self, m) -> None:  # m: the config's model section (the constructor arguments)
        super().__init__(name="rnn_language_model")
        init, dim = uniform_initializer(m["init_scale"]), m["embedding_dim"] or m["hidden_size"]
        with self.name_scope:
            self.embedder = WordEmbedder(vocab_size=m["vocab_size"], dim=dim, initializer=init, dropout=m["dropout"],
                                         name="embedder")
            self.decoder = RNNDecoder(input_size=dim, hidden_size=m["hidden_size"], num_layers=m["num_layers"],
                                      cell=m.name, dropout=m["dropout"], forget_bias=m["forget_bias"],
                                      init_scale=m["init_scale"], name="decoder")
            self.projection = OutputProjection(dim=m["hidden_size"], vocab_size=m["vocab_size"],
                                               tied_embedder=self.embedder if m["tie_weights"] else None,
                                               initializer=init, bias_initializer=init, name="projection")

    def __call__(self, ids, state, training=False):
        x = self.embedder(ids, training)  # [batch, time, dim]
        h, state = self.decoder(x, state, training)  # [batch, time, hidden]
        return self.projection(h), state  # [batch, time, vocab] float32 logits


def make_train_step(model, optimizer, policy, config):
    """One compiled optimizer step on this process's rows; the collectives run inside it."""
    variables = list(model.trainable_variables)

    def replica_step(x, y, state):
        with tf.GradientTape() as tape:
            logits, state = model(x, state, training=True)  # [rows, num_steps, vocab]
            loss = window_loss(y, logits)  # summed over the window, averaged over this replica's rows
        grads = tape.gradient(loss, variables)
        grads = dist.average_gradients(grads, config.distribution.sparse_as_dense,  # DIST: the global mean
                                       config.distribution.compression)
        loss = dist.allreduce(loss, op="average")  # DIST: the global batch's loss, the same on every rank
        grads, _ = clip_gradients(grads, config.optimization.max_grad_norm,  # after averaging: the same everywhere
                                  config.optimization.max_grad_norm_per_layer)
        optimizer.learning_rate.assign(policy(optimizer.iterations))
        optimizer.apply_gradients(zip(grads, variables))
        return loss, state

    def step(x, y, state):
        loss, state = dist.run(replica_step, (x, y, state))  # DIST: once per replica of this process
        return dist.first(loss), state  # DIST: the averaged loss agrees on every replica

    # lmkit's modules write their loops as graph ops: no AutoGraph needed (a faster start).
    return tf.function(step, autograph=False)


def make_evaluate(model, config):
    """``evaluate(ids)``: the mean loss per token of ``ids``, read in order (one process, no collective)."""
    batch, num_steps = config.data.eval_batch_size or config.data.batch_size, config.data.num_steps

    def forward(x, y, state):
        logits, state = model(x, state)  # [batch, num_steps, vocab]
        return window_loss(y, logits), state

    forward = tf.function(forward, autograph=False)

    def evaluate(ids) -> float:
        batches, state, total = BpttBatches(ids, batch, num_steps), model.decoder.initial_state(batch), 0.0
        for x, y in batches:  # the whole stream: evaluation is not sharded
            loss, state = forward(tf.constant(x), tf.constant(y), state)
            total += float(loss)
        return total / (len(batches) * num_steps)

    return evaluate


def train(config, data, model_dir: str) -> dict:
    """Trains for the config's plan (epochs or steps); returns rank 0's perplexities (as results.json)."""
    rank, size = dist.rank(), dist.size()  # DIST: this process, of how many
    seed, batch_size, num_steps = config.run.seed, config.data.batch_size, config.data.num_steps
    tf.random.set_seed(seed)  # the initial values; rank 0's reach every rank below anyway
    with dist.scope():  # DIST: the native backend keeps one copy per replica (Horovod: nothing)
        model, optimizer = LSTMLanguageModel(config.model), build_optimizer(config)
        # Dropout draws from the global generator: seeded per rank, as lmkit train does (other rows, other masks).
        tf.random.set_global_generator(dropout_generator(seed, rank))  # DIST
    batches = BpttBatches(data.train, batch_size, num_steps, rank=rank, size=size)  # DIST: this rank's rows
    policy = LearningRatePolicy.from_config(config, world_size=dist.num_replicas(),  # DIST: lr scaling, warmup
                                            steps_per_epoch=len(batches))
    optimizer.build(model.trainable_variables)
    dist.broadcast_variables([*model.variables, *optimizer.variables])  # DIST: every rank starts from rank 0's values
    train_step, evaluate = make_train_step(model, optimizer, policy, config), make_evaluate(model, config)
    checkpoints = CheckpointManager(os.path.join(model_dir, "checkpoints"),
                                    tf.train.Checkpoint(model=model, optimizer=optimizer))
    rows = batch_size // dist.num_replicas()  # DIST: each replica's share of the global batch
    results = {"world_size": size, "epochs": []}
    planned = config.planned_steps  # a plan in steps (max_steps, max_tokens) ends inside an epoch; None: epochs
    epochs = config.epochs_to_run(len(batches))
    for epoch in range(epochs):
        count = len(batches) if planned is None else min(len(batches), planned - epoch * len(batches))
        state = dist.per_replica(lambda: model.decoder.initial_state(rows))  # DIST: a zero state per replica
        start, total = time.perf_counter(), 0.0
        for x, y in itertools.islice(batches, count):  # the rows go on from batch to batch, and so does the state
            loss, state = train_step(tf.constant(x), tf.constant(y), state)
            total += float(loss)
        seconds, lr = time.perf_counter() - start, float(optimizer.learning_rate.numpy())
        if rank == 0:  # DIST: rank 0 alone evaluates, logs and saves; no collective on this path
            stats = {"epoch": epoch + 1, "learning_rate": lr,
                     "train_perplexity": math.exp(total / (count * num_steps)),
                     "valid_perplexity": math.exp(evaluate(data.valid)),
                     "tokens_per_sec": count * batch_size * num_steps / seconds}
            results["epochs"].append(stats)
            print(f"Epoch {epoch + 1}/{epochs}: lr {lr:.4g} | train ppl {stats['train_perplexity']:.2f} "
                  f"| valid ppl {stats['valid_perplexity']:.2f} | {stats['tokens_per_sec']:.0f} tokens/sec "
                  f"({size} worker(s)) | epoch time {seconds:.1f} s", flush=True)
            checkpoints.save(int(optimizer.iterations.numpy()), {"epoch": epoch + 1})
    if rank == 0:  # DIST
        results["test_perplexity"] = math.exp(evaluate(data.test))
        print(f"Test perplexity: {results['test_perplexity']:.2f}", flush=True)
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="config_small", help="a config of configs/ or a .py file")
    p.add_argument("--data_path", default="data/ptb", help="PTB's folder; downloaded there when missing")
    p.add_argument("--data_url", default=None, help="a mirror of simple-examples.tgz")
    p.add_argument("--model_dir", default="runs/ptb_example", help="config, vocabulary, checkpoints, results")
    p.add_argument("--num_epochs", type=int, default=None, help="override the config's num_epochs")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    args = p.parse_args(argv)
    overrides = parse_overrides(args.set)  # --set batch_size=40 --set optimizer=adam
    if args.num_epochs:  # the flag's plan replaces the config's (in epochs, steps or tokens)
        overrides.update(num_epochs=args.num_epochs, max_steps=0, max_tokens=0)
    config = load_config(args.config, overrides)
    if config.model.name not in ("lstm", "gru") or config.data.kind != "ptb":
        raise UsageError(f"this example trains an RNN on PTB; {args.config} has model {config.model.name!r} "
                         f"and data {config.data.kind!r} (try examples/lm_text.py, or lmkit train)")

    # DIST: Horovod under mpirun (one rank a process), else one process (or the native backend's replicas)
    dist.init(backend=config.distribution.backend, num_gpus=config.distribution.num_gpus)  # DIST
    # DIST: rank 0 downloads PTB when it is missing while the others wait; then every rank reads it.
    data = load_ptb_everywhere(args.data_path, args.data_url, expected_vocab_size=config.model["vocab_size"])
    if dist.rank() == 0:  # DIST: what lmkit generate and lmkit evaluate read back
        os.makedirs(args.model_dir, exist_ok=True)
        with open(os.path.join(args.model_dir, "config.json"), "w") as f:
            f.write(config.to_json())
        data.vocab.save(os.path.join(args.model_dir, "vocab.txt"))
    results = train(config, data, args.model_dir)
    if dist.rank() == 0:  # DIST
        with open(os.path.join(args.model_dir, "results.json"), "w") as f:
            json.dump(results, f, indent=2)
    dist.barrier()  # DIST: every rank leaves after rank 0's evaluation
    return 0


if __name__ == "__main__":
    run_main(main)
