#!/usr/bin/env python
"""Where a batch-1 cached decode of the GPT-2-shaped model spends its milliseconds (issue 58).

The model is ``benchmarks/gpt2.py``'s (4 layers, width 256, 4 heads, vocabulary 8,192, 5.3 M
parameters), with random weights; the prompt has 16 tokens and 64 are generated, as there. XLA compiles
the whole decode loop into one program, so the TensorFlow profiler sees one op; instead the loop is
taken apart, each part in a compiled ``tf.while_loop`` of the same length (ms per step, medians):

- ``decode``: ``lmkit.decoding.decode`` as ``lmkit generate`` runs it (greedy), per new token;
- ``decode, prompt a token a step``: the same with the prompt fed one token a step through
  ``model.step`` (no prefill: lmkit before issue 58);
- ``decode, one new token (per call)``: about a call's cost besides its steps (the prefill, dispatch; no
  layouts for so short a loop), in ms per call; ``..., the copies made``: the same with the layouts' copies;
- ``decode, no layouts``: without :mod:`lmkit.layers.layouts` (the loop before its weight layouts), on
  a copy of the model (a trace of its own) with the same weights;
- ``model.step``: the model's cached step alone, its argmax fed back;
- ``decoder.step``: the transformer blocks alone (no embedding, no output projection);
- ``output projection``: the 256 x 8,192 matrix-vector product alone;
- ``empty loop``: the loop's own cost per iteration.

Variants alternate within each round, so the machine's load moves them alike. Then a table of XLA's CPU
matmul by weight layout (``--matmul_rows``): GB/s of ``x [rows, k] @ W`` with ``W`` stored [k, m] or
transposed, the evidence for :mod:`lmkit.layers.layouts`.

Usage::

    .venv/bin/python benchmarks/decode_profile.py --threads 2
    .venv/bin/python benchmarks/decode_profile.py --threads 1 --output benchmarks/results/decode_profile_1thread.json

Writes ``benchmarks/results/decode_profile.json`` (by default).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks._common import RESULTS_DIR, command_line, load_average, machine_info, write_json  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--new_tokens", type=int, default=64)
    p.add_argument("--matmul_rows", default="1,8",
                   help="rows of the matmul-layout table (comma-separated; empty: no table)")
    p.add_argument("--output", default=os.path.join(RESULTS_DIR, "decode_profile.json"))
    return p.parse_args(argv)


def matmul_layouts(rows_list: List[int], rounds: int) -> List[Dict[str, Any]]:
    """GB/s of XLA's CPU ``x [rows, k] @ W``, ``W`` stored [k, m] or as ``W^T`` [m, k] (``transpose_b``), for
    the shapes of the model's feed-forward kernels and projection: a chain of 32 MB of them (past the cache)
    in a compiled ``tf.while_loop`` of 20 steps; medians of ``rounds`` alternating rounds."""
    import numpy as np
    import tensorflow as tf

    rng, steps = np.random.RandomState(0), 20

    def chain(k: int, m: int, stored: str, rows: int) -> Callable[[], Any]:
        weights = [rng.randn(k, m).astype(np.float32) * 0.05 for _ in range(max(1, int(32e6 / (k * m * 4))))]
        kept = [tf.constant(w if stored == "[k, m]" else np.ascontiguousarray(w.T)) for w in weights]

        @tf.function(jit_compile=True, autograph=False)
        def run(x):
            def body(t, h):
                for w in kept:
                    y = tf.matmul(h[:, :k] if k <= 256 else tf.tile(h, [1, k // 256]), w,
                                  transpose_b=stored != "[k, m]")
                    h = tf.tanh(y[:, :256])
                return t + 1, h
            return tf.while_loop(lambda t, h: t < steps, body, (0, x))[1]
        x = tf.ones([rows, 256])
        run(x)
        return lambda: run(x).numpy()

    cases = [(rows, k, m, stored) for rows in rows_list for k, m in ((256, 1024), (1024, 256), (256, 8192))
             for stored in ("[k, m]", "[m, k]")]
    runs = {case: chain(case[1], case[2], case[3], case[0]) for case in cases}
    times: Dict[Any, List[float]] = {case: [] for case in cases}
    for _ in range(rounds):
        for case, run in runs.items():
            start = time.perf_counter()
            run()
            times[case].append((time.perf_counter() - start) / steps)
    table = []
    for (rows, k, m, stored), ts in times.items():
        megabytes = max(1, int(32e6 / (k * m * 4))) * k * m * 4 / 1e6
        table.append({"rows": rows, "k": k, "m": m, "stored": stored,
                      "gb_per_s": round(megabytes / 1e3 / statistics.median(ts), 1)})
        print(f"rows {rows:3d}  {k:5d} x {m:5d} stored {stored}: {table[-1]['gb_per_s']:6.1f} GB/s")
    return table


def build_parts(model: Any, steps: int, width: int) -> Dict[str, Callable[[], Any]]:
    """The loop's parts, each compiled in a ``tf.while_loop`` of ``steps`` iterations."""
    import tensorflow as tf

    def loop(body: Callable, initial: Any) -> Any:
        return tf.while_loop(lambda t, *_: t < steps, lambda t, *rest: (t + 1, *body(*rest)), (0, *initial))

    @tf.function(jit_compile=True, autograph=False)
    def model_step(token):
        def body(tok, state):
            logits, state = model.step(tok, state)
            return tf.cast(tf.argmax(logits, -1), tf.int32), state
        return loop(body, (token, model.initial_state(1, steps + 1)))[1]

    @tf.function(jit_compile=True, autograph=False)
    def decoder_step(x):
        return loop(lambda h, state: model.decoder.step(h, state), (x, model.initial_state(1, steps + 1)))[1]

    @tf.function(jit_compile=True, autograph=False)
    def projection(x):
        return loop(lambda h: (h + tf.reduce_max(model.projection(h)) * 1e-9,), (x,))[1]

    @tf.function(jit_compile=True, autograph=False)
    def empty(x):
        return loop(lambda h: (h + 1.0,), (x,))[1]

    token, hidden = tf.constant([3], tf.int32), tf.ones([1, width])
    return {"model.step": lambda: model_step(token).numpy(),
            "decoder.step": lambda: decoder_step(hidden).numpy(),
            "output projection": lambda: projection(hidden).numpy(),
            "empty loop": lambda: empty(hidden).numpy()}


def copy_of(model: Any) -> Any:
    """A new model of ``model``'s config holding its weights."""
    from lmkit.models import build_model

    copy = build_model(model.get_config())
    for mine, theirs in zip(copy.variables, model.variables):
        mine.assign(theirs)
    return copy


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from lmkit import distributed as dist
    dist.init(backend="local", intra_op_threads=args.threads, inter_op_threads=args.threads)
    import numpy as np
    import tensorflow as tf

    from lmkit import decoding
    from lmkit.decoding import sampler as sampler_module
    from lmkit.layers import layouts
    from lmkit.models import build_model

    load_before = load_average()
    model = build_model({"model": "gpt2", "vocab_size": 8192, "hidden_size": 256, "num_layers": 4,
                         "num_heads": 4, "max_positions": 256})
    model(tf.zeros([1, 4], tf.int32))
    length = args.prompt + args.new_tokens
    prompt = np.random.RandomState(0).randint(0, 8192, size=(1, args.prompt)).tolist()
    default_multiple = sampler_module.PREFILL_MULTIPLE

    def decode(multiple: int = default_multiple, layout: bool = True, new: int = args.new_tokens,
               min_steps: int = layouts.MIN_STEPS) -> Callable[[], Any]:
        """``decode`` of ``new`` tokens with prefills of ``multiple``, with or without the weight layouts (made
        for loops of ``min_steps`` or more)."""
        copy = model if layout else copy_of(model)  # a model of its own: a trace of its own
        default_steps = layouts.MIN_STEPS

        def run():
            sampler_module.PREFILL_MULTIPLE, layouts.ENABLED, layouts.MIN_STEPS = multiple, layout, min_steps
            try:
                return decoding.decode(copy, args.prompt + new, prompts=prompt)
            finally:
                sampler_module.PREFILL_MULTIPLE, layouts.ENABLED = default_multiple, True
                layouts.MIN_STEPS = default_steps
        return run

    # Per new token for the decodes; per iteration (length - 1 of them) for the parts.
    parts: Dict[str, Callable[[], Any]] = {"decode": decode(),
                                           "decode, prompt a token a step": decode(10 ** 9),
                                           "decode, no layouts": decode(layout=False),
                                           "decode, one new token (per call)": decode(new=1),
                                           "decode, one new token, the copies made (per call)":
                                               decode(new=1, min_steps=0)}
    parts.update(build_parts(model, length - 1, 256))
    decodes = tuple(name for name in parts if name == "decode" or name.startswith("decode,"))
    per = {name: (args.new_tokens if name in decodes else length - 1) for name in parts}
    per.update({name: 1 for name in parts if "(per call)" in name})
    same = np.array_equal(parts["decode"]().ids, parts["decode, prompt a token a step"]().ids)
    same_layouts = np.array_equal(parts["decode"]().ids, parts["decode, no layouts"]().ids)
    for run in parts.values():  # traces and compiles each
        run()
    times: Dict[str, List[float]] = {name: [] for name in parts}
    for _ in range(args.rounds):
        for name, run in parts.items():
            start = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - start) / per[name] * 1e3)
    medians = {name: round(statistics.median(ts), 4) for name, ts in times.items()}
    rows = {name: {"ms": medians[name], "ms_per_round": [round(t, 4) for t in ts]} for name, ts in times.items()}
    def gain(slower: str) -> float:  # the median over rounds of (slower / decode)
        return round(statistics.median([b / a for a, b in zip(times["decode"], times[slower])]), 3)

    prefill_gain = [b / a for a, b in zip(times["decode"], times["decode, prompt a token a step"])]
    results = {
        "benchmark": "decode_profile",
        "command": command_line(),
        "machine": machine_info(tensorflow=tf.__version__),
        "threads": args.threads,
        "shape": {"layers": 4, "width": 256, "heads": 4, "vocab": 8192, "prompt": args.prompt,
                  "new_tokens": args.new_tokens, "batch": 1},
        "ms": rows,
        "tokens_per_sec": {name: round(1e3 / medians[name], 1) for name in decodes if per[name] > 1},
        "prefill_speedup_median_of_rounds": round(statistics.median(prefill_gain), 3),
        "prefill_same_tokens": bool(same),
        "layouts_speedup_median_of_rounds": gain("decode, no layouts"),
        "layouts_same_tokens": bool(same_layouts),
        "matmul_layouts_gb_per_s": matmul_layouts([int(r) for r in args.matmul_rows.split(",") if r], args.rounds),
        "load_average": {"before": load_before, "after": load_average()},
    }
    for name in parts:
        unit = "call" if per[name] == 1 else "new token" if name in decodes else "step"
        print(f"{name:50s} {medians[name]:8.3f} ms per {unit}")
    print(f"prefill: {results['prefill_speedup_median_of_rounds']}x, same tokens: {same}")
    print(f"layouts: {results['layouts_speedup_median_of_rounds']}x, same tokens: {same_layouts}")
    print("wrote", write_json(args.output, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
