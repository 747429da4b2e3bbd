#!/usr/bin/env python
"""Where the time of one lmkit training step goes, in one process.

Two views of the real ``Trainer.train_step``:

1. the TensorFlow profiler (``tf.profiler.experimental``) traces a few steps;
   the op events of the executor threads are summed by op type and by op
   (the biggest ones named), in ms per step. Ops of the two inter-op threads
   overlap, so the sums can exceed the wall time;
2. pieces timed back to back (alternating, medians): the forward pass with
   the loss, forward + backward (``tape.gradient``), and the whole trainer step
   (+ clipping, learning-rate policy, optimizer, finite check). The
   differences are the cost of the backward pass and of the update.

Usage::

    .venv/bin/python benchmarks/profile_step.py --config config_small
    .venv/bin/python benchmarks/profile_step.py --config config_medium --steps 3

Writes ``benchmarks/results/profile_<config>.json``.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks._common import RESULTS_DIR, command_line, load_average, machine_info, write_json  # noqa: E402


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="config_small")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed piece and per trace")
    parser.add_argument("--repeats", type=int, default=5, help="rounds of the timed pieces")
    parser.add_argument("--threads", type=int, default=0, help="TF intra-op threads (default: lmkit's)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config override, e.g. --set jit_compile=True")
    parser.add_argument("--top", type=int, default=25, help="ops listed by name")
    parser.add_argument("--output", default="", help="default benchmarks/results/profile_<config>.json")
    return parser.parse_args(argv)


def trace_ops(step_fn, args_fn, steps: int) -> Dict[str, Any]:
    """Profiles ``steps`` calls; returns op time per step by type and by name."""
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    logdir = tempfile.mkdtemp(prefix="lmkit-profile-")
    try:
        tf.profiler.experimental.start(logdir)
        start = time.perf_counter()
        out = None
        for _ in range(steps):
            out = step_fn(*args_fn())
        [v.numpy() for v in tf.nest.flatten(out) if hasattr(v, "numpy")]
        wall = (time.perf_counter() - start) / steps
        tf.profiler.experimental.stop()
        path = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)[0]
        space = xplane_pb2.XSpace()
        with open(path, "rb") as f:
            space.ParseFromString(f.read())
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    plane = next(p for p in space.planes if p.name == "/host:CPU")
    by_type: Dict[str, float] = collections.Counter()
    calls: Dict[str, int] = collections.Counter()
    by_name: Dict[str, float] = collections.Counter()
    for line in plane.lines:
        if not line.name.startswith("tf_Compute"):  # the executor's inter-op threads
            continue
        for event in line.events:
            name = plane.event_metadata[event.metadata_id].name  # "scope/op:Type"
            op_type = name.rsplit(":", 1)[-1]
            if op_type in ("Process", "ExecutorDoneCallback"):  # whole-function spans, not ops
                continue
            ms = event.duration_ps / 1e9 / steps
            by_type[op_type] += ms
            calls[op_type] += 1
            by_name[name] += ms
    total = sum(by_type.values())
    return {
        "wall_ms_per_step": round(wall * 1000, 2),
        "op_ms_per_step": round(total, 2),
        "by_type": [{"op": k, "ms": round(v, 2), "share": round(v / total, 3), "calls": calls[k] // steps}
                    for k, v in sorted(by_type.items(), key=lambda kv: -kv[1])],
        "by_name": [{"op": k, "ms": round(v, 2)} for k, v in sorted(by_name.items(), key=lambda kv: -kv[1])],
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    from lmkit import distributed as dist
    from lmkit.config import load_config
    from lmkit.data.batching import bptt_arrays
    from lmkit.models import build_model
    from lmkit.train import Trainer
    from lmkit.losses import window_loss

    dist.init(backend="local", intra_op_threads=args.threads or None)
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key] = eval(value, {}, {})  # a Python literal: True, 0.5, "fp16"
    cfg = load_config(args.config, overrides)
    tf.random.set_seed(cfg.seed)
    model = build_model(cfg.model_config())
    trainer = Trainer(model, cfg, log=lambda s: None)
    ids = np.random.RandomState(0).randint(0, cfg.vocab_size, cfg.batch_size * cfg.num_steps * 40 + 1)
    ids = ids.astype(np.int32)
    trainer.fit(ids, max_steps=2, num_epochs=1)
    inputs, targets = bptt_arrays(ids, cfg.batch_size, cfg.num_steps)
    position = [0]
    state0 = trainer.initial_state()

    def batch():
        i = position[0] % len(inputs)
        position[0] += 1
        return tf.constant(inputs[i]), tf.constant(targets[i]), state0

    def loss_of(x, y, state):
        logits, _ = model(x, state, training=True)
        return window_loss(y, logits)

    variables = list(model.trainable_variables)

    def forward_backward(x, y, state):
        with tf.GradientTape() as tape:
            loss = loss_of(x, y, state)
        return loss, tape.gradient(loss, variables)

    pieces = {
        "forward + loss": tf.function(loss_of, jit_compile=cfg.jit_compile),
        "forward + backward": tf.function(forward_backward, jit_compile=cfg.jit_compile),
        "trainer step": trainer.train_step,
    }
    for fn in pieces.values():  # trace and warm up
        for _ in range(2):
            [v.numpy() for v in tf.nest.flatten(fn(*batch())) if hasattr(v, "numpy")]
    times: Dict[str, List[float]] = {k: [] for k in pieces}
    cpu: Dict[str, List[float]] = {k: [] for k in pieces}  # process CPU time: less sensitive to other jobs
    for _ in range(args.repeats):
        for name, fn in pieces.items():
            start, cpu_start = time.perf_counter(), time.process_time()
            out = None
            for _ in range(args.steps):
                out = fn(*batch())
            [v.numpy() for v in tf.nest.flatten(out) if hasattr(v, "numpy")]
            times[name].append((time.perf_counter() - start) / args.steps * 1000)
            cpu[name].append((time.process_time() - cpu_start) / args.steps * 1000)
    medians = {k: round(statistics.median(v), 2) for k, v in times.items()}
    cpu_medians = {k: round(statistics.median(v), 2) for k, v in cpu.items()}
    trace = trace_ops(trainer.train_step, batch, args.steps)
    result = {
        "benchmark": "profile_step",
        "command": command_line(),
        "machine": machine_info(tensorflow=tf.__version__),
        "threads": {"intra_op": dist.threads().intra_op, "inter_op": dist.threads().inter_op},
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "(TF default)"),
        "config": args.config,
        "overrides": overrides,
        "words_per_step": cfg.batch_size * cfg.num_steps,
        "pieces_ms_median": medians,
        "pieces_ms_all": {k: [round(x, 2) for x in v] for k, v in times.items()},
        "pieces_cpu_ms_median": cpu_medians,
        "derived_ms": {
            "backward": round(medians["forward + backward"] - medians["forward + loss"], 2),
            "update (clip, lr, optimizer, checks)": round(medians["trainer step"] - medians["forward + backward"], 2),
        },
        "derived_cpu_ms": {
            "backward": round(cpu_medians["forward + backward"] - cpu_medians["forward + loss"], 2),
            "update (clip, lr, optimizer, checks)": round(
                cpu_medians["trainer step"] - cpu_medians["forward + backward"], 2),
        },
        "trace": {**{k: v for k, v in trace.items() if k != "by_name"}, "by_name": trace["by_name"][:args.top]},
        "load_average_at_end": load_average(),
    }
    out_path = args.output or os.path.join(RESULTS_DIR, f"profile_{args.config}.json")
    write_json(out_path, result)
    print(f"{args.config}: pieces (median ms/step): {medians}; derived: {result['derived_ms']}")
    print(f"{args.config}: pieces (median CPU ms/step): {cpu_medians}; derived: {result['derived_cpu_ms']}")
    print(f"trace: wall {trace['wall_ms_per_step']} ms/step, op time {trace['op_ms_per_step']} ms/step")
    for row in trace["by_type"][:15]:
        print(f"  {row['op']:36s} {row['ms']:9.2f} ms  {100 * row['share']:5.1f}%  {row['calls']:5d} calls")
    print("biggest ops:")
    for row in trace["by_name"][:10]:
        print(f"  {row['op'][:80]:80s} {row['ms']:9.2f} ms")
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
