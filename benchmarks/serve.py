"""lmkit serve under concurrent streaming clients: aggregate tokens/s and time to first token.

    .venv/bin/python benchmarks/serve.py                       # both models, 1/4/16/64 clients
    .venv/bin/python benchmarks/serve.py --models tiny --clients 1 16

For each model a server (``lmkit serve``, a subprocess on a free port, 16
slots, a queue of 64) answers N clients at once, each streaming one greedy
completion of ``--tokens`` new tokens from its own prompt; the figures are
the generated tokens of all clients (their ``usage``) over the wall time from
the first request to the last ``[DONE]``, and the p50/p95 time from a request
to its first streamed text, of the median of ``--repeats`` rounds (the rounds
go over every client count in turn, so a change in the machine's load falls on
all of them). Models: ``tiny`` (config_tiny_transformer, trained 20 steps on
generated text) and ``gpt2`` (GPT-2's shape, 124M parameters with random
weights, a 300-token tokenizer, served with --context 256). Writes
``benchmarks/results/serve.json`` (with the command, the machine and its load)
and ``serve.png``. It also times, in process, what a join costs the running
requests: a decode step of 16 busy slots against one 64-token prefill chunk, and
one call that feeds 16 short prompts against one that feeds one.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks._common import command_line, load_average, machine_info, write_json  # noqa: E402

WORDS = "the cat sat on a mat dog ran fast blue sky and to of in".split()


def tiny_folder(work: str) -> str:
    rng = random.Random(0)
    train = os.path.join(work, "train.txt")
    with open(train, "w", encoding="utf-8") as f:
        f.write("\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(800)) + "\n")
    model_dir = os.path.join(work, "tiny")
    subprocess.run([sys.executable, "-m", "lmkit", "train", "--config", "config_tiny_transformer", "--train_file",
                    train, "--valid_file", train, "--test_file", train, "--tokenizer", "char", "--model_dir",
                    model_dir, "--max_steps", "20", "--set", "warmup_steps=2"], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": ROOT})
    return model_dir


def gpt2_folder(work: str) -> str:
    """GPT-2's shape with random weights (transformers writes the folder lmkit reads)."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast
    folder = os.path.join(work, "gpt2")
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(200)]
    bpe = ByteLevelBPETokenizer()
    # No end token (no <|endoftext|>, no eos_token_id) the random model could pick: every client gets its --tokens.
    bpe.train_from_iterator(lines, vocab_size=300, min_frequency=1, special_tokens=["<|pad|>"])
    GPT2TokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<|pad|>", eos_token="<|pad|>",
                      unk_token="<|pad|>").save_pretrained(folder)
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(bos_token_id=None, eos_token_id=None)).save_pretrained(folder)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model_dir: str, flags: List[str]) -> Any:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "lmkit", "serve", "--model_dir", model_dir, "--port", str(port),
                             "--max_batch", "16", "--max_queue", "64", *flags], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.DEVNULL)
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc, port
        except OSError:
            time.sleep(1)
    raise RuntimeError("the server did not start")


def client(port: int, k: int, tokens: int) -> Dict[str, Any]:
    """One streaming completion: its status, tokens and time to first token."""
    body = {"prompt": " ".join(WORDS[(k + i) % len(WORDS)] for i in range(3)), "max_tokens": tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        return {"status": response.status, "tokens": 0, "ttft": None}
    first, count = None, 0
    for line in response:
        if line.startswith(b"data: {"):
            event = json.loads(line[6:])
            if event.get("usage"):  # the tokens generated (a random model's bytes may hold text back)
                count = event["usage"]["completion_tokens"]
            elif first is None:
                first = time.perf_counter() - started
    return {"status": 200, "tokens": count, "ttft": first}


def measure(port: int, clients: int, tokens: int) -> Dict[str, Any]:
    client(port, 0, 4)  # warm
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=clients) as pool:
        results = list(pool.map(lambda k: client(port, k, tokens), range(clients)))
    wall = time.perf_counter() - started
    ttfts = sorted(r["ttft"] for r in results if r["ttft"] is not None)
    pick = (lambda q: ttfts[min(len(ttfts) - 1, int(q * len(ttfts)))]) if ttfts else (lambda q: None)
    return {"clients": clients, "tokens_per_s": sum(r["tokens"] for r in results) / wall, "wall_s": wall,
            "ttft_p50_s": pick(0.5), "ttft_p95_s": pick(0.95), "answered": sum(r["status"] == 200 for r in results),
            "refused_429": sum(r["status"] == 429 for r in results),
            "lost": sum(r["status"] not in (200, 429) for r in results)}


def median_row(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The run of median tokens/s among ``runs`` of one client count, with every run's tokens/s."""
    ranked = sorted(runs, key=lambda r: r["tokens_per_s"])
    row = dict(ranked[len(ranked) // 2])
    row["tokens_per_s_runs"] = [r["tokens_per_s"] for r in runs]
    return row


def join_cost(folder: str, context: int) -> Dict[str, float]:
    """What a join costs the running requests: a decode step of 16 busy slots, and one prefill chunk of 64
    tokens (which runs between two such steps), in milliseconds (medians of 10)."""
    import numpy as np

    from lmkit.serve.server import ServeOptions, Server
    server = Server(folder, ServeOptions(max_batch=16, context=context))
    server.warm_up()
    slots = server.slots
    for slot in range(16):
        slots.prefill(slot, [0] * 8, 0)
    tokens, active = np.zeros(16, np.int32), np.ones(16, bool)

    def median_ms(call: Any) -> float:
        times = []
        for _ in range(10):
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
        return 1e3 * float(np.median(times))

    step = median_ms(lambda: slots.step(tokens, active))
    chunk = median_ms(lambda: slots.prefill(15, [0] * 64, 0)[1])
    one = median_ms(lambda: slots.prefill(15, [0] * 8, 0)[1])
    together = median_ms(lambda: slots.prefill_many([(slot, [0] * 8, 0) for slot in range(16)])[0][1])
    return {"step_ms_16_slots": step, "prefill_chunk_64_ms": chunk, "step_with_a_join_x": (step + chunk) / step,
            "prefill_1_prompt_of_8_ms": one, "prefill_16_prompts_of_8_in_one_call_ms": together}


def plot(results: Dict[str, Any], path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib (make bench-deps): no PNG")
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, rows in results.items():
        xs = [r["clients"] for r in rows]
        axes[0].plot(xs, [r["tokens_per_s"] for r in rows], marker="o", label=name)
        axes[1].plot(xs, [r["ttft_p50_s"] for r in rows], marker="o", label=f"{name} p50")
        axes[1].plot(xs, [r["ttft_p95_s"] for r in rows], marker="x", linestyle="--", label=f"{name} p95")
    for ax, label in zip(axes, ("generated tokens/s (all clients)", "time to first token (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streaming clients")
        ax.set_ylabel(label)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["tiny", "gpt2"], choices=["tiny", "gpt2"])
    p.add_argument("--clients", nargs="+", type=int, default=[1, 4, 16, 64])
    p.add_argument("--tokens", type=int, default=32, help="new tokens per client")
    p.add_argument("--repeats", type=int, default=5,
                   help="rounds over the client counts; each count reports its median round")
    p.add_argument("--output", default=os.path.join(ROOT, "benchmarks", "results", "serve.json"))
    p.add_argument("--plot_only", action="store_true", help="draw the PNG of --output's JSON (needs matplotlib)")
    args = p.parse_args()
    if args.plot_only:
        with open(args.output, encoding="utf-8") as f:
            plot(json.load(f)["results"], os.path.splitext(args.output)[0] + ".png")
        return
    results: Dict[str, Any] = {}
    joins: Dict[str, Any] = {}
    load_before = load_average()
    with tempfile.TemporaryDirectory() as work:
        for name in args.models:
            folder = tiny_folder(work) if name == "tiny" else gpt2_folder(work)
            proc, port = start(folder, [] if name == "tiny" else ["--context", "256"])
            try:
                rounds = [[measure(port, n, args.tokens) for n in args.clients] for _ in range(args.repeats)]
                results[name] = [median_row([r[i] for r in rounds]) for i in range(len(args.clients))]
                for row in results[name]:
                    print(name, json.dumps(row), flush=True)
            finally:
                proc.terminate()
                proc.wait(timeout=120)
            joins[name] = join_cost(folder, 64 if name == "tiny" else 256)
            print(name, "join", json.dumps(joins[name]), flush=True)
    speedup = {name: {f"{r['clients']}_vs_1": r["tokens_per_s"] / rows[0]["tokens_per_s"] for r in rows}
               for name, rows in results.items() if rows and rows[0]["clients"] == 1}
    payload = {"command": command_line(), "machine": machine_info(), "load_average_before": load_before,
               "load_average_after": load_average(), "tokens_per_client": args.tokens,
               "state": {"tiny": "4 layers x 2 x [16 slots, 4 heads, 64 positions, 32] float32 = 2.1 MB",
                         "gpt2": "12 layers x 2 x [16 slots, 12 heads, 256 positions, 64] float32 = 151 MB"},
               "results": results, "speedup": speedup, "join_cost": joins}
    write_json(args.output, payload)
    plot(results, os.path.splitext(args.output)[0] + ".png")
    print(json.dumps(speedup, indent=1))


if __name__ == "__main__":
    main()
