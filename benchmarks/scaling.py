#!/usr/bin/env python
"""Scaling of lmkit training from 1 to 2 Horovod ranks on this host.

Launches ``benchmarks/_scaling_worker.py`` under ``mpirun`` (with a timeout)
once per variant, every rank with the same threads (``LMKIT_INTRA_OP_THREADS``,
default 1) and bound to its own core (Open MPI's default binding for 2
ranks), so N ranks use N cores:

==========================  ====  ===================================================
variant                     np    what changes
==========================  ====  ===================================================
1 rank                      1     the reference
2 ranks                     2     defaults: embedding gradient allgathered (sparse)
2 ranks + fp16              2     ``compression = "fp16"`` for dense gradients
2 ranks + sparse_as_dense   2     the embedding gradient densified and allreduced
2 ranks + no fusion         2     ``HOROVOD_FUSION_THRESHOLD=0`` (default: 128 MB)
2 ranks + cycle 0.2 ms      2     ``HOROVOD_CYCLE_TIME=0.2`` (Horovod's default: 1 ms)
2 ranks + cycle 5 ms        2     ``HOROVOD_CYCLE_TIME=5``
1 rank + half batch         1     one rank's share of the 2-rank work, no collectives
2 ranks + 2x batch          2     weak scaling: each rank keeps the 1-rank batch
2 ranks + timeline          2     ``HOROVOD_TIMELINE`` on: time spent in collectives
2 ranks + busy polling      2     ``OMPI_MCA_mpi_yield_when_idle=0``: Open MPI spins
                                  while it waits (lmkit's default makes it yield)
2 ranks + 2 inter-op        2     ``LMKIT_INTER_OP_THREADS=2`` (lmkit's default for a
                                  1-thread rank is 1; it was 2 before)
1 rank + 2 inter-op         1     the same for the reference
2 ranks + fusion 1 MB       2     ``HOROVOD_FUSION_THRESHOLD=1048576``: the softmax
                                  layer's 8 MB gradient is reduced in place, not
                                  copied through the fusion buffer
2 ranks + accum 2           2     ``grad_accum_steps = 2``, same global batch: 2
                                  micro-batches of half of each rank's rows
1 rank + accum 4, 4x batch  1     4 micro-batches of the config's batch per step
2 ranks + accum 4,          2     each rank: 4 micro-batches of the "2 ranks"
4x batch                          rows, one allreduce: communication per sample / 4
==========================  ====  ===================================================

Throughput of N ranks = global words per step / step time (the slowest
rank's); strong-scaling efficiency = throughput(2 ranks) / (2 x throughput(1
rank)) with the config's global batch split over the ranks; weak-scaling
efficiency uses a global batch twice as large on 2 ranks. The time the
collectives cost per step is measured two ways: the 2-rank step minus the
"1 rank + half batch" step (same per-rank work), and the Horovod timeline
(union of the ALLREDUCE / ALLGATHER activities of the gradient and loss
tensors after negotiation, and of the negotiation itself, on rank 0).
Every launch also times the step's collectives alone (the gradients of one
batch and the loss averaged over the ranks, nothing else running): the
communication floor of this host.

Usage::

    .venv/bin/python benchmarks/scaling.py                 # config_small, all variants, ~8 min
    .venv/bin/python benchmarks/scaling.py --rounds 3      # each variant 3 times, alternating (~20 min)
    .venv/bin/python benchmarks/scaling.py --quick         # 4 variants, ~3 min
    .venv/bin/python benchmarks/scaling.py --configs config_small,config_medium --variants core

Writes ``benchmarks/results/scaling.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks._common import (  # noqa: E402
    REPO,
    RESULTS_DIR,
    command_line,
    intervals_union,
    load_average,
    machine_info,
    save_figure,
    summarize,
    write_json,
)

WORKER = os.path.join(REPO, "benchmarks", "_scaling_worker.py")
PYTHON = os.path.join(REPO, ".venv", "bin", "python")

# label -> (ranks, config overrides, extra environment); "{B}" is the config's batch.
VARIANTS: Dict[str, Tuple[int, Dict[str, Any], Dict[str, str]]] = {
    "1 rank": (1, {}, {}),
    "2 ranks": (2, {}, {}),
    "2 ranks + fp16": (2, {"compression": "fp16"}, {}),
    "2 ranks + sparse_as_dense": (2, {"sparse_as_dense": True}, {}),
    "2 ranks + no fusion": (2, {}, {"HOROVOD_FUSION_THRESHOLD": "0"}),
    "2 ranks + cycle 0.2 ms": (2, {}, {"HOROVOD_CYCLE_TIME": "0.2"}),
    "2 ranks + cycle 5 ms": (2, {}, {"HOROVOD_CYCLE_TIME": "5"}),
    "1 rank + half batch": (1, {"batch_size": "{B/2}"}, {}),
    "2 ranks + 2x batch": (2, {"batch_size": "{2B}"}, {}),
    "2 ranks + timeline": (2, {}, {"HOROVOD_TIMELINE": "{timeline}"}),
    "2 ranks + busy polling": (2, {}, {"OMPI_MCA_mpi_yield_when_idle": "0"}),
    "2 ranks + 2 inter-op": (2, {}, {"LMKIT_INTER_OP_THREADS": "2"}),
    "1 rank + 2 inter-op": (1, {}, {"LMKIT_INTER_OP_THREADS": "2"}),
    "2 ranks + fusion 1 MB": (2, {}, {"HOROVOD_FUSION_THRESHOLD": "1048576"}),
    "2 ranks + accum 2": (2, {"grad_accum_steps": 2}, {}),
    "1 rank + accum 4, 4x batch": (1, {"batch_size": "{4B}", "grad_accum_steps": 4}, {}),
    "2 ranks + accum 4, 4x batch": (2, {"batch_size": "{4B}", "grad_accum_steps": 4}, {}),
}
SETS = {
    "all": list(VARIANTS),
    "core": ["1 rank", "2 ranks", "1 rank + half batch", "2 ranks + 2x batch", "2 ranks + timeline",
             "2 ranks + busy polling"],
    "quick": ["1 rank", "2 ranks", "1 rank + half batch", "2 ranks + timeline"],
    "accum": ["1 rank", "2 ranks", "2 ranks + accum 2", "1 rank + accum 4, 4x batch",
              "2 ranks + accum 4, 4x batch"],
}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="config_small", help="comma-separated config names")
    parser.add_argument("--variants", default="all",
                        help=f"a set ({', '.join(SETS)}) or comma-separated labels of VARIANTS")
    parser.add_argument("--steps", type=int, default=0, help="steps per timed run (default: 25 small, 3 medium)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per launch")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1,
                        help="launch every variant this many times, alternating (medians over all runs)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank (LMKIT_INTRA_OP_THREADS)")
    parser.add_argument("--inter_threads", type=int, default=0,
                        help="inter-op threads per rank (LMKIT_INTER_OP_THREADS); 0 = lmkit's default")
    parser.add_argument("--timeout", type=int, default=600, help="seconds before a launch is killed")
    parser.add_argument("--quick", action="store_true", help="the 'quick' variants, fewer steps")
    parser.add_argument("--output", default=os.path.join(RESULTS_DIR, "scaling.json"))
    args = parser.parse_args(argv)
    args.configs = [c for c in args.configs.split(",") if c]
    if args.quick and args.variants == "all":
        args.variants = "quick"
    labels = SETS.get(args.variants) or [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in labels if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant {unknown[0]!r}; known: {', '.join(VARIANTS)}")
    args.variants = labels
    return args


def _steps(config: str, args: argparse.Namespace) -> int:
    if args.steps:
        return args.steps
    base = 3 if "medium" in config else 25
    return max(2, base // 2) if args.quick else base


def launch(config: str, label: str, args: argparse.Namespace, batch: int, workdir: str,
           log) -> Dict[str, Any]:
    """Runs one variant under mpirun; returns the worker's JSON (plus the timeline summary)."""
    ranks, overrides, extra_env = VARIANTS[label]
    out = os.path.join(workdir, f"{config}-{label.replace(' ', '_').replace('+', '')}-{time.time_ns()}.json")
    timeline = out[:-5] + ".timeline.json"
    env = dict(os.environ)
    env.update({"LMKIT_INTRA_OP_THREADS": str(args.threads), "TF_CPP_MIN_LOG_LEVEL": "2"})
    if args.inter_threads:
        env["LMKIT_INTER_OP_THREADS"] = str(args.inter_threads)
    if os.geteuid() == 0:  # Open MPI refuses root without both
        env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    for key, value in extra_env.items():
        env[key] = value.replace("{timeline}", timeline)
    sets = []
    for key, value in overrides.items():
        if value == "{B/2}":
            value = batch // 2
        elif value == "{2B}":
            value = batch * 2
        elif value == "{4B}":
            value = batch * 4
        sets += ["--set", f"{key}={value!r}"]
    forwarded = sorted(k for k in env if k.startswith(("LMKIT_", "HOROVOD_", "TF_CPP", "OMPI_MCA_")))
    cmd = ["mpirun", "-np", str(ranks), "--bind-to", "core", "--map-by", "core"]
    for key in forwarded:
        cmd += ["-x", key]
    cmd += [PYTHON, WORKER, "--config", config, "--steps", str(_steps(config, args)),
            "--repeats", str(args.repeats), "--warmup", str(args.warmup), "--output", out] + sets
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        log(f"  {label}: timed out after {args.timeout} s")
        return {"error": f"timeout after {args.timeout} s"}
    if proc.returncode != 0 or not os.path.exists(out):
        tail = (proc.stderr or proc.stdout)[-1500:]
        log(f"  {label}: failed (exit {proc.returncode}):\n{tail}")
        return {"error": f"exit {proc.returncode}", "stderr_tail": tail}
    with open(out) as f:
        result = json.load(f)
    result["launch_seconds"] = round(time.perf_counter() - start, 1)
    result["mpirun"] = " ".join(cmd[:cmd.index(PYTHON)])
    if "HOROVOD_TIMELINE" in extra_env and os.path.exists(timeline):
        result["timeline"] = parse_timeline(timeline, result["timed_windows_epoch_us"],
                                            result["steps_per_run"] * len(result["timed_windows_epoch_us"]))
    return result


def parse_timeline(path: str, windows_us: List[List[float]], train_steps: int) -> Dict[str, Any]:
    """Time per training step in the collectives of the training step (rank 0's timeline).

    Horovod writes Chrome-trace events: one "process" per tensor, nested
    B/E activities (NEGOTIATE_*, then ALLREDUCE / ALLGATHER with MPI_* and
    fusion-buffer copies inside). Only the tensors of the training step count
    (gradients and the loss), not the start-up broadcast, and only activities
    that begin inside the timed runs (``windows_us``: wall-clock spans in
    microseconds since the epoch), not the warm-up and its tracing.
    """
    with open(path) as f:
        text = f.read().strip()
    if not text.endswith("]"):  # the file is closed at shutdown; be lenient
        text = text.rstrip(",") + "]"
    events = json.loads(text)
    names = {e["pid"]: e.get("args", {}).get("name", "") for e in events if e.get("name") == "process_name"}
    origin = next((e["args"]["start_time_since_epoch_in_micros"] for e in events
                   if e.get("name") == "process_name" and "start_time_since_epoch_in_micros" in e.get("args", {})),
                  None)
    if origin is None:
        return {"error": "no start_time_since_epoch_in_micros in the timeline"}
    windows = [(a - origin, b - origin) for a, b in windows_us]

    def timed(ts: float) -> bool:
        return any(a <= ts <= b for a, b in windows)
    stacks: Dict[int, List[Tuple[str, float]]] = {}
    spans: Dict[str, List[Tuple[float, float]]] = {"negotiate": [], "collective": []}
    by_kind: Dict[str, float] = {}
    for e in events:
        pid, ph = e.get("pid"), e.get("ph")
        name = names.get(pid, "")
        if not ("DistributedGradientTape" in name or "lmkit.train_loss" in name):
            continue
        if ph == "B":
            stacks.setdefault(pid, []).append((e["name"], e["ts"]))
        elif ph == "E" and stacks.get(pid):
            activity, begin = stacks[pid].pop()
            if not timed(begin):
                continue
            if not stacks[pid]:  # a top-level activity of this tensor
                kind = "negotiate" if activity.startswith("NEGOTIATE") else "collective"
                spans[kind].append((begin, e["ts"]))
            by_kind[activity] = by_kind.get(activity, 0.0) + (e["ts"] - begin)
    steps = max(1, train_steps)
    return {
        "timed_train_steps": train_steps,
        "collective_ms_per_step": round(intervals_union(spans["collective"]) / 1000 / steps, 3),
        "negotiate_ms_per_step": round(intervals_union(spans["negotiate"]) / 1000 / steps, 3),
        "activity_ms_per_step (summed over tensors)": {
            k: round(v / 1000 / steps, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "tensors": sorted({n for n in names.values() if "DistributedGradientTape" in n or "lmkit.train_loss" in n}),
    }


def reference_variant(label: str) -> str:
    """The 1-rank variant that a 2-rank variant is compared with: the same threads and work per step."""
    if label.endswith("+ accum 4, 4x batch"):
        return "1 rank + accum 4, 4x batch"
    return "1 rank + 2 inter-op" if label.endswith("+ 2 inter-op") else "1 rank"


def efficiency(label: str, words_per_sec: Dict[str, float]) -> Optional[Tuple[str, float]]:
    """``(kind, throughput / (2 x the reference's))`` of a 2-rank variant, else None.

    ``kind`` is "weak" for the variant that doubles the global batch, "strong" otherwise.
    """
    ref = words_per_sec.get(reference_variant(label))
    if not label.startswith("2 ranks") or label not in words_per_sec or not ref:
        return None
    return ("weak" if label == "2 ranks + 2x batch" else "strong"), words_per_sec[label] / (2 * ref)


def summarize_config(config: str, runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {"variants": {}, "efficiency": {}, "collectives": {}}
    median_wps: Dict[str, float] = {}
    median_step: Dict[str, float] = {}
    for label, results in runs.items():
        good = [r for r in results if "words_per_sec" in r]
        wps = [w for r in good for w in r["words_per_sec"]]
        steps = [s for r in good for s in r["step_seconds"]]
        entry: Dict[str, Any] = {"runs": results, "words_per_sec": summarize(wps),
                                 "step_ms": summarize([1000 * s for s in steps])}
        if good:
            median_wps[label] = statistics.median(wps)
            median_step[label] = statistics.median(steps)
            entry["peak_rss_mib_per_rank"] = [rk["memory"]["peak_rss_mib"] for rk in good[-1]["ranks"]]
            entry["global_batch"] = good[-1]["global_batch"]
            entry["local_batch"] = good[-1]["local_batch"]
            entry["mean_loss"] = good[-1]["mean_loss"]
        out["variants"][label] = entry
    for label in median_wps:
        found = efficiency(label, median_wps)
        if found:
            out["efficiency"][f"{found[0]}: {label}"] = round(found[1], 3)
    if "2 ranks" in median_step and "1 rank + half batch" in median_step:
        out["collectives"]["step_ms_2_ranks"] = round(1000 * median_step["2 ranks"], 2)
        out["collectives"]["step_ms_1_rank_half_batch"] = round(1000 * median_step["1 rank + half batch"], 2)
        out["collectives"]["step_minus_half_batch_step_ms"] = round(
            1000 * (median_step["2 ranks"] - median_step["1 rank + half batch"]), 2)
    alone = [ms for r in runs.get("2 ranks", []) for ms in r.get("collectives_alone_ms", [])]
    if alone:
        out["collectives"]["collectives_alone_ms"] = summarize(alone)
    if "1 rank" in median_step and "1 rank + half batch" in median_step:
        out["collectives"]["half_batch_speedup_1_rank"] = round(
            median_step["1 rank"] / median_step["1 rank + half batch"], 3)
    timelines = [r["timeline"] for r in runs.get("2 ranks + timeline", []) if "timeline" in r]
    if timelines:
        out["collectives"]["timeline"] = timelines[-1]
    return out


def plot(results: Dict[str, Any], path: str) -> Optional[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e .[bench]); no plot", flush=True)
        return None
    configs = list(results["configs"])
    most = max(len(results["configs"][c]["variants"]) for c in configs)
    fig, axes = plt.subplots(len(configs), 1, figsize=(max(10, 1.25 * most), 4.2 * len(configs)), squeeze=False)
    for ax, config in zip(axes[:, 0], configs):
        res = results["configs"][config]
        labels = [k for k, v in res["variants"].items() if v["words_per_sec"]["n"]]
        med = [res["variants"][k]["words_per_sec"]["median"] for k in labels]
        lo = [m - res["variants"][k]["words_per_sec"]["min"] for m, k in zip(med, labels)]
        hi = [res["variants"][k]["words_per_sec"]["max"] - m for m, k in zip(med, labels)]
        colors = ["#1f77b4" if k.startswith("1 rank") else "#2ca02c" for k in labels]
        bars = ax.bar(range(len(labels)), med, yerr=[lo, hi], capsize=3, color=colors)
        by_label = dict(zip(labels, med))
        for bar, k, m in zip(bars, labels, med):
            text = f"{m:.0f}"
            found = efficiency(k, by_label)
            if found:
                text += f"\neff {found[1]:.2f} ({found[0]})"
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), text, ha="center", va="bottom",
                    fontsize=7)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=25, ha="right", fontsize=8)
        ax.set_ylabel("global words/sec (median, min-max)")
        ax.set_ylim(0, max(m + h for m, h in zip(med, hi)) * 1.3)
        coll = res.get("collectives", {})
        tl = coll.get("timeline", {})
        ax.set_title(f"{config}: {results['threads_per_rank']} intra-op thread(s) per rank; collectives "
                     f"{tl.get('collective_ms_per_step', float('nan')):.1f} ms/step (timeline), "
                     "2-rank step - half-batch step = "
                     f"{coll.get('step_minus_half_batch_step_ms', float('nan')):.1f} ms; "
                     f"collectives alone {coll.get('collectives_alone_ms', {}).get('median', float('nan')):.1f} ms",
                     fontsize=9)
    return save_figure(fig, path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    log = lambda s: print(s, flush=True)  # noqa: E731
    sys.path.insert(0, REPO)
    from lmkit.config import load_config
    results: Dict[str, Any] = {
        "benchmark": "scaling",
        "command": command_line(),
        "machine": machine_info(),
        "threads_per_rank": args.threads,
        "inter_op_threads_per_rank": args.inter_threads or "lmkit default",
        "settings": {"repeats": args.repeats, "warmup": args.warmup, "rounds": args.rounds,
                     "variants": args.variants, "binding": "--bind-to core --map-by core"},
        "configs": {},
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lmkit-scaling-") as workdir:
        for config in args.configs:
            batch = load_config(config).batch_size
            runs: Dict[str, List[Dict[str, Any]]] = {label: [] for label in args.variants}
            for r in range(args.rounds):
                order = args.variants if r % 2 == 0 else list(reversed(args.variants))
                for label in order:
                    res = launch(config, label, args, batch, workdir, log)
                    runs[label].append(res)
                    if "words_per_sec" in res:
                        log(f"[{config}] {label}: {statistics.median(res['words_per_sec']):.0f} words/sec "
                            f"(step {1000 * statistics.median(res['step_seconds']):.1f} ms, "
                            f"batch {res['local_batch']}/rank; load {load_average()[:1]})"
                            + (f"; collectives {res['timeline']['collective_ms_per_step']:.1f} ms/step, "
                               f"negotiation {res['timeline']['negotiate_ms_per_step']:.1f} ms/step"
                               if "timeline" in res else ""))
            results["configs"][config] = summarize_config(config, runs)
            for key, eff in results["configs"][config]["efficiency"].items():
                log(f"[{config}] efficiency {key}: {eff:.3f}")
            if results["configs"][config]["collectives"]:
                collectives = results['configs'][config]['collectives']
                log(f"[{config}] collectives: {json.dumps({k: v for k, v in collectives.items() if k != 'timeline'})}")
    results["load_average_at_end"] = load_average()
    results["wall_seconds"] = round(time.perf_counter() - started, 1)
    path = write_json(args.output, results)
    png = plot(results, os.path.splitext(args.output)[0] + ".png")
    log(f"wrote {path}" + (f" and {png}" if png else "") + f" in {results['wall_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
