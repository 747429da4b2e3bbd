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

It keeps lmkit train's promises with the same public parts:

* rerun the same command and it continues from the newest checkpoint of
  ``--model_dir``, inside an epoch too (``Checkpointer.restore_latest``);
* SIGTERM (SIGINT, SIGUSR1) on any rank stops every rank after the same
  step; it saves there and exits with status 75 ("rerun to continue");
* rank 0 prints a line every ``--log_every_steps`` steps and writes
  TensorBoard summaries to ``<model_dir>/tensorboard``.
"""
import argparse
import inspect
import json
import math
import os
import time

import tensorflow as tf

from lmkit import distributed as dist
from lmkit.cli.common import parse_overrides, run_main  # run_main: a crashed rank stops the job
from lmkit.config import load_config
from lmkit.core.errors import UsageError
from lmkit.core.preemption import PreemptionWatcher
from lmkit.data import BpttBatches
from lmkit.layers import OutputProjection, RNNDecoder, WordEmbedder, uniform_initializer
from lmkit.optim import LearningRatePolicy, build_optimizer, clip_gradients
from lmkit.train import Progress
from lmkit.train.feed import host_flags
from lmkit.train.losses import window_loss
from lmkit.train.metrics import ProgressBar, Summaries
from lmkit.train.resume import Boundaries, Checkpointer, preempted
from lmkit.train.run_data import load_ptb_everywhere


class LSTMLanguageModel(tf.Module):
    """Embedder -> multi-layer LSTM -> softmax; every variable from uniform(-init_scale, init_scale).

    The arguments and attributes are those of :class:`lmkit.models.rnn.model.RNNLanguageModel`, so the
    two share checkpoints and ``lmkit generate`` rebuilds this model from ``config.json``.
    """

    def __init__(self, *, vocab_size: int, hidden_size: int, num_layers: int = 2, cell: str = "lstm",
                 embedding_dim: int = 0, dropout: float = 0.0, forget_bias: float = 0.0, init_scale: float = 0.1,
                 tie_weights: bool = False) -> None:
        super().__init__(name="rnn_language_model")
        init, dim = uniform_initializer(init_scale), embedding_dim or hidden_size
        with self.name_scope:
            self.embedder = WordEmbedder(vocab_size=vocab_size, dim=dim, initializer=init, dropout=dropout,
                                         name="embedder")
            self.decoder = RNNDecoder(input_size=dim, hidden_size=hidden_size, num_layers=num_layers, cell=cell,
                                      dropout=dropout, forget_bias=forget_bias, init_scale=init_scale,
                                      name="decoder")
            self.projection = OutputProjection(dim=hidden_size, vocab_size=vocab_size,
                                               tied_embedder=self.embedder if tie_weights else None,
                                               initializer=init, bias_initializer=init, name="projection")

    def __call__(self, ids, state, training=False):
        x = self.embedder(ids, training)  # [batch, time, dim]
        h, state = self.decoder(x, state, training)  # [batch, time, hidden]
        return self.projection(h), state  # [batch, time, vocab] float32 logits


def make_train_step(model, optimizer, policy, progress, config):
    """One compiled optimizer step on this process's rows; the collectives run inside it."""
    variables = list(model.trainable_variables)

    def replica_step(x, y, state, stop, save, end):
        with tf.GradientTape() as tape:
            logits, state = model(x, state, training=True)  # [rows, num_steps, vocab]
            loss = window_loss(y, logits)  # summed over the window, averaged over this replica's rows
        grads = tape.gradient(loss, variables)
        grads = dist.average_gradients(grads, config.distribution.sparse_as_dense,  # DIST: the global mean
                                       config.distribution.compression)
        # DIST: one all-reduce gives every rank the global batch's loss and the ranks' requests
        # [stop, save, end]: a SIGTERM on any rank reaches all of them at the same step.
        averaged = dist.allreduce(tf.stack([loss, stop, save, end]), op="average")
        grads, _ = clip_gradients(grads, config.optimization.max_grad_norm,  # after averaging: the same everywhere
                                  config.optimization.max_grad_norm_per_layer)
        optimizer.learning_rate.assign(policy(progress.global_step))
        optimizer.apply_gradients(zip(grads, variables))
        progress.global_step.assign_add(1)
        return averaged[0], state, averaged[1:]

    def step(x, y, state, stop, save, end):
        loss, state, agreed = dist.run(replica_step, (x, y, state, stop, save, end))  # DIST: once per replica
        return dist.first(loss), state, dist.first(agreed)  # DIST: the averages agree on every replica

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


class Run:
    """One training run on this rank: the model, the optimizer, where training stands (``progress``), the
    compiled step, this rank's batches, the checkpoints and rank 0's summaries."""

    def __init__(self, config, data, model_dir: str, log_every: int) -> None:
        self.config, self.data, self.log_every = config, data, log_every
        self.rank, self.size = dist.rank(), dist.size()  # DIST: this process, of how many
        seed, batch_size, num_steps = config.run.seed, config.data.batch_size, config.data.num_steps
        tf.random.set_seed(seed)  # the initial values; rank 0's reach every rank below anyway
        with dist.scope():  # DIST: the native backend keeps one copy per replica (Horovod: nothing)
            self.model = LSTMLanguageModel(cell=config.model.name, **config.model.arguments)
            self.optimizer = build_optimizer(config)
            # What a checkpoint holds beside the weights: the epoch, the step, the steps done in the epoch and
            # the dropout generator, seeded per rank as lmkit train does (other rows, other masks).  # DIST
            self.progress = Progress(seed, self.rank)
        tf.random.set_global_generator(self.progress.rng)  # dropout draws from it
        self.batches = BpttBatches(data.train, batch_size, num_steps, rank=self.rank, size=self.size)  # DIST
        policy = LearningRatePolicy.from_config(config, world_size=dist.num_replicas(),  # DIST: lr scaling, warmup
                                                steps_per_epoch=len(self.batches))
        self.optimizer.build(self.model.trainable_variables)
        self.step = make_train_step(self.model, self.optimizer, policy, self.progress, config)
        self.evaluate = make_evaluate(self.model, config)
        self.rows = batch_size // dist.num_replicas()  # DIST: each replica's share of the global batch
        self.checkpoints = Checkpointer.for_run(model_dir, self.model, self.optimizer, self.progress,
                                                keep=config.checkpoints.keep_checkpoints)
        self.summaries = Summaries(os.path.join(model_dir, "tensorboard") if self.rank == 0 else None)  # DIST

    def zero_state(self):
        return dist.per_replica(lambda: self.model.decoder.initial_state(self.rows))  # DIST: one per replica

    def resume(self):
        """Every rank continues from the newest checkpoint, if any: its values, its position, its rows' state."""
        # DIST: rank 0 reads the checkpoint and every rank receives what it needs (none: rank 0's values).
        resumed, position = self.checkpoints.restore_latest(
            [*self.model.variables, *self.optimizer.variables], self.zero_state(), self.config.run.seed)
        if resumed and self.rank == 0:  # DIST
            print(f"resumed from {resumed} at step {int(self.progress.global_step.numpy())} (epoch "
                  f"{int(self.progress.epoch.numpy()) + 1}, {position.steps_in_epoch} steps into it)", flush=True)
        return position

    def train_epoch(self, epoch: int, epochs: int, position, boundaries, watcher) -> dict:
        """The epoch's steps from ``position``; a stop agreed inside it saves there and leaves (exit status 75)."""
        batches, num_steps, rows = self.batches, self.config.data.num_steps, self.config.data.batch_size
        planned = self.config.planned_steps  # a plan in steps (max_steps, max_tokens) may end inside an epoch
        count = len(batches) if planned is None else min(len(batches), planned - epoch * len(batches))
        start, state = position.steps_in_epoch, position.state if position.steps_in_epoch else self.zero_state()
        bar = ProgressBar(count, f"epoch {epoch + 1}/{epochs}", enabled=self.rank == 0, every=self.log_every)
        begin, total, done, actions = time.perf_counter(), 0.0, 0, []
        for i in range(start, count):  # the rows go on from batch to batch, and so does the state
            x, y = batches[i]
            # This rank's requests ride in the step's all-reduce ...
            loss, state, agreed = self.step(tf.constant(x), tf.constant(y), state, *host_flags(*boundaries.flags()))
            total, done = total + float(loss), done + 1
            bar.update(i + 1, f"ppl {math.exp(total / (done * num_steps)):.2f} "
                       f"{done * rows * num_steps / (time.perf_counter() - begin):.0f} tokens/s")
            # ... and every rank decides on the agreed ones, at the same step.  # DIST
            actions = boundaries.after_step(agreed, int(self.progress.global_step.numpy()))
            if actions and i + 1 < count:  # a save or a stop inside the epoch (its end saves anyway)
                self.progress.steps_in_epoch.assign(i + 1)
                stop = "stop" in actions
                # DIST: every rank takes part (rank 0 gathers the carried state of every row)
                path = self.checkpoints.save(state, {"stopped_by": "preemption"} if stop else {"saved_by": "schedule"})
                if stop:  # DIST: every rank waits for rank 0's save, then all leave with exit status 75
                    raise preempted(watcher, self.progress, path)
        bar.close()
        stop = "stop" in actions + boundaries.flush()  # the last step's flags: no step follows
        return {"total": total, "steps": done, "seconds": time.perf_counter() - begin, "stop": stop}

    def end_epoch(self, epoch: int, epochs: int, trained: dict, watcher):
        """Every rank saves the epoch's end; rank 0 evaluates, logs and writes summaries (returns its stats)."""
        lr, num_steps = float(self.optimizer.learning_rate.numpy()), self.config.data.num_steps
        train_ppl = math.exp(trained["total"] / (max(trained["steps"], 1) * num_steps))
        self.progress.epoch.assign(epoch + 1)
        self.progress.steps_in_epoch.assign(0)
        stop = {"stopped_by": "preemption"} if trained["stop"] else {}
        path = self.checkpoints.save(None, {"train_perplexity": train_ppl, **stop})  # DIST: every rank takes part
        if trained["stop"]:
            raise preempted(watcher, self.progress, path)  # DIST
        if self.rank != 0:  # DIST: rank 0 alone evaluates, logs and writes summaries; no collective on its path
            return None
        stats = {"epoch": epoch + 1, "learning_rate": lr, "train_perplexity": train_ppl,
                 "valid_perplexity": math.exp(self.evaluate(self.data.valid)),
                 "tokens_per_sec": trained["steps"] * self.config.data.batch_size * num_steps / trained["seconds"]}
        print(f"Epoch {epoch + 1}/{epochs}: lr {lr:.4g} | train ppl {stats['train_perplexity']:.2f} "
              f"| valid ppl {stats['valid_perplexity']:.2f} | {stats['tokens_per_sec']:.0f} tokens/sec "
              f"({self.size} worker(s)) | epoch time {trained['seconds']:.1f} s", flush=True)
        self.summaries.write(int(self.progress.global_step.numpy()), {
            "train/perplexity": train_ppl, "train/learning_rate": lr, "train/tokens_per_sec": stats["tokens_per_sec"],
            "valid/perplexity": stats["valid_perplexity"]})
        return stats


def train(config, data, model_dir: str, log_every: int) -> dict:
    """Trains for the config's plan (epochs or steps), from where the last run stopped; returns rank 0's
    perplexities (as results.json)."""
    run = Run(config, data, model_dir, log_every)
    position = run.resume()
    results = {"world_size": run.size, "epochs": []}
    epochs = config.epochs_to_run(len(run.batches))
    # A signal becomes this rank's flag (exit status 75 once every rank has stopped); Boundaries decides when to
    # save or stop from the flags the steps agreed on.
    with PreemptionWatcher(run.rank, config.checkpoints.preemption_grace_seconds) as watcher:
        boundaries = Boundaries(watcher, config.checkpoints.checkpoint_every_steps,
                                config.checkpoints.checkpoint_every_minutes)
        for epoch in range(int(run.progress.epoch.numpy()), epochs):
            trained = run.train_epoch(epoch, epochs, position, boundaries, watcher)
            position.steps_in_epoch = 0  # only the first epoch resumes inside
            stats = run.end_epoch(epoch, epochs, trained, watcher)
            if stats is not None:
                results["epochs"].append(stats)
    if run.rank == 0:  # DIST
        results["test_perplexity"] = math.exp(run.evaluate(data.test))
        print(f"Test perplexity: {results['test_perplexity']:.2f}", flush=True)
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="config_small", help="a config of configs/ or a .py file")
    p.add_argument("--data_path", default="data/ptb", help="PTB's folder; downloaded there when missing")
    p.add_argument("--data_url", default=None, help="a mirror of simple-examples.tgz")
    p.add_argument("--model_dir", default="runs/ptb_example", help="config, vocabulary, checkpoints, results")
    p.add_argument("--num_epochs", type=int, default=None, help="override the config's num_epochs")
    p.add_argument("--log_every_steps", type=int, default=None,
                   help="a progress line every this many steps (default: the config's; 0: about ten an epoch)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    args = p.parse_args(argv)
    overrides = parse_overrides(args.set)  # --set batch_size=40 --set optimizer=adam
    if args.num_epochs:  # the flag's plan replaces the config's (in epochs, steps or tokens)
        overrides.update(num_epochs=args.num_epochs, max_steps=0, max_tokens=0)
    config = load_config(args.config, overrides)
    if config.model.name not in ("lstm", "gru") or config.data.kind != "ptb":
        raise UsageError(f"this example trains an RNN on PTB; {args.config} has model {config.model.name!r} "
                         f"and data {config.data.kind!r} (try examples/lm_text.py, or lmkit train)")
    unknown = sorted(set(config.model.arguments) - set(inspect.signature(LSTMLanguageModel).parameters))
    if unknown:
        raise UsageError(f"this example's LSTM takes no {', '.join(unknown)} (in {args.config}'s model section); "
                         "leave them out, or train with lmkit train")
    log_every = config.run.log_every_steps if args.log_every_steps is None else args.log_every_steps

    # DIST: Horovod under mpirun (one rank a process), else one process (or the native backend's replicas)
    dist.init(backend=config.distribution.backend, num_gpus=config.distribution.num_gpus)  # DIST
    # DIST: rank 0 downloads PTB when it is missing while the others wait; then every rank reads it.
    data = load_ptb_everywhere(args.data_path, args.data_url, expected_vocab_size=config.model.get("vocab_size"))
    if dist.rank() == 0:  # DIST: what lmkit generate and lmkit evaluate read back
        os.makedirs(args.model_dir, exist_ok=True)
        with open(os.path.join(args.model_dir, "config.json"), "w") as f:
            f.write(config.to_json())
        data.vocab.save(os.path.join(args.model_dir, "vocab.txt"))
    results = train(config, data, args.model_dir, log_every)
    if dist.rank() == 0:  # DIST
        with open(os.path.join(args.model_dir, "results.json"), "w") as f:
            json.dump(results, f, indent=2)
    dist.barrier()  # DIST: every rank leaves after rank 0's evaluation
    return 0


if __name__ == "__main__":
    run_main(main)
