#!/usr/bin/env python
"""The composed example against ``lmkit train``: the same config, data and seed, the same perplexities.

Runs ``examples/lm_ptb_distributed.py`` and ``lmkit train`` one after the
other under ``mpirun -np N`` (default 2; each with a timeout) on PTB (one
epoch of config_small by default), or ``examples/lm_text.py`` against
``lmkit train --train_file`` with ``--text``, and compares what each wrote
into its ``results.json``: the training and validation perplexity of every
epoch and the test perplexity. On CPUs the two do the same float32
operations in the same order (tests/examples checks it to 1e-5); the result
says whether they agree within ``--tolerance`` (default 1 %).

Usage::

    .venv/bin/python benchmarks/example_vs_train.py --data_path data/ptb          # ~2 x 5 min on 2 cores
    .venv/bin/python benchmarks/example_vs_train.py --text --config config_tiny_transformer \\
        --train_file input.txt --valid_file valid.txt --set tokenizer="'char'" \\
        --output benchmarks/results/example_vs_train_text.json

Writes ``benchmarks/results/example_vs_train_ptb.json`` (with the command that made it).
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
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import REPO, RESULTS_DIR, command_line, machine_info, package_version, write_json  # noqa: E402

KEYS = ("train_perplexity", "valid_perplexity")


def _environment() -> Dict[str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if os.geteuid() == 0:  # Open MPI refuses root without both
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def launch(np_: int, args: List[str]) -> List[str]:
    """``mpirun -np N python ARGS`` (one process: no mpirun), idle ranks yielding their core."""
    if np_ == 1:
        return [sys.executable, *args]
    return ["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1",
            "-x", "TF_CPP_MIN_LOG_LEVEL", "-x", "PYTHONPATH", sys.executable, *args]


def run_one(name: str, cmd: List[str], model_dir: str, timeout: float) -> Dict[str, Any]:
    """Runs one training command; returns its results.json with the wall time and the command."""
    print(f"[{name}] {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=_environment(), timeout=timeout, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"[{name}] exit status {proc.returncode}:\n{proc.stdout[-5000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("Epoch", "Test"))]
    print("\n".join(f"[{name}] {line}" for line in lines), flush=True)
    with open(os.path.join(model_dir, "results.json")) as f:
        results = json.load(f)
    return {"command": " ".join(cmd), "wall_seconds": round(seconds, 1), "log": lines,
            "epochs": [{k: e.get(k) for k in ("epoch", "learning_rate", *KEYS)} for e in results["epochs"]],
            "test_perplexity": results.get("test_perplexity")}


def relative(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None else abs(a - b) / abs(b)


def compare(example: Dict[str, Any], cli: Dict[str, Any], tolerance: float) -> Dict[str, Any]:
    """Relative differences (example vs lmkit train) per epoch and key, the largest, and the verdict."""
    rows = [{k: relative(e.get(k), c.get(k)) for k in KEYS} | {"epoch": e["epoch"]}
            for e, c in zip(example["epochs"], cli["epochs"])]
    test = relative(example.get("test_perplexity"), cli.get("test_perplexity"))
    worst = max([v for row in rows for k, v in row.items() if k != "epoch" and v is not None]
                + ([test] if test is not None else []))
    return {"per_epoch": rows, "test_perplexity": test, "largest": worst, "tolerance": tolerance,
            "within_tolerance": worst <= tolerance and len(example["epochs"]) == len(cli["epochs"])}


def commands(args: argparse.Namespace, example_dir: str, cli_dir: str) -> Dict[str, List[str]]:
    """The example's and lmkit train's flags: the same config, data and overrides."""
    shared = ["--config", args.config, "--num_epochs", str(args.num_epochs)]
    for item in args.set:
        shared += ["--set", item]
    if args.text:
        files = ["--train_file", args.train_file] + (["--valid_file", args.valid_file] if args.valid_file else [])
        example = [os.path.join(REPO, "examples", "lm_text.py"), *shared, *files]
        cli = ["-m", "lmkit", "train", *shared, *files]
    else:
        data = ["--data_path", args.data_path] + (["--data_url", args.data_url] if args.data_url else [])
        example = [os.path.join(REPO, "examples", "lm_ptb_distributed.py"), *shared, *data]
        cli = ["-m", "lmkit", "train", *shared, *data]
    return {"example": example + ["--model_dir", example_dir], "lmkit train": cli + ["--model_dir", cli_dir]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="config_small")
    p.add_argument("--num_epochs", type=int, default=1)
    p.add_argument("--np", type=int, default=2, help="processes (mpirun -np)")
    p.add_argument("--data_path", default="data/ptb", help="PTB's folder (downloaded there when missing)")
    p.add_argument("--data_url", default=None)
    p.add_argument("--text", action="store_true", help="examples/lm_text.py on --train_file instead of PTB")
    p.add_argument("--train_file", default=None)
    p.add_argument("--valid_file", default=None)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override, for both")
    p.add_argument("--tolerance", type=float, default=0.01, help="largest relative difference allowed")
    p.add_argument("--timeout", type=float, default=3600, help="seconds for each run")
    p.add_argument("--note", default=None, help="what the data is, for the result (e.g. a stand-in for PTB)")
    p.add_argument("--output", default=os.path.join(RESULTS_DIR, "example_vs_train_ptb.json"))
    args = p.parse_args()
    if args.text and not args.train_file:
        p.error("--text needs --train_file")
    with tempfile.TemporaryDirectory(prefix="lmkit-example-vs-train-") as tmp:
        dirs = {"example": os.path.join(tmp, "example"), "lmkit train": os.path.join(tmp, "cli")}
        cmds = commands(args, dirs["example"], dirs["lmkit train"])
        runs = {name: run_one(name, launch(args.np, cmd), dirs[name], args.timeout) for name, cmd in cmds.items()}
        shutil.rmtree(tmp, ignore_errors=True)
    verdict = compare(runs["example"], runs["lmkit train"], args.tolerance)
    payload = {"command": command_line(), "config": args.config, "num_epochs": args.num_epochs, "np": args.np,
               "data": args.train_file if args.text else os.path.abspath(args.data_path), "runs": runs,
               "comparison": verdict, **({"note": args.note} if args.note else {}),
               "machine": machine_info(tensorflow=package_version("tensorflow"), horovod=package_version("horovod"))}
    print(f"largest relative difference {verdict['largest']:.3g} (tolerance {args.tolerance:g}): "
          f"{'within' if verdict['within_tolerance'] else 'OUTSIDE'}; {write_json(args.output, payload)}")


if __name__ == "__main__":
    main()
