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

On a GPU the trace also holds the GPU's kernels (TensorFlow needs CUPTI,
``libcupti.so.12``, on the library path for them): their time per step by
kind (matmuls, reductions such as the softmaxes, scatters and gathers,
copies, other fusions), the biggest kernels, and how much of the wall time
the GPU was busy at all (the union of the kernels' intervals): a busy share
well under 1 means the GPU waits for the host (launches, the step's loop),
not for its kernels. The idle gaps between kernels, by length, tell which:
many short ones are launches, about one long one per step is a wait. ``--trace_only`` skips the timed pieces, which each
compile once more (minutes for a GPT-2-sized step).

Usage::

    .venv/bin/python benchmarks/profile_step.py --config config_small
    .venv/bin/python benchmarks/profile_step.py --config config_medium --steps 3
    python benchmarks/profile_step.py --config config_gpt2_124m_shape --set precision='"mixed_bfloat16"' \
        --trace_only --steps 5 --output benchmarks/results/profile_gpt2_bf16_gpu.json   # on a GPU

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
from benchmarks._common import (  # noqa: E402
    RESULTS_DIR,
    command_line,
    idle_gaps,
    intervals_union,
    load_average,
    machine_info,
    parse_overrides,
    write_json,
)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="config_small")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed piece and per trace")
    parser.add_argument("--repeats", type=int, default=5, help="rounds of the timed pieces")
    parser.add_argument("--threads", type=int, default=0, help="TF intra-op threads (default: lmkit's)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config override, e.g. --set jit_compile=True")
    parser.add_argument("--top", type=int, default=25, help="ops (and GPU kernels) listed by name")
    parser.add_argument("--trace_only", action="store_true",
                        help="only the profiler's trace of the trainer step, not the timed pieces")
    parser.add_argument("--device_inputs", action="store_true",
                        help="trace the step a second time with its batches already on the device (a GPU's): "
                             "the first trace's inputs come from host memory, as in training")
    parser.add_argument("--output", default="", help="default benchmarks/results/profile_<config>.json")
    return parser.parse_args(argv)


def trace_ops(step_fn, args_fn, steps: int) -> Dict[str, Any]:
    """Profiles ``steps`` calls; returns op time per step by type and by name, and the GPU's kernels."""
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
    return {**host_ops(space, steps, wall), "gpu": gpu_kernels(space, steps, wall)}


def host_ops(space: Any, steps: int, wall: float) -> Dict[str, Any]:
    """The TensorFlow ops of the executor threads in ``space`` (an XSpace), per step."""
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


KERNEL_KINDS = (  # (kind, substrings of a kernel's lower-cased name); the first match wins
    # cuBLAS names its Hopper kernels nvjet_* (XLA calls cuBLAS for most of its matmuls)
    ("matmul", ("gemm", "cutlass", "xmma", "cublas", "matmul", "dot", "nvjet", "gemv")),
    ("scatter/gather", ("scatter", "gather", "dynamic_update_slice", "dynamic_slice")),
    ("reduction (softmax, norms, sums)", ("reduce", "softmax")),
    ("copy/transpose", ("copy", "transpose", "memcpy", "memset", "concatenate")),
)


def kernel_kind(name: str) -> str:
    """Which kind of GPU kernel ``name`` is (XLA names a fusion's kernel after what it computes)."""
    lower = name.lower()
    for kind, keys in KERNEL_KINDS:
        if any(key in lower for key in keys):
            return kind
    return "other (elementwise fusions)"


IDLE_BUCKETS_US = (10, 100, 1000)  # upper bounds of the idle-gap classes; the last class is open


def idle_summary(gaps_ps: Sequence[float], steps: int, top: int = 5) -> Dict[str, Any]:
    """Where the GPU idles between its first and last kernel, per step.

    Many short gaps mean the host launches kernels more slowly than the GPU runs
    them; about one long gap per step means the host waits for the GPU once a
    step (a copy or a read back) and then spends that long starting the next.
    """
    us = [g / 1e6 for g in gaps_ps]
    bounds = (0,) + IDLE_BUCKETS_US + (float("inf"),)
    buckets = []
    for low, high in zip(bounds[:-1], bounds[1:]):
        inside = [g for g in us if low <= g < high]
        label = f">= {low} us" if high == float("inf") else f"{low}-{high} us"
        buckets.append({"gaps": label, "per_step": round(len(inside) / steps, 1),
                        "ms_per_step": round(sum(inside) / 1000 / steps, 3)})
    return {"ms_per_step": round(sum(us) / 1000 / steps, 3), "by_length": buckets,
            "longest_us": [round(g, 1) for g in sorted(us, reverse=True)[:top]]}


def gpu_kernels(space: Any, steps: int, wall: float, top: int = 25) -> Optional[Dict[str, Any]]:
    """The GPU kernels of ``space`` per step, or None when it holds no GPU plane.

    Kernel events are read from the stream lines of every ``/device:GPU:N``
    plane; ``busy_share`` is the union of their intervals over the wall time
    (``wall`` seconds per step).
    """
    planes = [p for p in space.planes if p.name.startswith("/device:GPU:")]
    if not planes:
        return None
    by_kind: Dict[str, float] = collections.Counter()
    by_name: Dict[str, float] = collections.Counter()
    calls: Dict[str, int] = collections.Counter()
    intervals = []
    for plane in planes:
        streams = [line for line in plane.lines if "stream" in line.name.lower()] or list(plane.lines)
        for line in streams:
            for event in line.events:
                meta = plane.event_metadata[event.metadata_id]
                name = meta.display_name or meta.name
                ms = event.duration_ps / 1e9 / steps
                by_kind[kernel_kind(name)] += ms
                by_name[name] += ms
                calls[name] += 1
                start = line.timestamp_ns * 1000 + event.offset_ps
                intervals.append((start, start + event.duration_ps))
    kernel_ms = sum(by_kind.values())
    busy_ms = intervals_union(intervals) / 1e9 / steps
    return {
        "kernel_ms_per_step": round(kernel_ms, 3),
        "busy_ms_per_step": round(busy_ms, 3),
        "busy_share": round(busy_ms / (wall * 1000), 3) if wall > 0 else None,
        "kernels_per_step": round(sum(calls.values()) / steps, 1),
        "idle": idle_summary(idle_gaps(intervals), steps),
        "by_kind": [{"kind": k, "ms": round(v, 3), "share": round(v / kernel_ms, 3) if kernel_ms else 0.0}
                    for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])],
        "by_name": [{"kernel": k, "ms": round(v, 3), "calls": round(calls[k] / steps, 1), "kind": kernel_kind(k)}
                    for k, v in sorted(by_name.items(), key=lambda kv: -kv[1])[:top]],
    }


def time_pieces(pieces: Dict[str, Any], batch: Any, steps: int, repeats: int) -> Dict[str, Any]:
    """Median wall and CPU ms per step of each piece, timed alternately, and their differences."""
    import tensorflow as tf
    for fn in pieces.values():  # trace and warm up
        for _ in range(2):
            [v.numpy() for v in tf.nest.flatten(fn(*batch())) if hasattr(v, "numpy")]
    times: Dict[str, List[float]] = {k: [] for k in pieces}
    cpu: Dict[str, List[float]] = {k: [] for k in pieces}  # process CPU time: less sensitive to other jobs
    for _ in range(repeats):
        for name, fn in pieces.items():
            start, cpu_start = time.perf_counter(), time.process_time()
            out = None
            for _ in range(steps):
                out = fn(*batch())
            [v.numpy() for v in tf.nest.flatten(out) if hasattr(v, "numpy")]
            times[name].append((time.perf_counter() - start) / steps * 1000)
            cpu[name].append((time.process_time() - cpu_start) / steps * 1000)
    medians = {k: round(statistics.median(v), 2) for k, v in times.items()}
    cpu_medians = {k: round(statistics.median(v), 2) for k, v in cpu.items()}
    return {
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
    from lmkit.train.losses import window_loss

    dist.init(backend="local", intra_op_threads=args.threads or None)
    overrides = parse_overrides(args.set)
    cfg = load_config(args.config, overrides)
    tf.random.set_seed(cfg.run.seed)
    model = build_model(cfg.model_config())
    trainer = Trainer(model, cfg, log=lambda s: None)
    ids = np.random.RandomState(0).randint(0, cfg.model["vocab_size"],
                                           cfg.data.batch_size * cfg.data.num_steps * 40 + 1)
    ids = ids.astype(np.int32)
    trainer.fit(ids, max_steps=2, num_epochs=1)
    inputs, targets = bptt_arrays(ids, cfg.data.batch_size, cfg.data.num_steps)
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

    result = {
        "benchmark": "profile_step",
        "command": command_line(),
        "machine": machine_info(tensorflow=tf.__version__),
        "threads": {"intra_op": dist.threads().intra_op, "inter_op": dist.threads().inter_op},
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "(TF default)"),
        "config": args.config,
        "overrides": overrides,
        "xla": trainer.xla,
        "words_per_step": cfg.data.batch_size * cfg.data.num_steps,
    }
    if not args.trace_only:
        pieces = {  # compiled as the trainer compiles its step
            "forward + loss": tf.function(loss_of, jit_compile=trainer.xla),
            "forward + backward": tf.function(forward_backward, jit_compile=trainer.xla),
            "trainer step": trainer.train_step,
        }
        result.update(time_pieces(pieces, batch, args.steps, args.repeats))
        print(f"{args.config}: pieces (median ms/step): {result['pieces_ms_median']}; "
              f"derived: {result['derived_ms']}")
        print(f"{args.config}: pieces (median CPU ms/step): {result['pieces_cpu_ms_median']}; "
              f"derived: {result['derived_cpu_ms']}")
    trace = trace_ops(trainer.train_step, batch, args.steps)
    result["trace"] = {**{k: v for k, v in trace.items() if k != "by_name"}, "by_name": trace["by_name"][:args.top]}
    if args.device_inputs:
        # Does copying each step's inputs from host memory make the host wait (a copy to a GPU waits
        # for the work queued before it)? The same compiled step with every input placed on the device
        # beforehand (the first device: a GPU where there is one): the batches and the stop and save
        # flags that Trainer.train_step sends with each step.
        from lmkit.train.feed import feed_device, flag_tensors
        device = feed_device()
        with tf.device(device):
            placed = [tuple(tf.identity(t) for t in batch()[:2]) for _ in range(args.steps)]
        flags = flag_tensors(device)(0.0, 0.0)  # (stop, save, end)
        cursor = iter(placed)
        device_trace = trace_ops(trainer.step.function, lambda: (*next(cursor), state0, *flags), args.steps)
        result["trace_device_inputs"] = {"device": device,
                                         **{k: v for k, v in device_trace.items() if k != "by_name"}}
    result["load_average_at_end"] = load_average()
    out_path = args.output or os.path.join(RESULTS_DIR, f"profile_{args.config}.json")
    write_json(out_path, result)
    print(f"trace: wall {trace['wall_ms_per_step']} ms/step, op time {trace['op_ms_per_step']} ms/step")
    for row in trace["by_type"][:15]:
        print(f"  {row['op']:36s} {row['ms']:9.2f} ms  {100 * row['share']:5.1f}%  {row['calls']:5d} calls")
    print("biggest ops:")
    for row in trace["by_name"][:10]:
        print(f"  {row['op'][:80]:80s} {row['ms']:9.2f} ms")
    gpu = trace["gpu"]
    if gpu:
        print(f"GPU: kernels {gpu['kernel_ms_per_step']} ms/step, busy {gpu['busy_ms_per_step']} ms/step "
              f"({100 * (gpu['busy_share'] or 0):.0f}% of the wall time), {gpu['kernels_per_step']} kernels/step")
        idle = gpu["idle"]
        print(f"  idle between kernels {idle['ms_per_step']} ms/step; longest gaps (us) {idle['longest_us']}")
        for row in idle["by_length"]:
            print(f"    gaps {row['gaps']:>12s}: {row['per_step']:7.1f} per step, {row['ms_per_step']:7.3f} ms/step")
        for row in gpu["by_kind"]:
            print(f"  {row['kind']:36s} {row['ms']:9.3f} ms  {100 * row['share']:5.1f}%")
        print("biggest kernels:")
        for row in gpu["by_name"][:15]:
            print(f"  {row['kernel'][:80]:80s} {row['ms']:9.3f} ms  {row['calls']:6.1f} calls")
        if args.device_inputs and result["trace_device_inputs"]["gpu"]:
            other = result["trace_device_inputs"]
            print(f"with the batches on {other['device']} beforehand: wall {other['wall_ms_per_step']} ms/step, "
                  f"GPU busy {100 * (other['gpu']['busy_share'] or 0):.0f}%, "
                  f"idle between kernels {other['gpu']['idle']['ms_per_step']} ms/step")
    elif tf.config.list_physical_devices("GPU"):
        print("GPU: no kernels in the trace (is libcupti.so.12 on LD_LIBRARY_PATH?)")
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
