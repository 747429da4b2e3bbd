#!/usr/bin/env python
"""Scaling across (simulated) hosts: 1 worker against 2 on one host and on two, for both backends.

Every figure of the scaling table in ``docs/performance.md``. Each row
launches ``benchmarks/_scaling_worker.py`` (the real ``Trainer`` on
synthetic ids, config_small by default) with one intra-op thread per worker
and each worker on its own core:

* **1 worker**: ``taskset -c 0 python worker`` (no collectives); also with
  half the batch (one worker's share of a 2-worker step: the step time
  without communication) and with 4 micro-batches of a 4x batch (the
  reference of the accumulation rows);
* **one host**: ``mpirun -np 2 --bind-to core`` (Horovod, shared memory) and
  ``python -m lmkit.launch --num_workers 2`` (native, each worker bound to a
  core);
* **two hosts**: ``scripts/two_hosts.py run --rate R`` (root): one worker in
  each of two network namespaces joined by a veth link shaped to R (Open MPI
  over TCP only; TensorFlow's gRPC);

each with the config as it is, with ``compression = "fp16"``, with
``grad_accum_steps = 4`` over a 4x global batch, and with both. Rounds alternate the order
of the rows; medians over rounds and timed runs. Efficiency = words/sec of 2
workers / (2 x the matching 1-worker row); "communication" is the 2-worker
step minus the 1-worker half-batch step (the same work per worker), and the
step's collectives timed alone.

Usage (as root, on a quiet machine)::

    .venv/bin/python benchmarks/scale_out.py                      # ~25 min: every row, 2 rounds
    .venv/bin/python benchmarks/scale_out.py --rounds 1 --rows quick
    .venv/bin/python benchmarks/scale_out.py --placements "one host" --variants plain --rounds 5
    .venv/bin/python benchmarks/scale_out.py --report benchmarks/results/scale_out.json   # markdown table

Writes ``benchmarks/results/scale_out.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks._common import (  # noqa: E402
    REPO,
    RESULTS_DIR,
    command_line,
    load_average,
    machine_info,
    save_figure,
    summarize,
    write_json,
)

WORKER = os.path.join(REPO, "benchmarks", "_scaling_worker.py")
TWO_HOSTS = os.path.join(REPO, "scripts", "two_hosts.py")
PYTHON = os.path.join(REPO, ".venv", "bin", "python")  # TF 2.18 + Horovod: both backends, one TensorFlow
LATEST = os.path.join(REPO, ".venv-tf-latest", "bin", "python")

PLACEMENTS = {  # label -> link rate (None: one host)
    "one host": None,
    "two hosts at 10 Gbit/s": "10gbit",
    "two hosts at 1 Gbit/s": "1gbit",
}
VARIANTS = {  # label -> config overrides ("{4B}": 4x the config's batch)
    "plain": {},
    "fp16": {"compression": "fp16"},
    "accum 4 over 4x batch": {"batch_size": "{4B}", "grad_accum_steps": 4},
    "accum 4 over 4x batch + fp16": {"batch_size": "{4B}", "grad_accum_steps": 4, "compression": "fp16"},
}
BASELINES = {  # 1-worker rows
    "1 worker": {},
    "1 worker, half batch": {"batch_size": "{B/2}"},
    "1 worker, accum 4 over 4x batch": {"batch_size": "{4B}", "grad_accum_steps": 4},
}
BACKENDS = ("horovod", "native")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="config_small")
    parser.add_argument("--placements", default=",".join(PLACEMENTS),
                        help=f"comma-separated, of: {', '.join(PLACEMENTS)}")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of: {', '.join(VARIANTS)}")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--native_latest", action="store_true",
                        help="also the native backend on the newest TensorFlow (.venv-tf-latest), one host, plain")
    parser.add_argument("--pack_bytes", default="",
                        help="comma-separated LMKIT_PACK_BYTES values: extra native rows on one host, plain "
                             "(the native backend's all-reduce pack size; default 4 MiB)")
    parser.add_argument("--rows", default="all", choices=("all", "quick"),
                        help="quick: plain variant only")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="steps per timed run")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per launch")
    parser.add_argument("--timeout", type=int, default=600, help="seconds before a launch is killed")
    parser.add_argument("--output", default=os.path.join(RESULTS_DIR, "scale_out.json"))
    args = parser.parse_args(argv)
    args.placements = [p.strip() for p in args.placements.split(",") if p.strip()]
    args.variants = ["plain"] if args.rows == "quick" else [v.strip() for v in args.variants.split(",") if v.strip()]
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for kind, given, known in (("placement", args.placements, PLACEMENTS), ("variant", args.variants, VARIANTS),
                               ("backend", args.backends, BACKENDS)):
        bad = [g for g in given if g not in known]
        if bad:
            parser.error(f"unknown {kind} {bad[0]!r}; known: {', '.join(known)}")
    if any(PLACEMENTS[p] for p in args.placements) and os.geteuid() != 0:
        parser.error("the two-host rows need root (network namespaces); run as root or "
                     "pass --placements 'one host'")
    return args


def rows(args: argparse.Namespace) -> List[Dict[str, Any]]:
    """Every launch of one round: 1-worker baselines, then placement x backend x variant."""
    out = [{"label": label, "workers": 1, "backend": "horovod", "placement": "1 worker", "variant": label,
            "overrides": ov, "python": PYTHON} for label, ov in BASELINES.items()
           if label != "1 worker, accum 4 over 4x batch" or any(v.startswith("accum") for v in args.variants)]
    for placement in args.placements:
        for backend in args.backends:
            for variant in args.variants:
                out.append({"label": f"{placement} | {backend} | {variant}", "workers": 2, "backend": backend,
                            "placement": placement, "variant": variant, "overrides": VARIANTS[variant],
                            "python": PYTHON})
    for pack in [p.strip() for p in args.pack_bytes.split(",") if p.strip()]:
        out.append({"label": f"one host | native, pack {pack} B | plain", "workers": 2, "backend": "native",
                    "placement": "one host", "variant": "plain", "overrides": {}, "python": PYTHON,
                    "env": {"LMKIT_PACK_BYTES": pack}})
    if args.native_latest and "one host" in args.placements:
        out.append({"label": "one host | native, TF latest | plain", "workers": 2, "backend": "native",
                    "placement": "one host", "variant": "plain", "overrides": {}, "python": LATEST})
    return out


def _sets(overrides: Dict[str, Any], batch: int) -> List[str]:
    sets = []
    for key, value in overrides.items():
        value = {"{4B}": 4 * batch, "{B/2}": batch // 2}.get(value, value) if isinstance(value, str) else value
        sets += ["--set", f"{key}={value!r}"]
    return sets


def command(row: Dict[str, Any], args: argparse.Namespace, batch: int, out: str) -> List[str]:
    worker = [row["python"], WORKER, "--config", args.config, "--steps", str(args.steps),
              "--repeats", str(args.repeats), "--output", out] + _sets(row["overrides"], batch)
    if row["workers"] == 1:
        return ["taskset", "-c", "0", *worker]
    rate = PLACEMENTS[row["placement"]]
    if rate:
        return [row["python"], TWO_HOSTS, "run", "--rate", rate, "--backend", row["backend"],
                "--timeout", str(args.timeout - 30), "--", *worker]
    if row["backend"] == "horovod":
        return ["mpirun", "-np", "2", "--bind-to", "core", "--map-by", "core",
                "-x", "LMKIT_INTRA_OP_THREADS", "-x", "TF_CPP_MIN_LOG_LEVEL", *worker]
    return [row["python"], "-m", "lmkit.launch", "--num_workers", "2", "--", *worker]


def launch(row: Dict[str, Any], args: argparse.Namespace, batch: int, workdir: str, log) -> Dict[str, Any]:
    out = os.path.join(workdir, f"run-{time.time_ns()}.json")
    env = dict(os.environ, LMKIT_INTRA_OP_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2", **row.get("env", {}))
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = command(row, args, batch, out)
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        log(f"  {row['label']}: timed out after {args.timeout} s")
        return {"error": f"timeout after {args.timeout} s", "command": " ".join(cmd)}
    if proc.returncode != 0 or not os.path.exists(out):
        tail = (proc.stderr or proc.stdout)[-1500:]
        log(f"  {row['label']}: failed (exit {proc.returncode}):\n{tail}")
        return {"error": f"exit {proc.returncode}", "stderr_tail": tail, "command": " ".join(cmd)}
    with open(out) as f:
        result = json.load(f)
    result["launch_seconds"] = round(time.perf_counter() - start, 1)
    result["command"] = " ".join([f"{k}={v}" for k, v in row.get("env", {}).items()] +
                                 [os.path.relpath(c, REPO) if c.startswith(REPO) else c for c in cmd])
    return result


def reference(variant: str) -> str:
    """The 1-worker row a 2-worker row is compared with (the same global batch per step)."""
    return "1 worker, accum 4 over 4x batch" if variant.startswith("accum 4 over 4x batch") else "1 worker"


def summarize_rows(specs: List[Dict[str, Any]], runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    table: Dict[str, Any] = {}
    for spec in specs:
        good = [r for r in runs[spec["label"]] if "words_per_sec" in r]
        wps = [w for r in good for w in r["words_per_sec"]]
        steps = [1000 * s for r in good for s in r["step_seconds"]]
        alone = [ms for r in good for ms in r.get("collectives_alone_ms", [])]
        table[spec["label"]] = {
            "placement": spec["placement"], "backend": spec["backend"], "variant": spec["variant"],
            "workers": spec["workers"], "words_per_sec": summarize(wps), "step_ms": summarize(steps),
            "collectives_alone_ms": summarize(alone) if alone else None,
            "collectives_alone_cpu_ms": summarize([c for c in (r.get("collectives_alone_cpu_ms_per_call")
                                                               for r in good) if c is not None
                                                   and math.isfinite(c)]) if alone else None,
            "global_batch": good[-1]["global_batch"] if good else None,
            "tensorflow": "latest" if spec["python"] == LATEST else "2.18",
            "command": good[-1]["command"] if good else None,
            "errors": [r["error"] for r in runs[spec["label"]] if "error" in r],
        }
    med = {k: v["words_per_sec"].get("median") for k, v in table.items() if v["words_per_sec"].get("n")}
    half = table.get("1 worker, half batch", {}).get("step_ms", {}).get("median")
    for label, entry in table.items():
        if entry["workers"] != 2 or label not in med:
            continue
        ref = med.get(reference(entry["variant"]))
        if ref:
            entry["efficiency"] = round(med[label] / (2 * ref), 3)
            entry["speedup_vs_1_worker"] = round(med[label] / ref, 3)
        if half and entry["variant"] == "plain":
            entry["communication_ms"] = round(entry["step_ms"]["median"] - half, 2)
    for placement in {e["placement"] for e in table.values() if e["workers"] == 2}:
        for variant in {e["variant"] for e in table.values()}:
            h = med.get(f"{placement} | horovod | {variant}")
            n = med.get(f"{placement} | native | {variant}")
            if h and n:
                table[f"{placement} | native | {variant}"]["native_vs_horovod"] = round(n / h, 3)
    return table


def plot(table: Dict[str, Any], path: str) -> Optional[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    labels = [k for k, v in table.items() if v["words_per_sec"].get("n")]
    med = [table[k]["words_per_sec"]["median"] for k in labels]
    lo = [m - table[k]["words_per_sec"]["min"] for m, k in zip(med, labels)]
    hi = [table[k]["words_per_sec"]["max"] - m for m, k in zip(med, labels)]
    colors = ["0.6" if table[k]["workers"] == 1 else ("tab:blue" if table[k]["backend"] == "horovod"
                                                      else "tab:orange") for k in labels]
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(labels) + 1.5))
    ax.barh(range(len(labels)), med, xerr=[lo, hi], color=colors, capsize=2)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("words/sec (median; bars: min-max over rounds and runs)")
    ax.set_title("config_small: 1 worker, 2 on one host, 2 on two hosts (grey: 1 worker, "
                 "blue: Horovod, orange: native)", fontsize=8)
    return save_figure(fig, path)


def markdown(table: Dict[str, Any]) -> str:
    """The table as docs/performance.md shows it (medians; [min-max] over every timed run)."""
    def fmt(entry: Dict[str, Any], key: str, digits: int = 0) -> str:
        s = entry.get(key) or {}
        if not s.get("n"):
            return "-"
        return f"{s['median']:,.{digits}f} [{s['min']:,.{digits}f}-{s['max']:,.{digits}f}]"

    lines = ["| workers | backend | variant | words/sec | step (ms) | communication (ms) | collectives alone: "
             "wall / CPU (ms) | efficiency | native / Horovod |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    places = ["1 worker", *PLACEMENTS]
    variants = [*BASELINES, *VARIANTS]

    def order(item):
        label, e = item
        return (places.index(e["placement"]) if e["placement"] in places else len(places),
                label.split(" | ")[1] if e["workers"] == 2 else "",
                variants.index(e["variant"]) if e["variant"] in variants else len(variants))

    for label, e in sorted(table.items(), key=order):
        where = e["placement"] if e["workers"] == 2 else "1 worker"
        backend = label.split(" | ")[1] if e["workers"] == 2 else "-"
        variant = e["variant"] if e["workers"] == 2 else label[len("1 worker"):].lstrip(", ") or "plain"
        alone = e.get("collectives_alone_ms") or {}
        cpu = e.get("collectives_alone_cpu_ms") or {}
        lines.append(" | ".join([
            f"| {where}", backend, variant, fmt(e, "words_per_sec"), fmt(e, "step_ms", 1),
            f"{e['communication_ms']:.1f}" if "communication_ms" in e else "-",
            f"{alone['median']:.1f} / {cpu['median']:.1f}" if alone.get("n") and cpu.get("n") else "-",
            f"{e['efficiency']:.2f}" if "efficiency" in e else "-",
            f"{e['native_vs_horovod']:.2f}" if "native_vs_horovod" in e else "-"]) + " |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--report":
        with open(sys.argv[2]) as f:  # the markdown table of an earlier run
            print(markdown(json.load(f)["table"]))
        return 0
    args = parse_args(argv)
    from lmkit.config import load_config
    batch = load_config(args.config).batch_size
    specs = rows(args)
    runs: Dict[str, List[Dict[str, Any]]] = {s["label"]: [] for s in specs}

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    started = time.time()
    with tempfile.TemporaryDirectory() as workdir:
        for r in range(args.rounds):
            order = specs if r % 2 == 0 else list(reversed(specs))
            for i, spec in enumerate(order):
                log(f"[round {r + 1}/{args.rounds}, {i + 1}/{len(order)}] {spec['label']} "
                    f"(load {load_average()[0]:.2f})")
                result = launch(spec, args, batch, workdir, log)
                runs[spec["label"]].append(result)
                if "words_per_sec" in result:
                    log(f"  {statistics.median(result['words_per_sec']):,.0f} words/sec, "
                        f"step {1000 * statistics.median(result['step_seconds']):.1f} ms")
    table = summarize_rows(specs, runs)
    payload = {"command": command_line(), "config": args.config, "rounds": args.rounds,
               "steps_per_run": args.steps, "runs_per_launch": args.repeats,
               "threads_per_worker": 1, "minutes": round((time.time() - started) / 60, 1),
               "machine": machine_info(), "load_average_end": load_average(), "table": table,
               "runs": runs}
    path = write_json(args.output, payload)
    png = plot(table, os.path.splitext(args.output)[0] + ".png")
    for label, entry in table.items():
        w = entry["words_per_sec"]
        extra = "".join(f", {k} {entry[k]}" for k in ("efficiency", "native_vs_horovod", "communication_ms")
                        if k in entry)
        print(f"{label:48s} {w.get('median', float('nan')):8.0f} words/s "
              f"(min {w.get('min', float('nan')):.0f}, max {w.get('max', float('nan')):.0f}){extra}")
    print(f"wrote {path}" + (f" and {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
