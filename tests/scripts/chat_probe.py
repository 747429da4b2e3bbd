"""Trains a tiny Llama on examples with uneven loss weights (conversations' shape) and writes what each rank saw.

Run by tests/train/test_chat_training.py in one process, under ``mpirun -np 2`` and with the native
backend's replicas (``--backend native --num_replicas 2``). ``--runs`` lists the trainings of one start-up,
each ``<packed|padded>-k<grad_accum_steps>[-lora]``; each writes ``<out>.<run>.rank<r>.npz`` with the
per-step losses, the trainable variables at the start and at the end, each global batch's rows and window,
and this rank's weight of every step's rows against the global batch's (the shards' weights differ: the
loss's divisor must still be the global batch's). Packed rows come in both windows (16 and 32 positions):
the probe prices attention high, so that the cheapest packing (lmkit.data.packing.cheapest_packing) uses them.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

MODEL = dict(name="llama", vocab_size=40, hidden_size=16, num_layers=2, num_heads=4, num_kv_heads=2,
             max_positions=32, init_scale=0.1, dropout=0.0)


def probe_examples(count=48, seed=3):
    """``count`` examples of 3-12 ids (a quarter of them 13-24) whose weights cover from one target to all of
    them (uneven masks): packed, they fill rows of both windows of ``num_steps`` 32 (16 and 32 positions)."""
    import numpy as np

    from lmkit.data.chat import Example
    from lmkit.data.examples import ExampleSet
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        n = int(rng.integers(3, 13) if i % 4 else rng.integers(13, 25))
        weights = (rng.random(n) < [0.1, 0.5, 0.9][i % 3]).astype(np.uint8)
        weights[-1] = 1
        out.append(Example(rng.integers(1, 40, n).astype(np.int32), weights))
    return ExampleSet.of(out)


def train_once(run: str, out: str, steps: int) -> None:
    import numpy as np
    import tensorflow as tf

    from lmkit import distributed as dist
    from lmkit.config import TrainConfig
    from lmkit.layers.lora import add_lora, frozen
    from lmkit.models import build_model
    from lmkit.train import Trainer, tasks

    tasks.ATTENTION_COST = 1000.0  # packed rows in both windows: a batch of 16-position rows has twice the rows

    layout, accum, *lora = run.split("-")
    cfg = TrainConfig.from_dict(dict(
        model=MODEL, data=dict(kind="text", train_file="probe.jsonl", batch_size=8, num_steps=32,
                               packing=layout == "packed"),
        optimization=dict(optimizer="sgd", learning_rate=0.5, max_grad_norm=0.0, max_steps=steps,
                          grad_accum_steps=int(accum[1:]))))
    tf.random.set_seed(7)
    with dist.scope():
        if lora:
            with frozen():
                model = build_model(cfg.model_config())
            add_lora(model, rank=2, alpha=4.0, targets=("query", "value", "down"))
        else:
            model = build_model(cfg.model_config())
    examples = probe_examples()
    start = {f"start{i}": v.numpy() for i, v in enumerate(model.trainable_variables)}  # what training moved from
    trainer = Trainer(model, cfg, record_step_losses=True, log=lambda s: None)
    result = trainer.fit(examples, valid_ids=examples.subset(np.arange(12)))
    batches = trainer.task.batches(examples, 0)  # the first epoch's
    mine = [float(batches[i][1][1].sum()) for i in range(len(batches))]  # this rank's scaled weights
    rows = [len(group) for group in batches.rows.groups]  # each global batch's rows
    length = [batches[i][0][0].shape[1] for i in range(len(batches))]  # and its window
    arrays = {f"var{i}": v.numpy() for i, v in enumerate(model.trainable_variables)}
    np.savez(f"{out}.{run}.rank{dist.rank()}.npz", losses=np.array(result.step_losses),
             mine=np.array(mine), rows=np.array(rows), length=np.array(length),
             total=np.array(batches.weighted_tokens),
             valid=np.array(result.epochs[-1].valid_perplexity if result.epochs else np.nan), **arrays, **start)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--runs", default="packed-k1", help="comma-separated: <packed|padded>-k<k>[-lora]")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--backend", default=None)
    p.add_argument("--num_replicas", type=int, default=0, help="native backend: replicas in this process")
    args = p.parse_args()

    from lmkit import distributed as dist

    dist.init(backend=args.backend, num_gpus=args.num_replicas)
    for run in args.runs.split(","):
        train_once(run, args.out, args.steps)


if __name__ == "__main__":
    main()
