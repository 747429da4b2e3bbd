#!/usr/bin/env python
"""Encoder-decoders on synthetic tasks: exact match and BLEU on held-out pairs, 1 process against 2 workers,
greedy against beam search.

For each task of ``--tasks`` (:mod:`lmkit.data.synthetic`: reverse, sort, copy) the
files are written (``--train`` training pairs of ``--min_length``-``--max_length``
symbols out of ``--symbols``; validation and test sources held out), then
``lmkit train --config CONFIG`` runs on 1 process and on 2 Horovod workers
(``mpirun -np 2``) with the same global batch, every epoch's checkpoint kept.
Each run's test split is decoded greedily and with beam search (``--beam_width``,
length penalty 0.6) by ``lmkit evaluate --json``, after each epoch of
``--eval_epochs`` and after the last. Reported per run: wall time, tokens/sec, the per-epoch train and
validation perplexity, and perplexity, BLEU and exact match of each evaluation;
per task: the 2-worker run's largest relative difference from the 1-process run
in per-epoch train perplexity.

Usage::

    python benchmarks/seq2seq.py --tasks reverse,sort --epochs 10 --out benchmarks/results/seq2seq.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import command_line, load_average, machine_info, write_json  # noqa: E402

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(cmd: List[str], env: Dict[str, str]) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=HERE)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    return res


def train(config: str, files: Dict[str, str], model_dir: str, workers: int, epochs: int, extra: List[str],
          env: Dict[str, str]) -> Dict[str, Any]:
    lmkit = [sys.executable, "-m", "lmkit"]
    launcher = (["mpirun", "-np", str(workers), "--oversubscribe", "--bind-to", "none", "-x", "PYTHONPATH",
                 "-x", "TF_CPP_MIN_LOG_LEVEL"] + lmkit) if workers > 1 else lmkit
    cmd = [*launcher, "train", "--config", config, "--model_dir", model_dir, "--num_epochs", str(epochs),
           "--source_file", files["train_src"], "--target_file", files["train_tgt"],
           "--valid_source_file", files["valid_src"], "--valid_target_file", files["valid_tgt"],
           "--set", f"keep_checkpoints={epochs}", *extra] + ([] if workers > 1 else ["--backend", "local"])
    load = load_average()
    start = time.perf_counter()
    _run(cmd, env)
    wall = time.perf_counter() - start
    with open(os.path.join(model_dir, "results.json"), encoding="utf-8") as f:
        results = json.load(f)
    epochs_ = results["epochs"]
    print(f"{os.path.basename(model_dir)}: {wall:.0f} s, valid perplexity by epoch "
          f"{[round(e['valid_perplexity'], 3) for e in epochs_]}", flush=True)
    return {"workers": workers, "wall_seconds": round(wall, 1), "load_average_before": load,
            "training_seconds": round(epochs_[-1]["cumulative_time"], 1),
            "tokens_per_sec": [round(e["tokens_per_sec"]) for e in epochs_],
            "train_perplexity": [e["train_perplexity"] for e in epochs_],
            "valid_perplexity": [e["valid_perplexity"] for e in epochs_],
            "steps_per_epoch": epochs_[0]["steps"], "command": " ".join(cmd)}


def evaluate(model_dir: str, files: Dict[str, str], checkpoint: str, strategy: str, beam_width: int,
             env: Dict[str, str]) -> Dict[str, Any]:
    cmd = [sys.executable, "-m", "lmkit", "evaluate", "--model_dir", model_dir, "--checkpoint", checkpoint,
           "--source_file", files["test_src"], "--target_file", files["test_tgt"], "--json", "--strategy", strategy,
           "--beam_width", str(beam_width)]
    start = time.perf_counter()
    report = json.loads(_run(cmd, env).stdout)
    keep = ("perplexity", "bleu", "exact_match", "pairs", "strategy", "beam_width", "length_penalty")
    return {**{k: report[k] for k in keep if k in report}, "checkpoint": os.path.basename(checkpoint),
            "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="reverse,sort")
    p.add_argument("--config", default="config_seq2seq")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--eval_epochs", default="1,2", help="evaluate after these epochs too (and after the last)")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--train", type=int, default=20000)
    p.add_argument("--test", type=int, default=500)
    p.add_argument("--symbols", type=int, default=20)
    p.add_argument("--min_length", type=int, default=3)
    p.add_argument("--max_length", type=int, default=12)
    p.add_argument("--beam_width", type=int, default=4)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="passed to lmkit train")
    p.add_argument("--out", default=os.path.join(HERE, "benchmarks", "results", "seq2seq.json"))
    args = p.parse_args()
    from lmkit.data.synthetic import write_task

    env = dict(os.environ, PYTHONPATH=HERE, TF_CPP_MIN_LOG_LEVEL="2", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    extra = [flag for kv in args.overrides for flag in ("--set", kv)]
    tasks = []
    work = tempfile.mkdtemp(prefix="lmkit-seq2seq-")
    try:
        for task in args.tasks.split(","):
            files = write_task(os.path.join(work, task), task, train=args.train, valid=args.test, test=args.test,
                               symbols=args.symbols, min_length=args.min_length, max_length=args.max_length)
            runs = []
            for workers in [int(w) for w in args.workers.split(",")]:
                model_dir = os.path.join(work, f"{task}-{workers}")
                run = train(args.config, files, model_dir, workers, args.epochs, extra, env)
                checkpoints = sorted(os.listdir(os.path.join(model_dir, "checkpoints")))  # one an epoch
                epochs = sorted({int(e) for e in args.eval_epochs.split(",")} | {args.epochs})
                run["evaluations"] = [
                    {"after_epoch": epoch, **evaluate(model_dir, files,
                                                      os.path.join(model_dir, "checkpoints", checkpoints[epoch - 1]),
                                                      strategy, args.beam_width, env)}
                    for epoch in epochs for strategy in ("greedy", "beam")]
                for e in run["evaluations"]:
                    print(f"  {task}, {workers} worker(s), after epoch {e['after_epoch']}, {e['strategy']}: exact "
                          f"{100 * e['exact_match']:.1f}%, BLEU {e['bleu']:.2f}", flush=True)
                runs.append(run)
            entry: Dict[str, Any] = {"task": task, "runs": runs}
            if len(runs) > 1:
                one, two = runs[0]["train_perplexity"], runs[1]["train_perplexity"]
                entry["two_workers_train_perplexity_max_relative_difference"] = max(
                    abs(a - b) / a for a, b in zip(one, two))
            tasks.append(entry)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    payload = {"command": command_line(), "machine": machine_info(), "config": args.config,
               "data": {"train": args.train, "valid": args.test, "test": args.test, "symbols": args.symbols,
                        "lengths": [args.min_length, args.max_length]}, "tasks": tasks}
    print(write_json(args.out, payload))


if __name__ == "__main__":
    main()
