#!/usr/bin/env python
"""A Llama-shaped model in lmkit against transformers: fine-tuning (full and LoRA) and generation.

One random Llama (``LlamaForCausalLM`` of transformers, saved as a Hugging
Face folder: vocabulary 8192, 4 layers of width 256, 8 query heads and 2
key/value heads, SwiGLU 704, untied) is read by both sides, and measured as:

* ``lmkit_full`` / ``lmkit_lora``: the real :class:`lmkit.train.Trainer`
  step (the default ``jit_compile = "auto"``) on the model that ``lmkit train
  --init_from FOLDER`` builds, every weight trained (Adam) or ``--lora_rank 8``
  adapters on query and value only (:func:`lmkit.models.build.build_run_model`);
* ``torch_full`` / ``torch_lora``: ``LlamaForCausalLM.from_pretrained`` of
  the same folder, eager PyTorch, Adam, ``clip_grad_norm_``; LoRA through
  ``peft`` (``LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj",
  "v_proj"])``), skipped when peft is not installed;
* ``lmkit_gen`` / ``torch_gen``: greedy generation of 112 tokens after a
  16-token prompt with the key/value cache: :func:`lmkit.decoding.decode`
  (the XLA-compiled loop) against transformers' ``generate``.

Batch 8 x 128 tokens for training, 1 and 8 rows for generation, random ids.
Each column runs in its own worker process (the pattern of
``train_throughput.py``); the timed runs alternate between the columns of a
group. Reported: median tokens/sec and the ratios (of the medians and the
median of per-round ratios); for training also the trainable parameters,
the values the optimizer keeps, and the worker's peak resident memory.

Usage::

    .venv/bin/python benchmarks/llama.py              # about 6 minutes on 2 cores
    .venv/bin/python benchmarks/llama.py --quick      # about 3 minutes

Writes ``benchmarks/results/llama.json``.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks._common import (  # noqa: E402
    RESULTS_DIR,
    command_line,
    load_average,
    machine_info,
    package_version,
    ratio_spread,
    summarize,
    write_json,
)
from benchmarks.train_throughput import Worker, _reply, set_threads, synthetic_batches  # noqa: E402

SHAPE = dict(vocab_size=8192, hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, rms_norm_eps=1e-5)
BATCH, WINDOW, LEARNING_RATE, CLIP = 8, 128, 1e-4, 1.0
LORA = dict(rank=8, alpha=16.0, targets=("query", "value"), hf_targets=("q_proj", "v_proj"))
PROMPT, NEW_TOKENS = 16, 112
TRAIN = ("lmkit_full", "lmkit_lora", "torch_full", "torch_lora")
GENERATE = ("lmkit_gen", "torch_gen")
FOLDER_VARIABLE = "LMKIT_BENCH_LLAMA_FOLDER"


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="timed runs per column (default 5)")
    p.add_argument("--steps", type=int, default=3, help="training steps (or generate calls) per timed run")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before the first run")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--quick", action="store_true", help="3 repeats of 2 steps")
    p.add_argument("--output", default=os.path.join(RESULTS_DIR, "llama.json"))
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)  # internal: COLUMN:BATCH
    p.add_argument("--device", default="cpu", help=argparse.SUPPRESS)  # Worker passes it
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.steps = min(args.repeats, 3), min(args.steps, 2)
    return args


def make_folder(folder: str) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**SHAPE)).save_pretrained(folder)


# ----------------------------------------------------------------------------- columns
class LmkitTrain:
    def __init__(self, folder: str, lora: bool) -> None:
        import tensorflow as tf

        from lmkit.config import load_config
        from lmkit.hub.converters import pretrained_training_config
        from lmkit.models.build import build_run_model
        from lmkit.train import Trainer
        self.tf = tf
        overrides = {"batch_size": BATCH, "num_steps": WINDOW, "optimizer": "adam", "optimizer_params": {},
                     "learning_rate": LEARNING_RATE, "max_grad_norm": CLIP, "warmup_epochs": 0.0,
                     "data": "text", "train_file": "unused.txt", "init_from": folder, "keep_prob": 1.0,
                     **({"lora_rank": LORA["rank"], "lora_alpha": LORA["alpha"],
                         "lora_targets": ",".join(LORA["targets"])} if lora else {})}
        cfg = pretrained_training_config(load_config("config_gpt2_finetune", overrides), folder)
        ids, self.inputs, self.targets = synthetic_batches(cfg, num_batches=16)
        model = build_run_model(cfg)
        self.trainer = Trainer(model, cfg, log=lambda s: None)
        self.trainer.fit(ids, max_steps=2, num_epochs=1)  # builds and traces the step
        self.step, self.state, self.position = self.trainer.train_step, self.trainer.initial_state(), 0
        self.trainable = sum(int(v.shape.num_elements()) for v in model.trainable_variables)
        self.optimizer_values = sum(int(v.shape.num_elements()) for v in self.trainer.optimizer.variables
                                    if len(v.shape) > 0)

    def run(self, steps: int) -> List[float]:
        tf, pending = self.tf, []
        for _ in range(steps):
            i = self.position % len(self.inputs)
            self.position += 1
            out = self.step(tf.constant(self.inputs[i]), tf.constant(self.targets[i]), self.state)
            self.state = out.state
            pending.append(out.loss)
        return [float(v) for v in pending]


class TorchTrain:
    def __init__(self, folder: str, lora: bool) -> None:
        import numpy as np
        import torch
        from transformers import LlamaForCausalLM
        self.torch = torch
        torch.manual_seed(0)
        model = LlamaForCausalLM.from_pretrained(folder)
        if lora:
            from peft import LoraConfig, get_peft_model
            model = get_peft_model(model, LoraConfig(r=LORA["rank"], lora_alpha=LORA["alpha"], lora_dropout=0.0,
                                                     target_modules=list(LORA["hf_targets"])))
        model.train()
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(self.params, lr=LEARNING_RATE)
        rng = np.random.RandomState(0)
        self.ids = torch.from_numpy(rng.randint(0, SHAPE["vocab_size"], (16, BATCH, WINDOW + 1)).astype("int64"))
        self.position = 0
        self.trainable = sum(p.numel() for p in self.params)
        self.run(1)
        self.optimizer_values = sum(t.numel() for s in self.optimizer.state.values() for t in s.values()
                                    if torch.is_tensor(t) and t.dim() > 0)

    def run(self, steps: int) -> List[float]:
        torch = self.torch
        from torch.nn import functional as F
        pending = []
        for _ in range(steps):
            window = self.ids[self.position % len(self.ids)]
            self.position += 1
            self.optimizer.zero_grad(set_to_none=True)
            logits = self.model(input_ids=window[:, :-1]).logits
            loss = F.cross_entropy(logits.reshape(-1, SHAPE["vocab_size"]), window[:, 1:].reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.params, CLIP)
            self.optimizer.step()
            pending.append(loss.detach())
        return [float(v) for v in pending]


class LmkitGenerate:
    def __init__(self, folder: str, batch: int) -> None:
        import numpy as np

        from lmkit import decoding
        from lmkit.models import build_model
        from lmkit.models.llama.convert import LlamaConverter
        converter = LlamaConverter()
        self.model = build_model(converter.model_config(converter.read_config(folder)))
        converter.load_weights(self.model, folder)  # the folder has no tokenizer: ids only
        self.decoding, self.sampler = decoding, decoding.GreedySampler()
        rng = np.random.RandomState(0)
        self.prompts = rng.randint(0, SHAPE["vocab_size"], (batch, PROMPT)).tolist()

    def run(self, calls: int) -> List[float]:
        for _ in range(calls):
            out = self.decoding.decode(self.model, PROMPT + NEW_TOKENS, self.sampler, prompts=self.prompts, seed=0)
        return [float(out.ids[0, -1])]


class TorchGenerate:
    def __init__(self, folder: str, batch: int) -> None:
        import numpy as np
        import torch
        from transformers import LlamaForCausalLM
        self.torch = torch
        self.model = LlamaForCausalLM.from_pretrained(folder).eval()
        rng = np.random.RandomState(0)
        self.prompts = torch.from_numpy(rng.randint(0, SHAPE["vocab_size"], (batch, PROMPT)).astype("int64"))

    def run(self, calls: int) -> List[float]:
        with self.torch.no_grad():
            for _ in range(calls):
                out = self.model.generate(self.prompts, attention_mask=self.torch.ones_like(self.prompts),
                                          do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                          eos_token_id=None, pad_token_id=0)
        return [float(out[0, -1])]


def build(column: str, folder: str, batch: int) -> Any:
    if column in ("lmkit_full", "lmkit_lora"):
        return LmkitTrain(folder, lora=column == "lmkit_lora")
    if column in ("torch_full", "torch_lora"):
        return TorchTrain(folder, lora=column == "torch_lora")
    return LmkitGenerate(folder, batch) if column == "lmkit_gen" else TorchGenerate(folder, batch)


def worker_main(args: argparse.Namespace) -> int:
    column, _, batch = args.worker.partition(":")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        threads = set_threads(args.threads, column.startswith("torch"))
        start = time.perf_counter()
        runner = build(column, os.environ[FOLDER_VARIABLE], int(batch or 1))
        runner.run(args.warmup)
        info = {"ready": True, "threads": threads, "setup_seconds": round(time.perf_counter() - start, 2)}
        for key in ("trainable", "optimizer_values"):
            if hasattr(runner, key):
                info[key] = getattr(runner, key)
        _reply(info)
    except Exception as exc:  # reported by the parent
        _reply({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    for line in sys.stdin:
        command = line.split()
        if not command or command[0] == "quit":
            break
        start = time.perf_counter()
        values = runner.run(int(command[1]))
        elapsed = time.perf_counter() - start
        _reply({"elapsed": elapsed, "losses": values,
                "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)})
    return 0


# ----------------------------------------------------------------------------- the parent
def bench_group(columns: Sequence[str], batch: int, tokens_per_call: int, args: argparse.Namespace,
                log) -> Dict[str, Any]:
    workers: Dict[str, Worker] = {}
    rates: Dict[str, List[float]] = {c: [] for c in columns}
    last: Dict[str, Dict[str, Any]] = {}
    try:
        for column in columns:
            log(f"building {column} (batch {batch}) in its own process ...")
            workers[column] = Worker(f"{column}", str(batch), args, script=os.path.abspath(__file__))
        for r in range(args.repeats):
            for column in columns:
                time.sleep(0.5)
                last[column] = workers[column].run(args.steps)
                rates[column].append(tokens_per_call * args.steps / last[column]["elapsed"])
            log(f"round {r + 1}/{args.repeats}: " + ", ".join(f"{c} {rates[c][-1]:.0f}" for c in columns)
                + f" tokens/sec (load {load_average()[:1]})")
    finally:
        for worker in workers.values():
            worker.close()
    out: Dict[str, Any] = {"batch": batch, "tokens_per_call": tokens_per_call, "columns": {}, "ratios": {}}
    for column in columns:
        info = workers[column].info
        out["columns"][column] = {
            "tokens_per_sec": [round(v, 1) for v in rates[column]],
            "summary": {k: round(v, 1) for k, v in summarize(rates[column]).items()},
            "setup_seconds": info["setup_seconds"], "peak_rss_mib": last[column]["peak_rss_mib"],
            **{k: info[k] for k in ("trainable", "optimizer_values") if k in info}}
    for a in columns:
        for b in columns:
            if a != b and (a.startswith("lmkit") and (b.startswith("torch") or a.endswith("lora"))):
                out["ratios"][f"{a}/{b}"] = ratio_spread(rates[a], rates[b])
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.worker:
        return worker_main(args)
    import importlib.util
    log = lambda s: print(s, flush=True)  # noqa: E731
    for name in ("torch", "transformers"):
        if importlib.util.find_spec(name) is None:
            print(f"llama: {name} is not installed (.venv/bin/python -m pip install -e '.[test-hf]')",
                  file=sys.stderr)
            return 1
    train = list(TRAIN)
    notes = []
    if importlib.util.find_spec("peft") is None:
        train.remove("torch_lora")
        notes.append("peft is not installed: torch_lora skipped (.venv/bin/python -m pip install peft)")
        log(notes[-1])

    results: Dict[str, Any] = {
        "benchmark": "llama", "command": command_line(),
        "machine": machine_info(tensorflow=package_version("tensorflow-cpu") or package_version("tensorflow"),
                                torch=package_version("torch"), transformers=package_version("transformers"),
                                peft=package_version("peft")),
        "shape": SHAPE, "training": {"batch": BATCH, "window": WINDOW, "optimizer": "adam",
                                     "learning_rate": LEARNING_RATE, "clip": CLIP,
                                     "lora": {k: list(v) if isinstance(v, tuple) else v for k, v in LORA.items()}},
        "generation": {"prompt": PROMPT, "new_tokens": NEW_TOKENS, "sampler": "greedy"},
        "settings": {"repeats": args.repeats, "steps_per_run": args.steps, "warmup": args.warmup,
                     "threads": args.threads}, "notes": notes, "groups": {}}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        make_folder(folder)
        os.environ[FOLDER_VARIABLE] = folder  # the workers inherit it
        try:
            results["groups"]["train"] = bench_group(train, BATCH, BATCH * WINDOW, args, log)
            for batch in (1, 8):
                results["groups"][f"generate_batch{batch}"] = bench_group(GENERATE, batch, batch * NEW_TOKENS,
                                                                          args, log)
        except RuntimeError as exc:
            print(f"llama: {exc}", file=sys.stderr)
            return 1
    for group, entry in results["groups"].items():
        for key, ratio in entry["ratios"].items():
            log(f"[{group}] {key}: {ratio['of_medians']:.2f} (ratio of medians), {ratio['median_of_rounds']:.2f} "
                f"(median of per-round ratios, {ratio['min_of_rounds']:.2f}-{ratio['max_of_rounds']:.2f})")
    results["load_average_at_end"] = load_average()
    results["wall_seconds"] = round(time.perf_counter() - started, 1)
    log(f"wrote {write_json(args.output, results)} in {results['wall_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
