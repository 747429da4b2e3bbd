#!/usr/bin/env python
"""Causal attention, forward and backward, XLA-compiled: what mixed precision keeps between the two.

One call is ``tape.gradient`` of ``sum(attend(q, k, v) * w)`` with respect to
queries, keys and values, causal mask, under ``tf.function(jit_compile=True)``,
for each variant:

* ``float32_probs``: lmkit's attention before this benchmark (the scores cast
  to float32, ``tf.where`` mask, ``tf.nn.softmax``, the probabilities cast to
  the compute dtype), differentiated by TensorFlow, whose softmax gradient
  keeps the float32 probabilities: an extra [batch, heads, time, time] array
  written in the forward pass and read twice in the backward pass;
* ``lmkit``: :func:`lmkit.layers.attention.attend` as it is, whose
  :func:`~lmkit.layers.attention.masked_softmax` computes in float32 and
  keeps the probabilities in the compute dtype only (for float32 inputs the
  two variants are the same program);
* ``causal_blocks``: :func:`lmkit.layers.attention.causal_attend` with
  ``--blocks`` query blocks (a model's ``attention_blocks``, off by default),
  block i attending to the keys of blocks 0..i only, so the matmuls and
  softmax skip about half of the masked upper triangle (with 2 blocks a
  quarter of the work, with 4 three eighths) at the cost of more, smaller
  kernels;
* ``cudnn``: cuDNN's fused (flash) attention through XLA
  (:mod:`lmkit.layers.kernels.cudnn`, ``attention_kernel = "cudnn"``):
  no score array at all. A GPU with cuDNN 9 only; not in the default list.

The variants alternate, one timed run each per round (``--steps`` calls,
dispatched back to back, then one result read back), so load from other
jobs hits all alike. Reported: median ms per call, the ratio to
``float32_probs`` per round, and the model FLOP rate (12 x batch x heads x
time^2 x head_dim per call, the whole square as nanoGPT counts it). The
largest difference of each variant's gradients from ``float32_probs`` is
recorded as a check (zero in float32; bfloat16 rounding otherwise).

Usage::

    .venv/bin/python benchmarks/attention.py                   # CPU, 2 x 12 x 512 x 64, bfloat16
    python benchmarks/attention.py --shape 8,12,1024,64 --steps 50 \\
        --output benchmarks/results/attention_gpu.json         # a GPU: GPT-2 124M's attention

Writes ``benchmarks/results/attention.json`` by default.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks._common import (  # noqa: E402
    RESULTS_DIR,
    command_line,
    machine_info,
    package_version,
    ratio_spread,
    summarize,
    write_json,
)

VARIANTS = ("float32_probs", "lmkit", "causal_blocks", "cudnn")
DEFAULT_VARIANTS = ("float32_probs", "lmkit", "causal_blocks")  # cudnn needs a GPU
DTYPES = ("bfloat16", "float16", "float32")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="2,12,512,64", help="batch,heads,time,head_dim (default %(default)s)")
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="compute dtype (default %(default)s)")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help=f"comma-separated subset of {VARIANTS} (default %(default)s)")
    parser.add_argument("--blocks", type=int, default=2, help="query blocks of causal_blocks (default 2)")
    parser.add_argument("--no_xla", action="store_true",
                        help="TensorFlow's kernels (tf.function without jit_compile, as lmkit trains on CPUs)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--steps", type=int, default=5, help="calls per timed run (default 5)")
    parser.add_argument("--output", default=os.path.join(RESULTS_DIR, "attention.json"))
    args = parser.parse_args(argv)
    args.shape = parse_shape(args.shape)
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    if args.blocks < 1 or args.shape[2] % args.blocks:
        parser.error(f"--blocks {args.blocks}: must be at least 1 and divide the time {args.shape[2]}")
    return args


def parse_shape(text: str) -> List[int]:
    """``"b,h,t,d"`` -> four positive ints; ValueError naming the value otherwise."""
    try:
        shape = [int(x) for x in text.split(",")]
    except ValueError:
        shape = []
    if len(shape) != 4 or min(shape) < 1:
        raise ValueError(f"--shape {text!r}: want four positive ints batch,heads,time,head_dim, e.g. 8,12,1024,64")
    return shape


def attention_flops(shape: Sequence[int]) -> int:
    """Forward (2 matmuls of 2 x b x h x t^2 x d) and backward (twice that) of the whole square."""
    batch, heads, time_, head_dim = shape
    return 12 * batch * heads * time_ * time_ * head_dim


def causal_mask(queries: int, keys: int):
    """[1, 1, queries, keys] bool: query i sees keys 0..i (lmkit's own mask)."""
    import tensorflow as tf

    from lmkit.layers.attention import causal_mask as lmkit_causal_mask
    return lmkit_causal_mask(tf.range(queries), tf.range(keys))


def float32_probs_softmax(scores: Any, mask: Any) -> Any:
    """Attention's softmax before ``masked_softmax``: float32 out, so TensorFlow's gradient keeps it."""
    import tensorflow as tf
    scores = tf.cast(scores, tf.float32)
    if mask is not None:
        scores = tf.where(mask, scores, -1.0e9)
    return tf.nn.softmax(scores, axis=-1)


def float32_probs_attend(queries, keys, values, mask):
    """lmkit's attention before masked_softmax: TensorFlow differentiates the float32 softmax."""
    import tensorflow as tf
    probs = tf.cast(float32_probs_softmax(tf.matmul(queries, keys, transpose_b=True), mask), values.dtype)
    return tf.matmul(probs, values)


def lmkit_attend(queries, keys, values, mask):
    from lmkit.layers.attention import attend
    return attend(queries, keys, values, mask, 0.0, False)


def causal_blocks_attend(blocks: int) -> Callable[..., Any]:
    """lmkit's attention in ``blocks`` query blocks (``attention_blocks``): the masked key blocks are never computed."""
    def run(queries, keys, values, mask):
        from lmkit.layers.attention import causal_attend
        del mask  # each block builds its own
        return causal_attend(queries, keys, values, blocks, 0.0, False)
    return run


def cudnn_attend(queries, keys, values, mask):
    """cuDNN's fused causal attention (lmkit.layers.kernels.cudnn): its own mask."""
    from lmkit.layers.kernels.cudnn import KERNEL
    del mask
    return KERNEL(queries, keys, values)


def build(variant: str, blocks: int, xla: bool = True) -> Callable[..., Any]:
    """The compiled forward + backward of one variant: (q, k, v, w) -> (dq, dk, dv)."""
    import tensorflow as tf
    attend_fn = {"float32_probs": float32_probs_attend, "lmkit": lmkit_attend,
                 "causal_blocks": causal_blocks_attend(blocks), "cudnn": cudnn_attend}[variant]

    @tf.function(jit_compile=xla)
    def step(queries, keys, values, weights):
        with tf.GradientTape() as tape:
            tape.watch([queries, keys, values])
            mask = causal_mask(queries.shape[2], keys.shape[2])
            out = attend_fn(queries, keys, values, mask)
            loss = tf.reduce_sum(tf.cast(out, tf.float32) * weights)
        return tape.gradient(loss, [queries, keys, values])
    return step


def measure(args: argparse.Namespace) -> Dict[str, Any]:
    import tensorflow as tf
    dtype = tf.as_dtype(args.dtype)
    rng = tf.random.Generator.from_seed(1)
    batch, heads, time_, head_dim = args.shape
    q, k, v = (tf.cast(rng.normal(args.shape), dtype) for _ in range(3))
    q = q * (1.0 / head_dim ** 0.5)
    w = rng.normal(args.shape)
    steps = {name: build(name, args.blocks, not args.no_xla) for name in args.variants}
    compile_seconds, grads = {}, {}
    for name, step in steps.items():
        start = time.perf_counter()
        grads[name] = [g.numpy().astype("float64") for g in step(q, k, v, w)]
        compile_seconds[name] = round(time.perf_counter() - start, 2)
        print(f"{name}: compiled and ran once in {compile_seconds[name]} s", flush=True)
    times: Dict[str, List[float]] = {name: [] for name in steps}
    for round_ in range(args.repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                out = step(q, k, v, w)
            out[0][0, 0, 0, 0].numpy()  # waits for the device
            times[name].append(1000 * (time.perf_counter() - start) / args.steps)
        print(f"round {round_ + 1}: " + ", ".join(f"{n} {t[-1]:.2f} ms" for n, t in times.items()), flush=True)
    flops = attention_flops(args.shape)
    variants: Dict[str, Any] = {}
    for name in steps:
        median = statistics.median(times[name])
        variants[name] = {
            "ms_per_call": [round(t, 3) for t in times[name]],
            "summary_ms": {key: round(val, 3) for key, val in summarize(times[name]).items()},
            "model_tflops": round(flops / (median / 1000) / 1e12, 3),
            "compile_and_first_call_seconds": compile_seconds[name],
        }
        if "float32_probs" in grads:
            variants[name]["max_abs_grad_difference_from_float32_probs"] = float(max(
                abs(a - b).max() for a, b in zip(grads[name], grads["float32_probs"])))
    ratios = {f"{name}/float32_probs": ratio_spread(times["float32_probs"], times[name])
              for name in steps if name != "float32_probs" and "float32_probs" in steps}
    return {"variants": variants, "speedup_over_float32_probs": ratios, "flops_per_call": flops}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    import tensorflow as tf
    device = "gpu" if tf.config.list_physical_devices("GPU") else "cpu"
    print(f"attention forward + backward on {device}: shape {args.shape}, {args.dtype}, "
          f"{'TensorFlow kernels' if args.no_xla else 'XLA'}", flush=True)
    result = measure(args)
    payload = {"command": command_line(), "device": device, "shape": args.shape, "dtype": args.dtype,
               "blocks": args.blocks, "xla": not args.no_xla, "steps_per_run": args.steps,
               "machine": machine_info(tensorflow=package_version("tensorflow")), **result}
    for name, entry in result["variants"].items():
        ratio = result["speedup_over_float32_probs"].get(f"{name}/float32_probs")
        print(f"{name}: {entry['summary_ms']['median']:.2f} ms per call, {entry['model_tflops']:.2f} TFLOP/s"
              + (f", {ratio['median_of_rounds']:.3f}x float32_probs" if ratio else ""))
    print(write_json(args.output, payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
