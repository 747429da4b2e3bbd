#!/usr/bin/env python
"""lmkit and nanoGPT on nanoGPT's own CPU recipe, the same text and the same ids, side by side.

nanoGPT's README trains a "baby GPT" on a CPU: ``config/train_shakespeare_char.py``
with ``--device=cpu --compile=False --eval_iters=20 --log_interval=1
--block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128
--max_iters=2000 --lr_decay_iters=2000 --dropout=0.0`` (AdamW 0.9/0.99, weight
decay 0.1, clipping at 1.0, 100 warmup steps, cosine from 1e-3 to 1e-4).
lmkit's ``config_tiny_transformer`` is that recipe. This script runs both:

* one id stream: the text (``--text``, the plays corpus nanoGPT's
  ``data/shakespeare_char`` downloads) in nanoGPT's character scheme (the
  sorted set of its characters, the first 90% to train on, the rest to
  validate), written as nanoGPT's ``train.bin``, ``val.bin`` and ``meta.pkl``
  into a folder of a temporary directory; nanoGPT reads it through its
  ``dataset=`` setting (an absolute path), lmkit reads the same two files;
* nanoGPT: its ``train.py`` from the checkout the user gives (``--nanogpt``;
  nothing is written into it, its code is not copied here), as a subprocess,
  with the README's command plus ``--dataset``, ``--out_dir``,
  ``--eval_interval=<steps>`` and ``--always_save_checkpoint=True`` (one
  checkpoint at the last step, no evaluation in between); the seed goes
  through a small launcher that offsets ``torch.manual_seed`` (train.py always
  seeds 1337: seed 1 is nanoGPT's own run);
* lmkit: ``config_tiny_transformer`` through the public API
  (:class:`lmkit.train.Trainer`) in a process of its own, ``--set`` overrides on top;
* for each seed of ``--seeds`` a round of both, the order alternating from
  round to round (lmkit first in odd rounds), one run at a time, with the same
  threads (``--threads``: ``OMP_NUM_THREADS`` and torch's pools for nanoGPT,
  lmkit's ``intra_op_threads``).

Reported, per run and as medians over the seeds (with min and max):

* ``val_loss``: nats per character of the last step's model on the SAME
  windows, every non-overlapping window of ``block_size + 1`` characters of the
  validation ids: nanoGPT's checkpoint through the ``GPT`` class of the user's
  checkout, lmkit's model through :class:`lmkit.train.evaluation.Evaluator`
  (one row: exactly those windows);
* ``steps_per_sec``: the training loop from the end of the first step to the
  end of the last (the first step, with its start-up and lmkit's compilation,
  and every evaluation left out), for nanoGPT from the per-iteration times it
  logs, for lmkit from the time of the line it logs when the first step has
  compiled to the time of its last step line; ``interval_steps_per_sec``: the
  median over intervals of ``--interval`` steps, which a burst of load on a
  shared machine moves less;
* ``wall_to_trained``: from the process's launch to the end of its last
  step (start-up, data, compilation and nanoGPT's first evaluation of
  ``eval_iters`` batches included).

First (``--equivalence_steps``, 100 by default), one process takes both
steps from nanoGPT's initial weights on the same batches at the same
learning rates (``equivalence``: the largest loss and weight differences);
``--equivalence_only --equivalence_steps 2000`` runs the whole recipe so and
adds both models' validation losses at the end: what is left between them
is arithmetic, not the recipe.

Ratios lmkit / nanoGPT are per round and of the medians. The load average is
recorded before every run. ``--steps 200 --seeds 1`` is a quick check
(a few minutes); the default (2000 steps, seeds 1-3) takes about 20 minutes
on 2 cores. Writes ``benchmarks/results/nanogpt_side_by_side.json`` and a
``.png`` of the training-loss curves::

    git clone https://github.com/karpathy/nanoGPT ~/nanoGPT
    curl -o input.txt https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt
    .venv/bin/python benchmarks/nanogpt_side_by_side.py --nanogpt ~/nanoGPT --text input.txt

``--ablate`` trains lmkit alone: the config, then the config with one of
nanoGPT's settings put back as lmkit had it before issue 49 (each of
:data:`ABLATIONS`; the last puts back all of them), each run's validation
loss beside the config's of the same seed; which settings close the gap::

    .venv/bin/python benchmarks/nanogpt_side_by_side.py --text input.txt --ablate --seeds 1 \
        --output benchmarks/results/nanogpt_ablation.json
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks._common import (  # noqa: E402
    REPO,
    RESULTS_DIR,
    command_line,
    load_average,
    machine_info,
    package_version,
    parse_overrides,
    ratio_spread,
    save_figure,
    summarize,
    write_json,
)

CONFIG = "config_tiny_transformer"
# --ablate: the config with one of nanoGPT's settings put back as lmkit had it before issue 49 (and all of them).
_OLD_PLAN = {"num_epochs": 10, "warmup_steps": 0, "warmup_epochs": 0.1, "min_lr": 0.0,
             "schedule_params": {"warmup_start_factor": 0.0}}  # 10 epochs' cosine, stopped after --steps
ABLATIONS: Dict[str, Dict[str, Any]] = {
    "uniform(-0.02, 0.02) initialisation": {"model.initialization": "uniform"},
    "the loss summed over the window": {"loss_reduction": "sum"},
    "weight decay on every variable": {"optimizer_params": {"beta1": 0.9, "beta2": 0.99, "epsilon": 1e-8,
                                                            "weight_decay": 0.1}},
    "biases and layer-norm offsets": {"model.use_bias": True, "model.output_bias": True},
    "GELU's tanh approximation": {"model.activation": "gelu"},
    "fixed shuffled windows": {"sampling": "windows"},
    "the plan in epochs (10, cosine over them)": _OLD_PLAN,
}
ABLATIONS["all of them (config_tiny_transformer before issue 49)"] = {
    key: value for variant in ABLATIONS.values() for key, value in variant.items()}
# nanoGPT's README command for a CPU (its "baby GPT" on shakespeare_char), the steps left to --steps.
NANOGPT_FLAGS = ["--device=cpu", "--compile=False", "--eval_iters=20", "--log_interval=1", "--block_size=64",
                 "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128", "--dropout=0.0"]
BLOCK = 64  # the window, both sides
ITER_LINE = re.compile(r"^iter (\d+): loss ([0-9.]+), time ([0-9.]+)ms")
STEP_LINE = re.compile(r"^step (\d+)/(\d+) \| loss ([0-9.]+) ")
# Runs train.py with the seed offset: train.py seeds torch with 1337 (+ the DDP rank) and has no seed setting.
LAUNCHER = """import runpy, sys, torch
seed = int(sys.argv[1])
sys.argv = ["train.py"] + sys.argv[2:]
sys.path.insert(0, ".")
_manual_seed = torch.manual_seed
torch.manual_seed = lambda value: _manual_seed(value + seed - 1)  # seed 1: nanoGPT's own 1337
runpy.run_path("train.py", run_name="__main__")
"""


# ------------------------------------------------------------------------------------------------ the ids
def write_ids(text_path: str, folder: str) -> Dict[str, Any]:
    """nanoGPT's character scheme (``data/shakespeare_char/prepare.py``): ``train.bin``, ``val.bin``, ``meta.pkl``.

    Returns:
      The sizes: characters, vocabulary, train and validation ids.
    """
    import numpy as np

    with open(text_path, encoding="utf-8") as f:
        text = f.read()
    chars = sorted(set(text))
    if len(chars) > 2 ** 16:
        sys.exit(f"--text {text_path} has {len(chars)} distinct characters; nanoGPT's uint16 ids hold 65536")
    stoi = {c: i for i, c in enumerate(chars)}
    split = int(len(text) * 0.9)
    os.makedirs(folder, exist_ok=True)
    for name, part in (("train.bin", text[:split]), ("val.bin", text[split:])):
        np.array([stoi[c] for c in part], dtype=np.uint16).tofile(os.path.join(folder, name))
    with open(os.path.join(folder, "meta.pkl"), "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)
    return {"characters": len(text), "vocab_size": len(chars), "train_ids": split, "val_ids": len(text) - split}


def read_ids(folder: str, name: str) -> Any:
    import numpy as np
    return np.fromfile(os.path.join(folder, name), dtype=np.uint16).astype(np.int32)


def eval_windows(val: Any) -> Any:
    """Every non-overlapping window of ``BLOCK + 1`` ids of ``val``: [windows, BLOCK + 1]."""
    import numpy as np
    count = (len(val) - 1) // BLOCK
    return np.stack([val[k * BLOCK:k * BLOCK + BLOCK + 1] for k in range(count)])


# ------------------------------------------------------------------------------------------------ workers
def lmkit_worker(args: argparse.Namespace) -> Dict[str, Any]:
    """Trains ``config_tiny_transformer`` on the ids (in this process), evaluates it; the run's record."""
    from lmkit import distributed as dist

    dist.init("local", intra_op_threads=args.threads)  # before any TensorFlow op
    import tensorflow as tf

    from lmkit.config import load_config
    from lmkit.models import build_model
    from lmkit.train import Trainer
    from lmkit.train.evaluation import Evaluator

    user = parse_overrides(args.set or [])
    # The config's plan in steps, of --steps; or a plan in epochs that --set states (its schedule over its
    # epochs, as before issue 49), stopped after --steps steps.
    in_epochs = bool(user.get("num_epochs"))
    overrides = {"seed": args.seed, "max_steps": 0 if in_epochs else args.steps, "log_every_steps": args.interval,
                 **user}
    config = load_config(CONFIG, overrides)
    train, val = read_ids(args.data, "train.bin"), read_ids(args.data, "val.bin")
    lines: List[Tuple[float, str]] = []

    def log(text: str) -> None:  # the time each line is logged: a step line follows its step's loss read-back
        lines.append((time.time(), text))
        print(text, flush=True)

    tf.random.set_seed(config.run.seed)
    model = build_model(config.model_config())
    Trainer(model, config, log=log).fit(train, max_steps=args.steps if in_epochs else None)
    trained = time.time()
    val_loss = Evaluator(model, BLOCK, 1).mean_loss(val)  # one row: every non-overlapping window, in order
    compiled = next(t for t, line in lines if line.startswith("compiled the training step"))
    steps = [(int(m.group(1)), t, float(m.group(3))) for t, line in lines for m in [STEP_LINE.match(line)] if m]
    marks = [(s, t) for s, t, _ in steps] or [(args.steps, trained)]  # a plan in epochs logs no step lines
    return {"val_loss": val_loss, "trained_at": trained, "first_step_done_at": compiled,
            "marks": marks, "train_loss": [(s, loss) for s, _, loss in steps],
            "config": {"name": CONFIG, "overrides": overrides}}


def nanogpt_eval_worker(args: argparse.Namespace) -> Dict[str, Any]:
    """The validation loss of nanoGPT's checkpoint on :func:`eval_windows`, through the checkout's ``GPT``."""
    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, args.nanogpt)
    from model import GPT, GPTConfig  # the user's checkout

    checkpoint = torch.load(os.path.join(args.out_dir, "ckpt.pt"), map_location="cpu")
    model = GPT(GPTConfig(**checkpoint["model_args"]))
    prefix = "_orig_mod."  # what torch.compile adds to the names
    model.load_state_dict({k[len(prefix):] if k.startswith(prefix) else k: v for k, v in checkpoint["model"].items()})
    return {"val_loss": _nanogpt_val_loss(model, args.data), "iter_num": int(checkpoint["iter_num"])}


def _nanogpt_val_loss(model: Any, data: str) -> float:
    """nanoGPT's model's mean loss on :func:`eval_windows` of the validation ids."""
    import torch

    model.eval()
    windows = torch.from_numpy(eval_windows(read_ids(data, "val.bin")).astype("int64"))
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(windows), 128):
            batch = windows[start:start + 128]
            _, loss = model(batch[:, :-1].contiguous(), batch[:, 1:].contiguous())  # mean over the batch's tokens
            total += float(loss) * len(batch)
    model.train()
    return total / len(windows)


def _copy_nanogpt_weights(state: Dict[str, Any], model: Any) -> None:
    """nanoGPT's ``bias=False`` weights (``GPT.state_dict()``, [out, in] kernels) into lmkit's transformer."""
    model.embedder.embeddings.assign(state["transformer.wte.weight"])  # tied with lm_head in both
    model.position_embedder.embeddings.assign(state["transformer.wpe.weight"])
    for i, layer in enumerate(model.decoder.layers):
        block = f"transformer.h.{i}."
        pairs = ((layer.attention_norm.scale, "ln_1.weight"), (layer.attention.qkv.kernel, "attn.c_attn.weight"),
                 (layer.attention.output.kernel, "attn.c_proj.weight"), (layer.ffn_norm.scale, "ln_2.weight"),
                 (layer.ffn_inner.kernel, "mlp.c_fc.weight"), (layer.ffn_outer.kernel, "mlp.c_proj.weight"))
        for variable, name in pairs:
            value = state[block + name]
            variable.assign(value.T if value.ndim == 2 else value)  # torch's Linear keeps [out, in]
    model.decoder.final_norm.scale.assign(state["transformer.ln_f.weight"])


def equivalence_worker(args: argparse.Namespace) -> Dict[str, Any]:
    """nanoGPT's step and lmkit's on the same weights and batches, ``--equivalence_steps`` of them, in one process.

    nanoGPT's model (the checkout's ``GPT``, ``bias=False``) and its ``configure_optimizers`` AdamW, clipped at
    1.0 as its train.py does; lmkit's :class:`~lmkit.train.Trainer` step of the config, which starts from a
    copy of nanoGPT's initial weights. Both take the learning rate of the config's plan at each step and the
    same random windows. What differs afterwards is arithmetic, not the recipe.
    """
    import numpy as np
    import torch

    from lmkit import distributed as dist
    dist.init("local", intra_op_threads=args.threads)
    import tensorflow as tf

    from lmkit.config import load_config
    from lmkit.models import build_model
    from lmkit.train import Trainer

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    sys.path.insert(0, args.nanogpt)
    from model import GPT, GPTConfig  # the user's checkout

    config = load_config(CONFIG)
    model = config.model
    gpt = GPT(GPTConfig(n_layer=model["num_layers"], n_head=model["num_heads"], n_embd=model["hidden_size"],
                        block_size=config.data.num_steps, bias=False, vocab_size=model["vocab_size"], dropout=0.0))
    optimizer = gpt.configure_optimizers(0.1, config.optimization.learning_rate, (0.9, 0.99), "cpu")
    model = build_model(config.model_config())
    _copy_nanogpt_weights({k: v.detach().numpy() for k, v in gpt.state_dict().items()}, model)
    trainer = Trainer(model, config, log=lambda text: None)
    train = read_ids(args.data, "train.bin")
    trainer.build(len(trainer.epoch_batches(train, 0)))
    rng = np.random.default_rng(args.seed)
    losses = []
    for step in range(args.equivalence_steps):
        starts = rng.integers(0, len(train) - BLOCK, size=config.data.batch_size)
        windows = np.stack([train[i:i + BLOCK + 1] for i in starts])
        x, y = np.ascontiguousarray(windows[:, :-1]), np.ascontiguousarray(windows[:, 1:])
        for group in optimizer.param_groups:
            group["lr"] = float(trainer.policy(step))
        _, loss = gpt(torch.from_numpy(x.astype("int64")), torch.from_numpy(y.astype("int64")))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(gpt.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        lmkit_loss = float(trainer.train_step(tf.constant(x), tf.constant(y), None).loss)
        losses.append((float(loss), lmkit_loss))
    state = {k: v.detach().numpy() for k, v in gpt.state_dict().items()}
    copy = build_model(config.model_config())
    _copy_nanogpt_weights(state, copy)
    weight_gap = max(float(np.abs(a.numpy() - b.numpy()).max()) for a, b in zip(copy.variables, model.variables))
    from lmkit.train.evaluation import Evaluator
    val = read_ids(args.data, "val.bin")
    return {"steps": args.equivalence_steps, "last_losses": losses[-1],
            "max_loss_difference": max(abs(a - b) for a, b in losses), "max_weight_difference": weight_gap,
            "val_loss": {"nanogpt": _nanogpt_val_loss(gpt, args.data),
                         "lmkit": Evaluator(model, BLOCK, 1).mean_loss(val)}}


# ------------------------------------------------------------------------------------------------ the runs
def _environment(threads: int) -> Dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS=str(threads), TF_CPP_MIN_LOG_LEVEL="2", PYTHONDONTWRITEBYTECODE="1",
                PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _stream(cmd: List[str], cwd: str, env: Dict[str, str], timeout: float, tag: str
            ) -> Tuple[float, List[Tuple[float, str]]]:
    """Runs ``cmd``, timing each line of its output as it comes; returns (launch time, [(time, line)]).

    Exits with the last lines when the command fails or runs past ``timeout`` seconds.
    """
    launched = time.time()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timer = threading.Timer(timeout, proc.kill)  # a silent hang ends too
    timer.start()
    lines: List[Tuple[float, str]] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.append((time.time(), line.rstrip("\n")))
    finally:
        timer.cancel()
        if proc.poll() is None:  # this script was stopped (Ctrl-C, SIGTERM): so is its run
            proc.kill()
    if proc.wait() != 0:
        why = f"ran past --timeout {timeout:.0f} s" if time.time() - launched >= timeout else \
            f"exit status {proc.returncode}"
        sys.exit(f"[{tag}] {why}; the last lines:\n" + "\n".join(text for _, text in lines[-40:]))
    return launched, lines


def _worker(kind: str, args: argparse.Namespace, extra: Sequence[str], cwd: str, tag: str) -> Dict[str, Any]:
    """Runs this script as a worker (``--_worker kind``) and returns its record (the JSON it writes)."""
    out = os.path.join(args.work, f"{tag}.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--_worker", kind, "--_out", out, "--data", args.data,
           "--threads", str(args.threads), "--interval", str(args.interval), *extra]
    launched, _ = _stream(cmd, cwd, _environment(args.threads), args.timeout, tag)
    with open(out) as f:
        return {"launched_at": launched, **json.load(f)}


def _loop_speed(marks: Sequence[Tuple[int, float]], start: float, steps: int, interval: int) -> Dict[str, float]:
    """Steps/s from the end of step 1 (``start``) to the end of the last step, and the median of the intervals.

    ``marks``: (global step, the time it ended), every ``interval`` steps and at the last one.
    """
    last_step, last_time = marks[-1]
    rates, previous = [], (1, start)
    for step, at in marks:
        if step > previous[0] and at > previous[1]:
            rates.append((step - previous[0]) / (at - previous[1]))
        previous = (step, at)
    return {"steps_per_sec": (last_step - 1) / (last_time - start),
            "interval_steps_per_sec": statistics.median(rates) if rates else float("nan")}


def run_lmkit(args: argparse.Namespace, seed: int, variant: Optional[Dict[str, Any]] = None,
              tag: str = "lmkit") -> Dict[str, Any]:
    """One lmkit run (its own process) of the config with ``--set`` and ``variant``'s overrides on top."""
    tag = f"{tag}-{seed}"
    sets = [*(args.set or []), *(f"{key}={value!r}" for key, value in (variant or {}).items())]
    extra = ["--seed", str(seed), "--steps", str(args.steps), *[f"--set={s}" for s in sets]]
    record = _worker("lmkit", args, extra, REPO, tag)
    speed = _loop_speed(record["marks"], record["first_step_done_at"], args.steps, args.interval)
    return {"framework": "lmkit", "seed": seed, "val_loss": record["val_loss"], **speed,
            "wall_to_trained": record["trained_at"] - record["launched_at"],
            "compile_seconds": record["first_step_done_at"] - record["launched_at"],
            "train_loss": record["train_loss"], "config": record["config"]}


def run_nanogpt(args: argparse.Namespace, seed: int) -> Dict[str, Any]:
    tag = f"nanogpt-{seed}"
    out_dir = os.path.join(args.work, tag)
    launcher = os.path.join(args.work, "launch_nanogpt.py")
    with open(launcher, "w") as f:
        f.write(LAUNCHER)
    flags = [*NANOGPT_FLAGS, f"--max_iters={args.steps}", f"--lr_decay_iters={args.steps}",
             f"--dataset={args.data}", f"--out_dir={out_dir}", f"--eval_interval={args.steps}",
             "--always_save_checkpoint=True"]
    cmd = [sys.executable, launcher, str(seed), "config/train_shakespeare_char.py", *flags]
    launched, lines = _stream(cmd, args.nanogpt, _environment(args.threads), args.timeout, tag)
    iters = {int(m.group(1)): (t, float(m.group(2)), float(m.group(3)) / 1000) for t, line in lines
             for m in [ITER_LINE.match(line)] if m}
    if args.steps - 1 not in iters:
        sys.exit(f"[{tag}] no 'iter {args.steps - 1}:' line in train.py's output (log_interval=1); the last "
                 "lines:\n" + "\n".join(t for _, t in lines[-20:]))
    # Iteration i (0-based) is global step i + 1; iteration 0 holds the first evaluation, iteration `steps`
    # (one more than the plan, after the checkpoint) the last one: the loop is iterations 1..steps-1.
    ends, clock = [], 0.0
    for i in range(1, args.steps):
        clock += iters[i][2]
        if (i + 1) % args.interval == 0 or i == args.steps - 1:
            ends.append((i + 1, clock))
    speed = _loop_speed(ends, 0.0, args.steps, args.interval)
    evaluated = _worker("nanogpt_eval", args, ["--nanogpt", args.nanogpt, "--out_dir", out_dir], REPO, f"{tag}-eval")
    if evaluated["iter_num"] != args.steps:
        sys.exit(f"[{tag}] the checkpoint is from iteration {evaluated['iter_num']}, not {args.steps}")
    losses = [iters[i][1] for i in range(args.steps)]
    train_loss = [(s, statistics.fmean(losses[s - args.interval:s])) for s in range(args.interval, args.steps + 1,
                                                                                     args.interval)]
    return {"framework": "nanogpt", "seed": seed, "val_loss": evaluated["val_loss"], **speed,
            "wall_to_trained": iters[args.steps - 1][0] - launched, "train_loss": train_loss,
            "command": " ".join(["python", "train.py", *cmd[3:]])}


# ------------------------------------------------------------------------------------------------ report
def _git_commit(folder: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", "-C", folder, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def summary(runs: List[Dict[str, Any]], frameworks: Sequence[str]) -> Dict[str, Any]:
    """Medians per framework and, with both, the ratios lmkit / nanoGPT (per round and of the medians)."""
    keys = ("val_loss", "steps_per_sec", "interval_steps_per_sec", "wall_to_trained")
    out: Dict[str, Any] = {f: {k: summarize([r[k] for r in runs if r["framework"] == f]) for k in keys}
                           for f in frameworks}
    if len(frameworks) == 2 and all(any(r["framework"] == f for r in runs) for f in frameworks):
        def column(framework: str, key: str) -> List[float]:
            return [r[key] for r in sorted((r for r in runs if r["framework"] == framework), key=lambda r: r["seed"])]

        out["lmkit_over_nanogpt"] = {k: ratio_spread(column("lmkit", k), column("nanogpt", k)) for k in keys[1:]}
        lm, ng = out["lmkit"]["val_loss"], out["nanogpt"]["val_loss"]
        out["val_loss_difference"] = {"median": lm["median"] - ng["median"],
                                      "per_seed": [a - b for a, b in zip(column("lmkit", "val_loss"),
                                                                         column("nanogpt", "val_loss"))]}
        speed = out["lmkit_over_nanogpt"]["steps_per_sec"]["of_medians"]
        out["targets"] = {"quality_met": lm["median"] <= ng["median"], "speed_met": speed >= 1.0}
    return out


def plot(runs: List[Dict[str, Any]], path: str, steps: int) -> Optional[str]:
    """Training-loss curves and the validation losses per seed; None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e .[bench]); no plot: --plot_only JSON draws it later",
              flush=True)
        return None

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    colors = {"lmkit": "tab:blue", "nanogpt": "tab:orange"}
    for run in (r for r in runs if r["train_loss"]):  # a plan in epochs logs no step lines
        steps_at, losses = zip(*run["train_loss"])
        left.plot(steps_at, losses, color=colors[run["framework"]], alpha=0.7,
                  label=f"{run['framework']} seed {run['seed']}")
    left.set(xlabel="step", ylabel="training loss (nats/char, mean of each interval)", ylim=(None, 3.0),
             title=f"training loss, {steps} steps")
    left.legend(fontsize=7)
    for i, framework in enumerate(f for f in colors if any(r["framework"] == f for r in runs)):
        values = [r["val_loss"] for r in runs if r["framework"] == framework]
        right.scatter([i] * len(values), values, color=colors[framework])
        right.hlines(statistics.median(values), i - 0.2, i + 0.2, color=colors[framework])
    right.set_xticks(range(len(colors)), list(colors))
    right.set(ylabel="validation loss (nats/char)", title="validation loss at the last step, per seed")
    return save_figure(fig, path)


def _report(run: Dict[str, Any], name: str) -> None:
    print(f"[{name} seed {run['seed']}] val loss {run['val_loss']:.4f} | {run['steps_per_sec']:.2f} steps/s "
          f"(intervals' median {run['interval_steps_per_sec']:.2f}) | trained {run['wall_to_trained']:.1f} s "
          f"after launch | load {run['load_average_before']}", flush=True)


def side_by_side(args: argparse.Namespace, seeds: Sequence[int], frameworks: Sequence[str],
                 save: Callable[[List[Dict[str, Any]], bool], Any]) -> List[Dict[str, Any]]:
    """A round of every framework per seed, the order alternating from round to round; ``save`` after each run."""
    runs: List[Dict[str, Any]] = []
    for round_index, seed in enumerate(seeds):
        for framework in frameworks if round_index % 2 == 0 else frameworks[::-1]:
            load = load_average()
            run = (run_lmkit if framework == "lmkit" else run_nanogpt)(args, seed)
            run.update(round=round_index + 1, load_average_before=load)
            runs.append(run)
            _report(run, framework)
            save(runs, False)
    return runs


def ablate(args: argparse.Namespace, seeds: Sequence[int],
           save: Callable[[List[Dict[str, Any]], bool], Any]) -> List[Dict[str, Any]]:
    """lmkit alone: the config, then each of :data:`ABLATIONS`, for every seed; ``save`` after each run."""
    runs: List[Dict[str, Any]] = []
    for seed in seeds:
        for index, (name, variant) in enumerate([("config_tiny_transformer", {}), *ABLATIONS.items()]):
            load = load_average()
            run = run_lmkit(args, seed, variant, tag=f"variant{index}")
            run.update(variant=name, overrides=variant, load_average_before=load)
            runs.append(run)
            _report(run, name)
            save(runs, False)
    return runs


def ablation_summary(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Per variant: the validation losses and their difference to the config's, seed by seed."""
    base = {r["seed"]: r["val_loss"] for r in runs if not r["overrides"]}
    out: Dict[str, Any] = {}
    for run in runs:
        entry = out.setdefault(run["variant"], {"overrides": run["overrides"], "val_loss": [], "minus_config": []})
        entry["val_loss"].append(run["val_loss"])
        entry["minus_config"].append(run["val_loss"] - base[run["seed"]])
    for entry in out.values():
        entry["median_minus_config"] = statistics.median(entry["minus_config"])
    return out


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nanogpt", help="a checkout of https://github.com/karpathy/nanoGPT (read, never written)")
    p.add_argument("--text", help="the plays corpus (nanoGPT's shakespeare_char input.txt)")
    p.add_argument("--steps", type=int, default=2000, help="optimizer steps of each run (nanoGPT's max_iters)")
    p.add_argument("--seeds", default="1,2,3", help="comma-separated seeds: one round of both runs each")
    p.add_argument("--frameworks", default="lmkit,nanogpt", help="lmkit, nanogpt or both")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads of every run")
    p.add_argument("--interval", type=int, default=100, help="steps per timing interval and per loss point")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="an override of lmkit's config, a Python literal: --set model.initialization=\"'uniform'\"")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds a run may take")
    p.add_argument("--output", default=os.path.join(RESULTS_DIR, "nanogpt_side_by_side.json"))
    p.add_argument("--equivalence_steps", type=int, default=100,
                   help="first, both steps from nanoGPT's initial weights on the same batches (0: skip)")
    p.add_argument("--equivalence_only", action="store_true",
                   help="only the equivalence (e.g. --equivalence_steps 2000: both validation losses at the end)")
    p.add_argument("--ablate", action="store_true",
                   help="lmkit alone: the config and each setting of nanoGPT's recipe put back as lmkit had it")
    p.add_argument("--no_plot", action="store_true")
    p.add_argument("--plot_only", metavar="JSON", help="draw the PNG of a result written before, and exit")
    for hidden in ("--_worker", "--_out", "--data", "--out_dir"):  # the worker processes' own arguments
        p.add_argument(hidden, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _check(args: argparse.Namespace) -> List[str]:
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    unknown = [f for f in frameworks if f not in ("lmkit", "nanogpt")]
    if unknown or not frameworks:
        sys.exit(f"--frameworks {args.frameworks!r}: name lmkit, nanogpt or both")
    if "nanogpt" in frameworks and not (args.nanogpt and os.path.isfile(os.path.join(args.nanogpt, "train.py"))
                                        and os.path.isfile(os.path.join(args.nanogpt, "model.py"))):
        sys.exit(f"--nanogpt {args.nanogpt!r} is not a nanoGPT checkout (train.py and model.py); "
                 "git clone https://github.com/karpathy/nanoGPT and pass its folder")
    if not args.text or not os.path.isfile(args.text):
        sys.exit(f"--text {args.text!r} is not a file; pass the plays corpus (nanoGPT's shakespeare_char input.txt)")
    if args.steps < 2 or args.interval < 1:
        sys.exit(f"--steps {args.steps} and --interval {args.interval}: at least 2 steps and 1 step an interval")
    if args.steps <= 100:
        sys.exit(f"--steps {args.steps}: more than the recipe's 100 warmup steps, e.g. --steps 200")
    return frameworks


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    if args._worker:
        workers = {"lmkit": lmkit_worker, "nanogpt_eval": nanogpt_eval_worker, "equivalence": equivalence_worker}
        record = workers[args._worker](args)
        with open(args._out, "w") as f:
            json.dump(record, f)
        return
    if args.plot_only:
        with open(args.plot_only) as f:
            done = json.load(f)
        print(plot(done["runs"], os.path.splitext(args.plot_only)[0] + ".png", done["steps"]))
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped by SIGTERM"))  # ends the running run too
    if args.ablate:
        args.frameworks = "lmkit"
    frameworks = _check(args)
    args.nanogpt = os.path.abspath(args.nanogpt) if args.nanogpt else None
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    started = time.time()
    header = {"command": command_line(),
              "machine": machine_info(tensorflow=package_version("tensorflow"), torch=package_version("torch")),
              "nanogpt": {"commit": _git_commit(args.nanogpt) if args.nanogpt else None, "flags": NANOGPT_FLAGS,
                          "config_file": "config/train_shakespeare_char.py"},
              "steps": args.steps, "seeds": seeds, "threads": args.threads, "interval": args.interval,
              "lmkit_overrides": parse_overrides(args.set or [])}

    def save(runs: List[Dict[str, Any]], complete: bool) -> Dict[str, Any]:
        """Writes the result so far (after every run: a stopped benchmark keeps its finished runs)."""
        result = {**header, "complete": complete, "seconds": round(time.time() - started, 1),
                  "load_average_at_end": load_average(), "runs": runs,
                  "summary": {} if not runs else ablation_summary(runs) if args.ablate else summary(runs, frameworks)}
        write_json(args.output, result)
        return result

    with tempfile.TemporaryDirectory(prefix="nanogpt_side_by_side-") as work:
        args.work, args.data = work, os.path.join(work, "data")
        header["ids"] = write_ids(args.text, args.data)
        print(f"ids: {header['ids']}", flush=True)
        if args.equivalence_steps and not args.ablate and "nanogpt" in frameworks:
            header["equivalence"] = _worker("equivalence", args, ["--nanogpt", args.nanogpt, "--seed", "1",
                                                                  "--equivalence_steps", str(args.equivalence_steps)],
                                            REPO, "equivalence")
            print(f"equivalence: {header['equivalence']}", flush=True)
        if args.equivalence_only:
            runs = []
        else:
            runs = ablate(args, seeds, save) if args.ablate else side_by_side(args, seeds, frameworks, save)
    result = save(runs, complete=True)
    if not args.no_plot and not args.ablate and runs:
        plot(runs, os.path.splitext(args.output)[0] + ".png", args.steps)
    print(json.dumps(result["summary"], indent=2))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
