#!/usr/bin/env python
"""Generated tokens/sec of lmkit.decoding: the XLA-compiled loop, the plain loop, no cache, and transformers.

Two decoders at the shapes of their configs, randomly initialised (speed
does not depend on the weights), vocabulary 10000:

* ``lstm``: ``configs/config_small.py`` (2 x 200 LSTM);
* ``transformer``: ``configs/config_transformer.py`` (4 layers, 256 units,
  4 heads, max_positions 128).

For every decoder, batch size (1, 8) and output length (32, 64, 128 tokens,
the start token included; the transformer stops at its max_positions) the
same greedy :func:`lmkit.decoding.decode` call runs two ways:

* ``cached_xla`` (the default of ``decode``): one token per step through
  ``model.step`` with the RNN state or the key/value cache, the whole loop
  compiled with XLA (``jit_compile=True``);
* ``cached`` (``jit_compile=False``): the same loop as a plain ``tf.function``;
* ``uncached`` (``use_cache=False``): ``model(prefix)`` on the whole prefix at
  every step, then the last position's logits (quadratic in the length);
* ``transformers`` (transformer only): Hugging Face ``GPT2LMHeadModel`` of the
  same shape on PyTorch, ``generate`` greedy with its key/value cache, the
  same threads; skipped with a message when ``transformers`` or ``torch`` is
  not installed (``pip install -e '.[test-hf]'``).

Past the context (``--sliding``, transformer only): :func:`lmkit.decoding.generate`
writes 256 and 512 tokens from a model of 128 positions
(the window slides by half of it, each window one call of the compiled
loop); its tokens/sec is compared with the in-window XLA rate at 128
(``sliding`` in the JSON).

Greedy decoding isolates the model's cost; ``eos_id`` is None, so every row
generates exactly ``length - 1`` tokens. After one untimed call per mode
(it traces the loop), the two modes ALTERNATE (cached first in even rounds,
uncached first in odd ones), so load from other jobs on this shared machine
hits both alike. Reported: the median time per call, tokens/sec =
batch * (length - 1) / median, and the speed-up of the cache as the median of
the per-round ratios; the load average is recorded before and after every
shape.

Usage::

    .venv/bin/python benchmarks/generation.py            # about 4 minutes on 2 cores
    .venv/bin/python benchmarks/generation.py --quick    # about 1 minute: lengths 16, 32
    .venv/bin/python benchmarks/generation.py --models lstm --lengths 32,64 --repeats 5

Writes ``benchmarks/results/generation.json`` and ``.png`` (``--quick``:
``generation.quick.json`` and ``.png``) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks._common import (  # noqa: E402
    RESULTS_DIR,
    command_line,
    load_average,
    machine_info,
    median_ratio,
    save_figure,
    summarize,
    write_json,
)

CONFIGS = {"lstm": "config_small", "transformer": "config_transformer"}
MODES = {"cached_xla": (True, True), "cached": (True, False), "uncached": (False, False)}  # (cache, XLA)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(CONFIGS), help="comma-separated: lstm, transformer")
    parser.add_argument("--lengths", default="32,64,128",
                        help="output lengths, start token included (default 32,64,128)")
    parser.add_argument("--batch_sizes", default="1,8", help="default 1,8")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per mode and shape (default 3)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="TensorFlow intra-op and inter-op threads (default: all cores)")
    parser.add_argument("--quick", action="store_true",
                        help="lengths 16,32 and 2 repeats (a smoke run); writes generation.quick.*")
    parser.add_argument("--sliding", default="256,512",
                        help="transformer output lengths past max_positions, with the sliding window "
                             "(default 256,512; '' for none)")
    parser.add_argument("--output", default=None,
                        help="JSON path; the PNG goes next to it (default benchmarks/results/generation.json)")
    args = parser.parse_args(argv)
    if args.quick:
        args.lengths, args.repeats, args.sliding = "16,32", 2, "192"
    args.output = args.output or os.path.join(RESULTS_DIR, "generation.quick.json" if args.quick
                                              else "generation.json")
    try:
        args.models = [m for m in args.models.split(",") if m]
        args.lengths = [int(x) for x in args.lengths.split(",") if x]
        args.batch_sizes = [int(x) for x in args.batch_sizes.split(",") if x]
        args.sliding = [int(x) for x in args.sliding.split(",") if x]
    except ValueError as exc:
        parser.error(f"--lengths and --batch_sizes take comma-separated integers ({exc})")
    unknown = [m for m in args.models if m not in CONFIGS]
    if unknown or not args.models:
        parser.error(f"--models {unknown or args.models} must be among {', '.join(CONFIGS)}")
    if min(args.lengths, default=0) < 2 or min(args.batch_sizes, default=0) < 1:
        parser.error("--lengths must be >= 2 (one start token, one generated) and --batch_sizes >= 1")
    if args.repeats < 1 or args.threads < 1:
        parser.error("--repeats and --threads must be >= 1")
    return args


def timed(fn) -> float:
    """Seconds of one call of ``fn``."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_shape(model: Any, sampler: Any, batch_size: int, length: int, repeats: int,
                reference: Any = None) -> Dict[str, Any]:
    """Times every mode (and ``reference``, a transformers model) on one shape, alternating them."""
    import numpy as np

    from lmkit import decoding

    def call(mode: str):
        if mode == "transformers":
            return reference_generate(reference, batch_size, length)
        use_cache, jit = MODES[mode]
        # start_id 0 and no eos_id: every row generates length - 1 tokens.
        return decoding.decode(model, length, sampler, batch_size=batch_size, start_id=0,
                               seed=0, use_cache=use_cache, jit_compile=jit).ids

    modes = list(MODES) + (["transformers"] if reference is not None else [])
    load_before = load_average()
    first_call, outputs = {}, {}
    for mode in modes:  # the first call traces (and compiles) the loop
        start = time.perf_counter()
        outputs[mode] = np.asarray(call(mode))
        first_call[mode] = time.perf_counter() - start
    times: Dict[str, List[float]] = {mode: [] for mode in modes}
    for r in range(repeats):
        order = modes if r % 2 == 0 else list(reversed(modes))
        for mode in order:
            times[mode].append(timed(lambda: call(mode)))
    tokens = batch_size * (length - 1)
    row = {"batch_size": batch_size, "length": length, "generated_tokens": tokens,
           "load_average_before": load_before, "load_average_after": load_average(),
           # The modes run the same model on the same tokens; they differ only
           # by float rounding, which could flip a near-tie of the greedy argmax.
           "same_tokens": bool((outputs["cached"] == outputs["uncached"]).all()),
           "xla_same_tokens": bool((outputs["cached_xla"] == outputs["cached"]).all()),
           "cache_speedup": median_ratio(times["uncached"], times["cached"]),
           "xla_speedup": median_ratio(times["cached"], times["cached_xla"])}
    if reference is not None:
        row["xla_vs_transformers"] = median_ratio(times["transformers"], times["cached_xla"])
    for mode in modes:
        stats = summarize(times[mode])
        row[mode] = {"times_s": [round(t, 5) for t in times[mode]], "median_s": stats["median"],
                     "min_s": stats["min"], "max_s": stats["max"],
                     "first_call_s": round(first_call[mode], 3),
                     "tokens_per_sec": tokens / stats["median"]}
    return row


def bench_sliding(model: Any, tokenizer: Any, sampler: Any, batch_size: int, length: int,
                  repeats: int) -> Dict[str, Any]:
    """Tokens/sec of ``length - 1`` new tokens past the context (sliding windows) against one window's."""
    from lmkit import decoding
    window = model.max_positions
    prompts = [[]] * batch_size  # the start token only

    def slide():
        return decoding.generate(model, prompts, tokenizer=tokenizer, max_new_tokens=length - 1, sampler=sampler,
                                 seed=0, return_samples=True)

    def one_window():
        return decoding.decode(model, window, sampler, batch_size=batch_size, start_id=0, seed=0)

    slide(), one_window()  # traces
    times: Dict[str, List[float]] = {"sliding": [], "window": []}
    for r in range(repeats):
        for mode in (("sliding", "window") if r % 2 == 0 else ("window", "sliding")):
            times[mode].append(timed(slide if mode == "sliding" else one_window))
    rates = {"sliding": batch_size * (length - 1) / summarize(times["sliding"])["median"],
             "window": batch_size * (window - 1) / summarize(times["window"])["median"]}
    return {"batch_size": batch_size, "length": length, "window": window,
            "times_s": {k: [round(t, 5) for t in v] for k, v in times.items()},
            "tokens_per_sec": {k: round(v, 1) for k, v in rates.items()},
            "sliding_vs_window": round(rates["sliding"] / rates["window"], 3)}


class _StartToken:
    """The least a tokenizer must be for generate() here: a start token, ids as text."""

    name, eos_id, bos_id, unk_id = "bench", 0, None, None

    def decode(self, ids):
        return " ".join(map(str, ids))


def reference_model(config: Any, threads: int) -> Any:
    """transformers' GPT2LMHeadModel of the transformer config's shape, or None (said why)."""
    try:
        import torch
        import transformers
    except ImportError:
        print("transformers/torch not installed: no transformers column (pip install -e '.[test-hf]')",
              flush=True)
        return None
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    shape = transformers.GPT2Config(vocab_size=config.model["vocab_size"], n_positions=config.model["max_positions"],
                                    n_embd=config.model["hidden_size"], n_layer=config.model["num_layers"],
                                    n_head=config.model["num_heads"],
                                    n_inner=config.model["ffn_dim"] or None)
    return transformers.GPT2LMHeadModel(shape).eval()


def reference_generate(reference: Any, batch_size: int, length: int) -> Any:
    """Greedy generation with transformers: a one-token prompt, then length - 1 tokens, with the cache."""
    import torch
    prompt = torch.zeros(batch_size, 1, dtype=torch.long)
    with torch.no_grad():
        out = reference.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                 max_new_tokens=length - 1, min_new_tokens=length - 1, pad_token_id=0)
    return out.numpy()


def plot(results: Dict[str, Any], path: str) -> Optional[str]:
    """Tokens/sec against length, one panel per batch size, one line per decoder x mode."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib import ticker
    except ImportError:
        print("matplotlib is not installed (pip install -e .[bench]); no plot", flush=True)
        return None
    batch_sizes = sorted({row["batch_size"] for m in results["models"].values() for row in m["rows"]})
    fig, axes = plt.subplots(1, len(batch_sizes), figsize=(5.5 * len(batch_sizes), 4.2), squeeze=False)
    colors = {"lstm": "tab:blue", "transformer": "tab:orange"}
    for ax, batch in zip(axes[0], batch_sizes):
        for name, model in results["models"].items():
            rows = [r for r in model["rows"] if r["batch_size"] == batch]
            for mode, style in (("cached_xla", "-^"), ("cached", "-o"), ("uncached", "--s"),
                                ("transformers", ":d")):
                if rows and mode in rows[0]:
                    ax.plot([r["length"] for r in rows], [r[mode]["tokens_per_sec"] for r in rows], style,
                            color=colors.get(name) if mode != "transformers" else "tab:red",
                            label=f"{name}, {mode}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")  # the uncached rate falls with the length, the cached one does not
        lengths = sorted({r["length"] for m in results["models"].values() for r in m["rows"]})
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.xaxis.set_minor_locator(ticker.NullLocator())
        ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda y, _: f"{y:g}"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlabel("output length (tokens, start token included)")
        ax.set_ylabel("generated tokens / sec (median)")
        ax.set_title(f"batch {batch}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    machine = results["machine"]
    fig.suptitle(f"lmkit greedy decoding, vocab 10000, {results['threads']['tf_intra_op']} threads, "
                 f"{machine['nproc']} cores; load avg {machine['load_average_at_start'][0]} at start, "
                 f"{results['load_average_at_end'][0]} at end", fontsize=9)
    return save_figure(fig, path)


def markdown_table(results: Dict[str, Any]) -> str:
    """The results as a Markdown table (pasted into docs/generation.md)."""
    lines = ["| decoder | batch | length | XLA tok/s | plain tok/s | uncached tok/s | transformers tok/s | "
             "XLA / plain | XLA / transformers | load (1 min) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, model in results["models"].items():
        for r in model["rows"]:
            hf = r.get("transformers")
            lines.append(f"| {name} | {r['batch_size']} | {r['length']} | {r['cached_xla']['tokens_per_sec']:,.0f} | "
                         f"{r['cached']['tokens_per_sec']:,.0f} | {r['uncached']['tokens_per_sec']:,.0f} | "
                         f"{'-' if hf is None else format(hf['tokens_per_sec'], ',.0f')} | "
                         f"{r['xla_speedup']:.1f}x | "
                         f"{'-' if hf is None else format(r['xla_vs_transformers'], '.1f') + 'x'} | "
                         f"{r['load_average_before'][0]:.1f}-{r['load_average_after'][0]:.1f} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    from lmkit import distributed as dist
    dist.init(backend="local", intra_op_threads=args.threads, inter_op_threads=args.threads)

    import tensorflow as tf

    from lmkit import decoding
    from lmkit.config import load_config
    from lmkit.models import build_model

    # Every shape and mode is one trace of the decode loop, by design; TF's
    # "excessive retracing" warning would only add noise.
    tf.get_logger().setLevel("ERROR")
    results: Dict[str, Any] = {
        "benchmark": "generation",
        "command": command_line(),
        "machine": machine_info(tensorflow=tf.__version__),
        "threads": {"tf_intra_op": dist.threads().intra_op, "tf_inter_op": dist.threads().inter_op},
        "settings": {"sampler": "greedy", "repeats": args.repeats, "warmup_calls": 1,
                     "batch_sizes": args.batch_sizes, "lengths": args.lengths, "quick": args.quick,
                     "order": "the modes alternate, reversed in odd rounds"},
        "models": {},
    }
    started = time.perf_counter()
    sampler = decoding.GreedySampler()  # one object: the traces are cached per sampler
    for name in args.models:
        config = load_config(CONFIGS[name])
        tf.random.set_seed(0)
        model = build_model(config.model_config())
        lengths = [n for n in args.lengths if name != "transformer" or n <= config.model["max_positions"]]
        skipped = sorted(set(args.lengths) - set(lengths))
        if skipped:
            print(f"{name}: lengths {skipped} exceed max_positions {config.model['max_positions']}; skipped",
                  flush=True)
        rows = []
        reference = reference_model(config, args.threads) if name == "transformer" else None
        for batch_size in args.batch_sizes:
            for length in lengths:
                row = bench_shape(model, sampler, batch_size, length, args.repeats, reference)
                rows.append(row)
                hf = row.get("transformers")
                print(f"{name:11s} batch {batch_size:2d} length {length:4d}: XLA "
                      f"{row['cached_xla']['tokens_per_sec']:7.0f}, plain {row['cached']['tokens_per_sec']:7.0f}, "
                      f"uncached {row['uncached']['tokens_per_sec']:7.0f}"
                      + ("" if hf is None else f", transformers {hf['tokens_per_sec']:7.0f}")
                      + f" tok/s (load {row['load_average_after'][0]})", flush=True)
        results["models"][name] = {
            "config": CONFIGS[name], "model_config": config.model_config(),
            "parameters": int(sum(v.shape.num_elements() for v in model.trainable_variables)),
            "skipped_lengths": skipped, "rows": rows}
        if name == "transformer" and args.sliding:
            sliding = []
            for batch_size in args.batch_sizes:
                for length in args.sliding:
                    row = bench_sliding(model, _StartToken(), sampler, batch_size, length, args.repeats)
                    sliding.append(row)
                    print(f"{name:11s} batch {batch_size:2d} length {length:4d} (window {row['window']}, "
                          f"sliding): {row['tokens_per_sec']['sliding']:7.0f} tok/s, "
                          f"{row['sliding_vs_window']:.2f}x one window's rate", flush=True)
            results["models"][name]["sliding"] = sliding
    results["load_average_at_end"] = load_average()
    results["wall_time_s"] = round(time.perf_counter() - started, 1)
    write_json(args.output, results)
    png = plot(results, os.path.splitext(args.output)[0] + ".png")
    print(f"\n{markdown_table(results)}\n")
    print(f"wrote {args.output}" + (f" and {png}" if png else "") +
          f" in {results['wall_time_s']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
