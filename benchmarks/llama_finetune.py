#!/usr/bin/env python
"""Fine-tuning a Llama folder on 2 workers, every weight against LoRA, with ``lmkit train`` as a user runs it.

A Llama of ``benchmarks/llama.py``'s shape (random weights, a byte-level BPE
tokenizer of 4000 ids trained on the training file, saved as transformers
saves them) is fine-tuned for one epoch of WikiText-2's validation split
(evaluated on its test split) by

    mpirun -np 2 lmkit train --init_from FOLDER --train_file valid.txt --valid_file test.txt \\
        --set batch_size=16 --set num_steps=128 --set optimizer='adam' [--lora_rank 8 ...]

twice: every weight (learning rate 3e-4) and LoRA rank 8 on every
projection (``query,key,value,output,gate,up,down``, alpha 16, learning rate
2e-3). Recorded: wall time, tokens/sec, perplexities, trained parameters,
the size of the run's checkpoint (a LoRA run's holds its adapters alone) and
each rank's peak resident memory (``psutil``, sampled every 0.2 s).

Usage::

    .venv/bin/python benchmarks/llama_finetune.py --data data/wikitext-2   # about 6 minutes (lmkit download wikitext-2)

Writes ``benchmarks/results/llama_finetune.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks._common import REPO, RESULTS_DIR, command_line, load_average, machine_info, package_version, write_json  # noqa: E402
from benchmarks.llama import SHAPE  # noqa: E402

RUNS = {
    "full": ["--set", "learning_rate=3e-4"],
    "lora": ["--set", "learning_rate=2e-3", "--lora_rank", "8", "--lora_alpha", "16",
             "--lora_targets", "query,key,value,output,gate,up,down"],
}
COMMON = ["--set", "batch_size=16", "--set", "num_steps=128", "--set", "optimizer='adam'",
          "--set", "optimizer_params={}", "--set", "warmup_epochs=0.0", "--set", "keep_prob=1.0",
          "--num_epochs", "1"]


def make_folder(folder: str, train_file: str) -> None:
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    bpe = ByteLevelBPETokenizer()
    bpe.train([train_file], vocab_size=4000, min_frequency=2, special_tokens=["<|endoftext|>"])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>",
                                        eos_token="<|endoftext|>")
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**{**SHAPE, "vocab_size": len(tokenizer)})).save_pretrained(folder)


def peak_memory(proc: subprocess.Popen, peaks: Dict[int, float], stop: threading.Event) -> None:
    """Samples the resident memory of every python process under ``proc`` (the ranks)."""
    import psutil
    root = psutil.Process(proc.pid)
    while not stop.is_set():
        try:
            for child in root.children(recursive=True):
                try:
                    if "python" in child.name():
                        peaks[child.pid] = max(peaks.get(child.pid, 0.0), child.memory_info().rss / 2 ** 20)
                except psutil.Error:
                    pass
        except psutil.Error:
            return
        stop.wait(0.2)


def checkpoint_mib(model_dir: str) -> float:
    root = os.path.join(model_dir, "checkpoints")
    latest = sorted(d for d in os.listdir(root) if d.startswith("ckpt-"))[-1]
    folder = os.path.join(root, latest)
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)) / 2 ** 20


def run(name: str, folder: str, data: str, work: str, log) -> Dict[str, Any]:
    model_dir = os.path.join(work, name)
    mpirun = shutil.which("mpirun") or "mpirun"
    forward = ["-x", "PYTHONPATH"] if os.environ.get("PYTHONPATH") else []
    cmd = [mpirun, "-np", "2", "--oversubscribe", "--bind-to", "none", "-x", "TF_CPP_MIN_LOG_LEVEL", *forward,
           sys.executable, "-m", "lmkit", "train", "--init_from", folder,
           "--train_file", os.path.join(data, "valid.txt"), "--valid_file", os.path.join(data, "test.txt"),
           "--model_dir", model_dir, "--data_cache", "none", *COMMON, *RUNS[name]]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    log(f"[{name}] {' '.join(cmd[cmd.index('train'):])}")
    peaks: Dict[int, float] = {}
    stop = threading.Event()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = threading.Thread(target=peak_memory, args=(proc, peaks, stop), daemon=True)
    sampler.start()
    output, _ = proc.communicate()
    stop.set()
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: exit {proc.returncode}:\n{output[-3000:]}")
    with open(os.path.join(model_dir, "results.json"), encoding="utf-8") as f:
        results = json.load(f)
    epoch = results["epochs"][-1]
    lora_line = next((line for line in output.splitlines() if line.startswith("LoRA:")), None)
    out = {"command": " ".join(["mpirun -np 2 lmkit train", *cmd[cmd.index("--init_from"):]]).replace(work, "RUN"),
           "wall_seconds": round(wall, 1), "tokens_per_sec": round(epoch["tokens_per_sec"], 1),
           "steps": results["global_step"], "train_perplexity": round(epoch["train_perplexity"], 2),
           "valid_perplexity": round(epoch["valid_perplexity"], 2),
           "checkpoint_mib": round(checkpoint_mib(model_dir), 2),
           "peak_rss_mib_per_rank": sorted(round(v, 1) for v in peaks.values())[-2:],
           "lora": lora_line}
    log(f"[{name}] {json.dumps(out)}")
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.path.join(REPO, "data", "wikitext-2"),
                   help="a folder with valid.txt and test.txt (WikiText-2: lmkit download wikitext-2)")
    p.add_argument("--output", default=os.path.join(RESULTS_DIR, "llama_finetune.json"))
    args = p.parse_args(argv)
    log = lambda s: print(s, flush=True)  # noqa: E731
    results: Dict[str, Any] = {"benchmark": "llama_finetune", "command": command_line(),
                               "machine": machine_info(tensorflow=package_version("tensorflow-cpu")),
                               "shape": SHAPE, "common_flags": COMMON, "runs": {}}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        folder = os.path.join(work, "llama")
        make_folder(folder, os.path.join(args.data, "valid.txt"))
        for name in RUNS:
            results["runs"][name] = run(name, folder, args.data, work, log)
    full, lora = results["runs"]["full"], results["runs"]["lora"]
    results["lora_vs_full"] = {
        "tokens_per_sec": round(lora["tokens_per_sec"] / full["tokens_per_sec"], 3),
        "checkpoint_size": round(lora["checkpoint_mib"] / full["checkpoint_mib"], 4),
        "peak_rss": round(max(lora["peak_rss_mib_per_rank"]) / max(full["peak_rss_mib_per_rank"]), 3)}
    results["load_average_at_end"] = load_average()
    results["wall_seconds"] = round(time.perf_counter() - started, 1)
    log(f"lora/full: {results['lora_vs_full']}")
    log(f"wrote {write_json(args.output, results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
