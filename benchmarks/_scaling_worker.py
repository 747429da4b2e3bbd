#!/usr/bin/env python
"""One rank of a scaling or memory measurement; launched by scaling.py / memory.py.

    mpirun -np 2 .venv/bin/python benchmarks/_scaling_worker.py --config config_small --output out.json

Trains the config's model with the real ``Trainer`` on synthetic ids:
``fit(max_steps=warmup)`` builds the compiled step (and does the start-up
broadcast), then ``repeats`` timed runs of ``steps`` steps call
``Trainer.train_step`` the way ``Trainer.fit`` does (this rank's rows of
each global batch, state carried, losses read back once per run). A run's
time is the slowest rank's; throughput = global words per step / step time.

Rank 0 writes the JSON: step times, words/sec, thread settings, the resident
memory of every rank (peak ``ru_maxrss`` and the RSS every few steps).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from typing import List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks._common import parse_overrides  # noqa: E402


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="config_small")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config override (a Python literal), e.g. --set batch_size=40")
    parser.add_argument("--warmup", type=int, default=3, help="steps run by fit() before timing")
    parser.add_argument("--steps", type=int, default=30, help="steps per timed run")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs")
    parser.add_argument("--rss_every", type=int, default=10, help="record the RSS every this many steps")
    parser.add_argument("--collective_calls", type=int, default=20,
                        help="timed calls of the step's collectives alone (0: skip)")
    parser.add_argument("--output", required=True)
    return parser.parse_args(argv)


def _rss_mib() -> float:
    try:
        import psutil
        return psutil.Process().memory_info().rss / 2 ** 20
    except ImportError:  # Linux fallback
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _time_collectives_alone(trainer, inputs, targets, calls: int) -> Tuple[List[float], float]:
    """Milliseconds per call of the training step's collectives with nothing else running,
    and the CPU time this process spent per call (all its threads: the transport's too).

    The gradients of one real batch (dense tensors and the embedding's
    ``IndexedSlices``) and the loss are averaged over the ranks the way the
    step averages them, ``calls`` times, each call waited for: the
    communication floor on this host, against which the 2-rank step's extra
    time can be read. Every rank runs the same calls in the same order.
    """
    import tensorflow as tf

    from lmkit import distributed as dist
    from lmkit.train.losses import window_loss

    if calls <= 0 or dist.local_replicas() != 1:
        return [], float("nan")
    variables = list(trainer.model.trainable_variables)
    state = dist.first(trainer.initial_state())  # one replica in this process: a plain state
    with tf.GradientTape() as tape:
        logits, _ = trainer.model(tf.constant(inputs), state, training=True)
        loss = window_loss(tf.constant(targets), logits)
    grads = tape.gradient(loss, variables)

    # IndexedSlices enter the replicas as their parts (a strategy takes plain tensors).
    parts = [(g.values, g.indices, g.dense_shape) if isinstance(g, tf.IndexedSlices) else g for g in grads]

    def replica_communicate(parts, loss):
        grads = [tf.IndexedSlices(*p) if isinstance(p, tuple) else p for p in parts]
        averaged = dist.average_gradients(grads, sparse_as_dense=trainer.config.distribution.sparse_as_dense,
                                          compression=trainer.config.distribution.compression)
        # Plain tensors out (a strategy returns no IndexedSlices from its replicas).
        return ([g.values if isinstance(g, tf.IndexedSlices) else g for g in averaged if g is not None],
                dist.allreduce(loss, op="average", name="lmkit.bench.loss"))

    @tf.function
    def communicate(parts, loss):  # in the backend's replica context, as the step does it
        return dist.first(dist.run(replica_communicate, (parts, loss)))

    for _ in range(3):  # trace, negotiate, fill Horovod's response cache
        communicate(parts, loss)[1].numpy()
    times: List[float] = []
    dist.barrier()
    cpu_start = time.process_time()
    for _ in range(calls):
        start = time.perf_counter()
        averaged, mean = communicate(parts, loss)
        for g in averaged:
            g.numpy()
        mean.numpy()
        times.append(1000 * (time.perf_counter() - start))
    return times, 1000 * (time.process_time() - cpu_start) / calls


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    rss_start = _rss_mib()
    import numpy as np
    import tensorflow as tf

    from lmkit import distributed as dist
    from lmkit.config import load_config
    from lmkit.data.batching import bptt_arrays
    from lmkit.models import build_model
    from lmkit.train import Trainer

    dist.init()
    rank, size = dist.rank(), dist.size()
    overrides = parse_overrides(args.set)
    cfg = load_config(args.config, overrides)
    rss_after_import = _rss_mib()
    tf.random.set_seed(cfg.run.seed)
    with dist.scope():  # the native backend's variables live in its strategy
        model = build_model(cfg.model_config())
    trainer = Trainer(model, cfg, log=lambda s: None)
    total_steps = args.warmup + args.steps * args.repeats
    ids = np.random.RandomState(0).randint(0, cfg.model["vocab_size"],
                                           cfg.data.batch_size * cfg.data.num_steps * (total_steps + 2) + 1)
    ids = ids.astype(np.int32)
    start = time.perf_counter()
    trainer.fit(ids, max_steps=args.warmup, num_epochs=1)  # builds the step, broadcasts, warms up
    setup_seconds = time.perf_counter() - start
    inputs, targets = bptt_arrays(ids, cfg.data.batch_size, cfg.data.num_steps, rank=rank, size=size)
    step = trainer.train_step
    state = trainer.initial_state()
    rss_trace: List[List[float]] = [[args.warmup, round(_rss_mib(), 1)]]
    run_seconds: List[float] = []
    windows_us: List[List[float]] = []  # wall-clock spans of the timed runs (to cut the Horovod timeline)
    losses: List[float] = []
    position = args.warmup
    for _ in range(args.repeats):
        dist.barrier()
        start = time.perf_counter()
        window_start = time.time() * 1e6
        pending = []
        for k in range(args.steps):
            i = position % len(inputs)
            position += 1
            out = step(tf.constant(inputs[i]), tf.constant(targets[i]), state)
            state = out.state
            pending.append(out.loss)
            if args.rss_every and position % args.rss_every == 0:
                rss_trace.append([position, round(_rss_mib(), 1)])
        losses.extend(float(v) for v in pending)  # the host sync fit() does every few steps
        mine = time.perf_counter() - start
        windows_us.append([window_start, time.time() * 1e6])
        run_seconds.append(max(dist.allgather_object(mine)))  # the slowest rank sets the pace
    rss_trace.append([position, round(_rss_mib(), 1)])
    collectives_ms, collectives_cpu_ms = _time_collectives_alone(trainer, inputs[0], targets[0],
                                                                 args.collective_calls)
    memory = {"peak_rss_mib": round(_peak_rss_mib(), 1), "rss_start_mib": round(rss_start, 1),
              "rss_after_import_mib": round(rss_after_import, 1), "rss_end_mib": round(_rss_mib(), 1),
              "rss_trace": rss_trace}
    everyone = dist.allgather_object({"rank": rank, "memory": memory, "threads": vars(dist.threads()),
                                      "affinity": sorted(os.sched_getaffinity(0))})
    if rank == 0:
        words = cfg.data.batch_size * cfg.data.num_steps  # global words per step
        step_seconds = [s / args.steps for s in run_seconds]
        result = {
            "config": args.config,
            "overrides": overrides,
            "world_size": size,
            "backend": dist.backend_name(),
            "global_batch": cfg.data.batch_size,
            "local_batch": trainer.local_batch,
            "num_steps": cfg.data.num_steps,
            "words_per_step": words,
            "steps_per_run": args.steps,
            "warmup_steps": args.warmup,
            "total_train_steps": position,
            "timed_windows_epoch_us": windows_us,
            "setup_seconds": round(setup_seconds, 2),
            "step_seconds": [round(s, 5) for s in step_seconds],
            "words_per_sec": [round(words / s, 1) for s in step_seconds],
            "mean_loss": round(sum(losses) / len(losses), 3),
            "collectives_alone_ms": [round(ms, 3) for ms in collectives_ms],
            "collectives_alone_cpu_ms_per_call": round(collectives_cpu_ms, 3),
            "ranks": everyone,
            "horovod_env": {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")},
        }
        tmp = args.output + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=2, sort_keys=True)
        os.replace(tmp, args.output)
    dist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
