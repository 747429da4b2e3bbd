#!/usr/bin/env python
"""Fixed shuffled windows against random-offset windows: validation perplexity on real text.

``lmkit train --config config_tiny_transformer --tokenizer char`` (a 0.8M
parameter character GPT) on WikiText-2's validation split, evaluated on its
test split, for ``--epochs`` epochs, once with ``--sampling windows`` (every
token once an epoch) and once with ``--sampling random`` (windows at random
offsets, as many an epoch), for each seed of ``--seeds``. Both see the same
number of tokens. Reported: each run's validation perplexity per epoch and,
per seed, the ratio random / windows of the last epoch's (below 1: random
offsets do better).

Usage::

    python benchmarks/sampling.py --epochs 3 --seeds 1,2 --out benchmarks/results/sampling.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import command_line, load_average, machine_info, median_ratio, write_json  # noqa: E402

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(HERE, "data", "wikitext-2")  # lmkit download wikitext-2


def run(sampling: str, seed: int, epochs: int, work: str, data: str) -> Dict[str, Any]:
    model_dir = os.path.join(work, f"{sampling}-{seed}")
    cmd = [sys.executable, "-m", "lmkit", "train", "--config", "config_tiny_transformer", "--tokenizer", "char",
           "--train_file", os.path.join(data, "valid.txt"), "--valid_file", os.path.join(data, "test.txt"),
           "--sampling", sampling, "--seed", str(seed), "--num_epochs", str(epochs), "--model_dir", model_dir,
           "--data_cache", os.path.join(work, "cache")]
    load = load_average()
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    with open(os.path.join(model_dir, "results.json"), encoding="utf-8") as f:
        results = json.load(f)
    valid = [e["valid_perplexity"] for e in results["epochs"]]
    print(f"{sampling} seed {seed}: valid perplexity by epoch {[round(v, 3) for v in valid]}", flush=True)
    return {"sampling": sampling, "seed": seed, "valid_perplexity": valid,
            "train_perplexity": [e["train_perplexity"] for e in results["epochs"]],
            "steps_per_epoch": results["epochs"][0]["steps"], "load_average_before": load}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--data", default=DATA, help="a folder with valid.txt and test.txt")
    p.add_argument("--out", default=os.path.join(HERE, "benchmarks", "results", "sampling.json"))
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="lmkit-sampling-") as work:
        for seed in seeds:  # the two settings alternate, so load from other jobs hits both alike
            for sampling in ("windows", "random"):
                rows.append(run(sampling, seed, args.epochs, work, args.data))
    last = {(r["sampling"], r["seed"]): r["valid_perplexity"][-1] for r in rows}
    payload = {"command": command_line(), "machine": machine_info(), "runs": rows,
               "random_over_windows_last_valid_perplexity": {
                   str(s): round(last[("random", s)] / last[("windows", s)], 4) for s in seeds},
               "median_ratio": round(median_ratio([last[("random", s)] for s in seeds],
                                                  [last[("windows", s)] for s in seeds]), 4)}
    print(write_json(args.out, payload))


if __name__ == "__main__":
    main()
