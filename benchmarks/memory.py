#!/usr/bin/env python
"""Peak resident memory per rank while training, on 1 and 2 Horovod ranks.

Launches ``benchmarks/_scaling_worker.py`` under ``mpirun -np 1`` and
``-np 2`` for each config; every rank trains a few hundred steps (fewer for
config_medium, whose RSS is flat after the first steps: the RSS trace shows
it) and reports its peak resident set size (``ru_maxrss``) and its RSS every
few steps (psutil). One intra-op thread per rank, as in scaling.py.

Usage::

    .venv/bin/python benchmarks/memory.py              # ~6 minutes
    .venv/bin/python benchmarks/memory.py --quick      # ~2 minutes

Writes ``benchmarks/results/memory.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any, Dict, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import scaling  # noqa: E402
from benchmarks._common import RESULTS_DIR, command_line, load_average, machine_info, save_figure, write_json  # noqa: E402

STEPS = {"config_small": 300, "config_medium": 40}
QUICK_STEPS = {"config_small": 100, "config_medium": 12}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="config_small,config_medium")
    parser.add_argument("--ranks", default="1,2", help="comma-separated world sizes")
    parser.add_argument("--steps", type=int, default=0, help="training steps (default: per config)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output", default=os.path.join(RESULTS_DIR, "memory.json"))
    args = parser.parse_args(argv)
    args.configs = [c for c in args.configs.split(",") if c]
    args.ranks = [int(r) for r in args.ranks.split(",") if r]
    return args


def plot(results: Dict[str, Any], path: str) -> Optional[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e .[bench]); no plot", flush=True)
        return None
    runs = results["runs"]
    fig, (bars_ax, trace_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels, peaks = [], []
    for key, run in runs.items():
        if "ranks" not in run:
            continue
        for rank in run["ranks"]:
            labels.append(f"{key}\nrank {rank['rank']}")
            peaks.append(rank["memory"]["peak_rss_mib"])
            trace = rank["memory"]["rss_trace"]
            trace_ax.plot([p[0] for p in trace], [p[1] for p in trace], marker=".", label=f"{key} r{rank['rank']}")
    bars = bars_ax.bar(range(len(peaks)), peaks, color="#1f77b4")
    for bar, peak in zip(bars, peaks):
        bars_ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), f"{peak:.0f}", ha="center",
                     va="bottom", fontsize=8)
    bars_ax.set_xticks(range(len(labels)))
    bars_ax.set_xticklabels(labels, fontsize=7, rotation=30, ha="right")
    bars_ax.set_ylabel("peak RSS per rank (MiB, ru_maxrss)")
    bars_ax.set_title("peak resident memory per rank", fontsize=9)
    trace_ax.set_xlabel("training step")
    trace_ax.set_ylabel("RSS (MiB)")
    trace_ax.set_title("RSS while training (flat = no growth)", fontsize=9)
    trace_ax.legend(fontsize=6)
    return save_figure(fig, path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    log = lambda s: print(s, flush=True)  # noqa: E731
    results: Dict[str, Any] = {"benchmark": "memory", "command": command_line(), "machine": machine_info(),
                               "threads_per_rank": args.threads, "runs": {}}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lmkit-memory-") as workdir:
        for config in args.configs:
            steps = args.steps or (QUICK_STEPS if args.quick else STEPS).get(config, 100)
            for ranks in args.ranks:
                label = "1 rank" if ranks == 1 else "2 ranks"
                launch_args = argparse.Namespace(threads=args.threads, inter_threads=0, timeout=args.timeout,
                                                 steps=steps, repeats=1, warmup=2, quick=False)
                run = scaling.launch(config, label, launch_args, batch=0, workdir=workdir, log=log)
                key = f"{config}, {ranks} rank{'s' if ranks > 1 else ''}"
                results["runs"][key] = run
                if "ranks" in run:
                    peaks = [r["memory"]["peak_rss_mib"] for r in run["ranks"]]
                    log(f"{key}: peak RSS per rank {peaks} MiB after {run['total_train_steps']} steps "
                        f"(load {load_average()[:1]})")
    results["summary_peak_rss_mib"] = {
        key: [r["memory"]["peak_rss_mib"] for r in run["ranks"]]
        for key, run in results["runs"].items() if "ranks" in run}
    results["load_average_at_end"] = load_average()
    results["wall_seconds"] = round(time.perf_counter() - started, 1)
    path = write_json(args.output, results)
    png = plot(results, os.path.splitext(args.output)[0] + ".png")
    log(f"wrote {path}" + (f" and {png}" if png else "") + f" in {results['wall_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
