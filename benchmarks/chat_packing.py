#!/usr/bin/env python
"""Chat fine-tuning with ``--packing`` against padding: assistant tokens per second and the loss curves.

Conversations whose median length is an eighth of the context (``--num_steps``
256, median about 32 tokens, lengths spread log-normally from 10 to the
context) train a tiny random Qwen2 (``examples/make_chats.py``'s, wider) as
``lmkit train --init_from FOLDER --train_file chats.jsonl [--packing]`` does,
with the same batch and context, one mode per process:

* ``packed``: several conversations to a row, attending within each, rows in
  lmkit's default windows (``--pack_windows``: the context, its half and its
  quarter, a shorter window's batch with as many more rows);
* ``packed_one_window``: the same with every row the whole context
  (``pack_windows = 1``): what the shorter windows gain;
* ``padded``: one a row, rows of similar lengths batched together and padded to
  the batch's longest, rounded up to a length bucket (lmkit's default);
* ``padded_same_tokens`` (with ``--equal_tokens``): padding with as many rows as
  packing's rows hold conversations, about the same tokens a step: what packing
  gains besides larger steps.

Each mode trains on about ``--tokens`` assistant tokens (as many optimizer
steps as that takes) after a warm-up (``--warmup`` steps that trace and
compile, not timed; longer when the first batch of a second shape comes later: the
step traces once more then), in ``--rounds`` rounds that run the modes one after
the other (the machine's load falls on all of them alike); the speed-ups are
medians of each round's ratio to ``padded``. Last, ``window_costs``: the
model's forward and backward pass on packed rows of each window (the same
positions a call), timed in alternation in one process: what a position
costs by window, beside the FLOPs that lmkit's packing prices it at. Reported per mode: assistant (weighted)
tokens per second, ids per second (padding left out), the step time, and the
loss per assistant token of every step (plotted against the assistant tokens
seen). Every mode trains on the same conversations, in the same order of
epochs, from the same initial weights.

Usage::

    .venv/bin/python benchmarks/chat_packing.py                 # about 4 minutes on 2 cores (5 rounds)
    .venv/bin/python benchmarks/chat_packing.py --equal_tokens  # and the third mode

Writes ``benchmarks/results/chat_packing.json`` and ``.png``.
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
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks._common import (  # noqa: E402
    REPO,
    RESULTS_DIR,
    command_line,
    load_average,
    machine_info,
    package_version,
    save_figure,
    write_json,
)

LETTERS = "abcdefghij"


def write_conversations(path: str, count: int, context: int, seed: int) -> Dict[str, float]:
    """``count`` reversal conversations whose lengths (about 2 tokens a letter, 12 of scaffolding) spread
    log-normally around an eighth of ``context``; returns their length's median and quartiles in letters."""
    import numpy as np
    rng = np.random.default_rng(seed)
    letters = np.clip(np.rint(rng.lognormal(np.log((context / 8 - 12) / 2), 0.7, count)), 1,
                      (context - 16) // 2).astype(int)
    with open(path, "w", encoding="utf-8") as f:
        for n in letters:
            question = " ".join(rng.choice(list(LETTERS), int(n)))
            f.write(json.dumps({"messages": [{"role": "user", "content": f"reverse: {question}"},
                                             {"role": "assistant", "content": question[::-1]}]}) + "\n")
    return {"median_letters": float(np.median(letters)), "quartiles": [float(q) for q in np.percentile(letters,
                                                                                                        [25, 75])]}


def worker(args: argparse.Namespace) -> Dict[str, Any]:
    """One mode's run in this process; returns its figures."""
    import numpy as np

    from lmkit import distributed as dist
    from lmkit.config import load_config
    from lmkit.hub.converters import pretrained_training_config
    from lmkit.models.build import build_run_model
    from lmkit.train import Callback, Trainer
    from lmkit.train.run_data import load_run_data

    dist.init(backend="local", intra_op_threads=args.threads or None)
    packing = args.mode in ("packed", "packed_one_window")
    batch = args.batch_size * (args.rows_factor if args.mode == "padded_same_tokens" else 1)
    overrides = {"init_from": args.folder, "data": "text", "train_file": args.chats, "packing": packing,
                 "batch_size": batch, "num_steps": args.num_steps, "max_steps": 10 ** 6,
                 "num_epochs": 0, "optimizer": "adam", "optimizer_params": {}, "learning_rate": 1e-3,
                 "warmup_epochs": 0.0, "schedule": "constant", "dropout": 0.0, "data_cache": "none",
                 "checkpoint_every_epochs": 0, "log_every_steps": 10 ** 6}
    if args.pack_windows or args.mode == "packed_one_window":
        overrides["pack_windows"] = 1 if args.mode == "packed_one_window" else args.pack_windows
    for key in ("jit_compile", "attention_blocks"):
        value = getattr(args, key)
        if value != "auto":
            overrides[key] = {"true": True, "false": False}.get(value, value if not value.isdigit() else int(value))
    config = pretrained_training_config(load_config("config_gpt2_finetune", overrides), args.folder)
    data = load_run_data(config, os.path.join(args.tmp, args.mode), log=lambda line: None)
    model = build_run_model(data.config)
    clock: List[float] = []

    class Clock(Callback):
        def on_step_end(self, info, control):
            clock.append(time.perf_counter())

    trainer = Trainer(model, data.config, record_step_losses=True, log=lambda line: None, callbacks=[Clock()])
    trainer.use_data(data.train)
    first = trainer.task.batches(data.train, 0)  # epoch 0's batches, as fit reads them
    steps = max(10, int(np.ceil(args.tokens / float(np.mean(first.weighted_tokens)))))  # about --tokens assistant
    # tokens after the warm-up. The step traces again when a batch of a new shape comes (TensorFlow's
    # reduce_retracing then relaxes the shape, and no later batch traces): the warm-up lasts until the first
    # batch whose shape differs from the first's, so that no tracing falls in the timed steps.
    shapes = [(len(first.rows.groups[i]), first.rows._length(i)) for i in range(len(first))]
    warmup = max(args.warmup, 1 + next((i for i, shape in enumerate(shapes) if shape != shapes[0]), 0))
    result = trainer.fit(data.train, max_steps=warmup + steps)
    weights: List[float] = []
    epoch = 0
    while len(weights) < len(clock):  # the global batches' weights, epoch after epoch, as fit read them
        weights.extend(trainer.task.batches(data.train, epoch).weighted_tokens.tolist())
        epoch += 1
    ids = float(first.tokens_per_step)
    seconds = clock[-1] - clock[warmup - 1]
    timed = weights[warmup:len(clock)]
    return {"mode": args.mode, "batch_size": batch, "packing": packing, "steps": steps,
            "assistant_tokens_per_sec": sum(timed) / seconds, "ids_per_sec": ids * steps / seconds,
            "step_ms": 1000 * seconds / steps, "assistant_tokens_per_step": float(np.mean(timed)),
            "losses": [float(x) for x in result.step_losses], "assistant_tokens": weights[:len(clock)],
            "warmup_steps": warmup, "seconds": [t - clock[warmup - 1] for t in clock]}  # from the warm-up's end


def window_costs(args: argparse.Namespace) -> Dict[str, Any]:
    """The model's forward and backward pass on packed rows of each window (``batch_size * num_steps`` positions
    a call, as many rows as that takes), timed in alternation in this process: the cost of a position by
    window, against what lmkit's packing prices it at (``lmkit.train.tasks.position_cost``: FLOPs)."""
    import numpy as np
    import tensorflow as tf

    from lmkit import distributed as dist
    from lmkit.config import load_config
    from lmkit.data.packing import window_lengths
    from lmkit.hub.converters import pretrained_training_config
    from lmkit.models import build_model
    from lmkit.train.tasks import position_cost

    dist.init(backend="local", intra_op_threads=args.threads or None)
    config = pretrained_training_config(load_config("config_gpt2_finetune", {
        "init_from": args.folder, "data": "text", "train_file": args.chats, "dropout": 0.0}), args.folder)
    model = build_model(config.model_config())
    vocab = config.model_config()["vocab_size"]

    @tf.function(reduce_retracing=True)
    def forward_backward(ids, positions, segments):
        with tf.GradientTape() as tape:
            logits, _ = model(ids, training=True, positions=positions, segment_ids=segments)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ids, logits=logits))
        return loss, tape.gradient(loss, model.trainable_variables)

    rng = np.random.default_rng(0)
    windows = window_lengths(args.num_steps, 3)
    positions_per_call = args.batch_size * args.num_steps
    calls = {}
    for window in windows:  # rows of examples of 16 ids
        rows = positions_per_call // window
        segments = np.repeat(np.arange(1, window // 16 + 1), 16)[None].repeat(rows, 0).astype(np.int32)
        positions = np.tile(np.arange(16), window // 16)[None].repeat(rows, 0).astype(np.int32)
        calls[window] = [tf.constant(rng.integers(0, vocab, (rows, window)).astype(np.int32)),
                         tf.constant(positions), tf.constant(segments)]
        for _ in range(3):  # trace, warm up
            forward_backward(*calls[window])
    seconds: Dict[int, List[float]] = {w: [] for w in windows}
    for _ in range(args.cost_rounds):
        for window in windows:
            start = time.perf_counter()
            for _ in range(3):
                out = forward_backward(*calls[window])
            out[0].numpy()
            seconds[window].append((time.perf_counter() - start) / 3)
    longest = windows[-1]
    us = {w: 1e6 * statistics.median(seconds[w]) / positions_per_call for w in windows}
    return {"windows": list(windows), "us_per_position": us,
            "measured_cost_vs_longest": {w: us[w] / us[longest] for w in windows},
            "flops_cost_vs_longest": {w: position_cost(model, w) / position_cost(model, longest) for w in windows},
            "rounds": args.cost_rounds, "seconds_per_call": seconds}


def _plot(results: Dict[str, Any], path: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    fig, (curves, clock, bars) = plt.subplots(1, 3, figsize=(15, 4))
    for name, run in results.items():
        label = f"{name} (batch {run['batch_size']})"
        curves.plot(np.cumsum(run["assistant_tokens"]), run["losses"], label=label, linewidth=1)
        clock.plot(run["seconds"], run["losses"], label=label, linewidth=1)
    curves.set(xlabel="assistant tokens trained on", ylabel="loss per assistant token", yscale="log",
               title="training loss by tokens")
    clock.set(xlabel="seconds after the warm-up", ylabel="loss per assistant token", yscale="log",
              title="training loss by time")
    curves.legend()
    names = list(results)
    bars.bar(names, [results[n]["assistant_tokens_per_sec_median"] for n in names],
             color=[f"C{i}" for i in range(len(names))])
    bars.set(ylabel="assistant tokens / s (median of the rounds)", title="throughput")
    bars.tick_params(axis="x", labelrotation=15)
    return save_figure(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--conversations", type=int, default=6000)
    p.add_argument("--num_steps", type=int, default=256, help="the context")
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--tokens", type=int, default=100000,
                   help="assistant tokens each mode trains on after its warm-up (timed)")
    p.add_argument("--warmup", type=int, default=8, help="steps before the timing (tracing, compiling)")
    p.add_argument("--hidden_size", type=int, default=128)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: every core)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of every mode, alternating (medians reported)")
    p.add_argument("--pack_windows", type=int, default=0, help="the packed rows' window lengths (0: lmkit's default)")
    p.add_argument("--jit_compile", default="auto", help="true | false | auto, every mode")
    p.add_argument("--attention_blocks", default="auto", help="an int or auto, every mode")
    p.add_argument("--equal_tokens", action="store_true", help="also padding with as many rows as packing holds")
    p.add_argument("--output", default=os.path.join(RESULTS_DIR, "chat_packing.json"))
    p.add_argument("--modes", default=None, help="a comma-separated subset of packed,padded (default both)")
    p.add_argument("--mode", default=None, help=argparse.SUPPRESS)  # a worker's
    p.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    p.add_argument("--chats", default=None, help=argparse.SUPPRESS)
    p.add_argument("--tmp", default=None, help=argparse.SUPPRESS)
    p.add_argument("--rows_factor", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--cost_rounds", type=int, default=15,
                   help="rounds of the window costs' alternating timing (0: not measured)")
    p.add_argument("--plot_only", action="store_true", help="redraw the plot of --output's figures, run nothing")
    args = p.parse_args()
    if args.plot_only:
        with open(args.output) as f:
            record = json.load(f)
        record["plot"] = os.path.relpath(_plot(record["runs"], args.output.replace(".json", ".png")), REPO)
        write_json(args.output, record)
        return
    if args.mode:
        print("RESULT " + json.dumps(worker(args) if args.mode != "window_costs" else window_costs(args)),
              flush=True)
        return
    from examples.make_chats import write_tiny_qwen2
    with tempfile.TemporaryDirectory() as tmp:
        chats, folder = os.path.join(tmp, "chats.jsonl"), os.path.join(tmp, "qwen2")
        lengths = write_conversations(chats, args.conversations, args.num_steps, seed=0)
        write_tiny_qwen2(folder, chats, hidden_size=args.hidden_size, max_positions=2 * args.num_steps)
        modes = (args.modes.split(",") if args.modes else ["packed", "packed_one_window", "padded"]) + (
            ["padded_same_tokens"] if args.equal_tokens else [])
        rounds: List[Dict[str, Any]] = []
        for r in range(args.rounds):  # the modes one after the other, round after round: the same load for each
            results: Dict[str, Any] = {}
            for mode in modes:
                factor = 1 if mode != "padded_same_tokens" else max(1, round(  # conversations a packed row holds
                    results["packed"]["assistant_tokens_per_step"] / results["padded"]["assistant_tokens_per_step"]))
                cmd = [sys.executable, __file__, "--mode", mode, "--folder", folder, "--chats", chats, "--tmp", tmp,
                       "--rows_factor", str(factor)] + [f"--{k}={getattr(args, k)}" for k in
                                                        ("num_steps", "batch_size", "tokens", "warmup", "threads",
                                                         "jit_compile", "attention_blocks", "pack_windows")]
                out = subprocess.run(cmd, capture_output=True, text=True, check=False)
                line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
                if out.returncode or not line:
                    raise SystemExit(f"{mode} failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}")
                results[mode] = json.loads(line[0][len("RESULT "):])
                print(f"round {r + 1}/{args.rounds} {mode}: {results[mode]['assistant_tokens_per_sec']:.0f} assistant "
                      f"tokens/s, {results[mode]['step_ms']:.0f} ms a step", flush=True)
            rounds.append(results)
        costs = None
        if args.cost_rounds:
            cmd = [sys.executable, __file__, "--mode", "window_costs", "--folder", folder, "--chats", chats,
                   "--tmp", tmp] + [f"--{k}={getattr(args, k)}" for k in ("num_steps", "batch_size", "threads",
                                                                          "cost_rounds")]
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
            if out.returncode or not line:
                raise SystemExit(f"window costs failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}")
            costs = json.loads(line[0][len("RESULT "):])
            print("a position's cost against the longest window's, measured (FLOPs): " + ", ".join(
                f"{w}: {costs['measured_cost_vs_longest'][str(w)]:.2f} ({costs['flops_cost_vs_longest'][str(w)]:.2f})"
                for w in costs["windows"]), flush=True)
    per_round = {mode: [rnd[mode]["assistant_tokens_per_sec"] for rnd in rounds] for mode in modes}
    # each mode's figures: its median round's (the plot's curves too), with every round's tokens/s beside them
    results = {}
    for mode in modes:
        median_round = sorted(range(len(rounds)), key=lambda i: per_round[mode][i])[len(rounds) // 2]
        results[mode] = {**rounds[median_round][mode], "assistant_tokens_per_sec_rounds": per_round[mode],
                         "assistant_tokens_per_sec_median": statistics.median(per_round[mode])}
    ratios = {f"{mode} / padded": [a / b for a, b in zip(per_round[mode], per_round["padded"])]
              for mode in modes if mode != "padded" and "padded" in per_round}
    speedups = {name: statistics.median(values) for name, values in ratios.items()}
    speedup = speedups.get("packed / padded")
    for name, values in ratios.items():
        print(f"{name}: median {speedups[name]:.2f}x over {len(values)} rounds "
              f"({', '.join(f'{v:.2f}' for v in values)})", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    machine = machine_info(tensorflow=package_version("tensorflow-cpu") or package_version("tensorflow"))
    record = {"command": command_line(), "machine": machine, "load_average": load_average(),
              "context": args.num_steps, "conversations": args.conversations, "lengths": lengths,
              "hidden_size": args.hidden_size, "rounds": args.rounds, "speedup": speedup, "speedups": speedups,
              "speedups_by_round": ratios, "window_costs": costs, "runs": results, "plot": None}
    write_json(args.output, record)  # the figures first: the plot needs matplotlib (make bench-deps)
    try:
        record["plot"] = os.path.relpath(_plot(results, args.output.replace(".json", ".png")), REPO)
    except ImportError as e:
        print(f"no plot: {e} (make bench-deps installs matplotlib)", flush=True)
    write_json(args.output, record)


if __name__ == "__main__":
    main()
