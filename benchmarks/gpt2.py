#!/usr/bin/env python
"""GPT-2 in lmkit against Hugging Face ``transformers`` on PyTorch: training and generation tokens/sec.

One random GPT-2 of a small shape (default 4 layers, 256 wide, 4 heads, 256
positions, vocabulary 8192) is made with ``transformers`` and saved as a
Hugging Face folder; lmkit loads that folder (``GPT2Converter.load_weights``),
so both run the same weights (the logits are compared before timing).

* training: AdamW (lr 1e-4, weight decay 0.01), global-norm clipping 1.0,
  batch 8 x 128 tokens; lmkit's ``Trainer.train_step`` (after ``fit`` built
  it) against a PyTorch loop (``loss.backward()``, ``clip_grad_norm_``,
  ``torch.optim.AdamW``), dropout 0.1 in both;
* generation: greedy, batch 1 and 8, a 16-token prompt and 64 new tokens
  with the key/value cache: ``lmkit.decoding.decode`` against
  ``GPT2LMHeadModel.generate``.

Both frameworks get the same threads (``--threads``, default all cores) in
this one process; the runs alternate, lmkit then PyTorch, ``--repeats``
times; reported are medians and the median of the per-round ratios.

Usage::

    .venv/bin/python benchmarks/gpt2.py              # ~4 minutes on 2 cores
    .venv/bin/python benchmarks/gpt2.py --layers 12 --width 768 --heads 12 --vocab 50257  # gpt2 small

Writes ``benchmarks/results/gpt2.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks._common import (  # noqa: E402
    RESULTS_DIR,
    command_line,
    load_average,
    machine_info,
    median_ratio,
    summarize,
    write_json,
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--positions", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--batch", type=int, default=8, help="training rows per step")
    p.add_argument("--window", type=int, default=128, help="training tokens per row")
    p.add_argument("--train_steps", type=int, default=5, help="timed training steps per run")
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--new_tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--output", default=os.path.join(RESULTS_DIR, "gpt2.json"))
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import torch
        import transformers
    except ImportError:
        print("gpt2 benchmark: needs transformers and torch (pip install -e '.[test-hf]')", file=sys.stderr)
        return 2
    import numpy as np

    from lmkit import distributed as dist
    dist.init(backend="local", intra_op_threads=args.threads, inter_op_threads=args.threads)
    import tensorflow as tf

    from lmkit import decoding
    from lmkit.config import TrainConfig
    from lmkit.models import build_model
    from lmkit.models.gpt2.convert import GPT2Converter
    from lmkit.train import Trainer
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(args.threads)
    log = lambda s: print(s, flush=True)  # noqa: E731

    folder = tempfile.mkdtemp(prefix="lmkit-gpt2-bench-")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=args.vocab, n_positions=args.positions, n_embd=args.width,
                                     n_layer=args.layers, n_head=args.heads)
    reference = transformers.GPT2LMHeadModel(config)
    reference.save_pretrained(folder)
    converter = GPT2Converter()
    model_config = converter.model_config(converter.read_config(folder))
    model = build_model(model_config)
    converter.load_weights(model, folder)
    params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    rng = np.random.RandomState(0)
    probe = rng.randint(0, args.vocab, size=(2, 32)).astype(np.int32)
    with torch.no_grad():
        expected = reference.eval()(torch.tensor(probe, dtype=torch.long)).logits.numpy()
    got, _ = model(tf.constant(probe), None, training=False)
    max_diff = float(np.max(np.abs(got.numpy() - expected)))
    log(f"GPT-2 {args.layers} x {args.width}, {args.heads} heads, vocabulary {args.vocab}: {params / 1e6:.1f} M "
        f"parameters; lmkit vs transformers logits differ by at most {max_diff:.2e}")

    # ---- training
    cfg = TrainConfig.from_dict(dict(
        model="gpt2", vocab_size=args.vocab, hidden_size=args.width, num_layers=args.layers, num_heads=args.heads,
        max_positions=args.positions, init_scale=0.02, keep_prob=0.9, batch_size=args.batch,
        num_steps=args.window, num_epochs=1, optimizer="adamw", learning_rate=1e-4,
        optimizer_params={"weight_decay": 0.01}, max_grad_norm=1.0, data="text", train_file=__file__,
        model_params={"layer_norm_epsilon": model_config["layer_norm_epsilon"]}))
    ids = rng.randint(0, args.vocab, size=args.batch * (args.window + 1) * (args.train_steps + 4)).astype(np.int32)
    trainer = Trainer(model, cfg, log=lambda s: None)
    trainer.fit(ids, max_steps=2, num_epochs=1)  # builds and traces the step
    inputs = ids[:args.batch * args.window].reshape(args.batch, args.window)
    targets = ids[1:args.batch * args.window + 1].reshape(args.batch, args.window)
    x, y = tf.constant(inputs), tf.constant(targets)

    torch_model = transformers.GPT2LMHeadModel.from_pretrained(folder).train()
    optimizer = torch.optim.AdamW(torch_model.parameters(), lr=1e-4, weight_decay=0.01)
    tx, ty = torch.tensor(inputs, dtype=torch.long), torch.tensor(targets, dtype=torch.long)

    def torch_step() -> float:
        logits = torch_model(tx).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), ty.reshape(-1)) * args.window
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(torch_model.parameters(), 1.0)
        optimizer.step()
        return float(loss.detach())

    def lmkit_train() -> float:
        start = time.perf_counter()
        out = [trainer.train_step(x, y, None).loss for _ in range(args.train_steps)]
        [float(v) for v in out]
        return time.perf_counter() - start

    def torch_train() -> float:
        start = time.perf_counter()
        for _ in range(args.train_steps):
            torch_step()
        return time.perf_counter() - start

    torch_step()  # warm-up
    lmkit_train()
    tokens = args.batch * args.window * args.train_steps
    train: Dict[str, List[float]] = {"lmkit": [], "transformers": []}
    for r in range(args.repeats):
        train["lmkit"].append(tokens / lmkit_train())
        train["transformers"].append(tokens / torch_train())
        log(f"training round {r + 1}: lmkit {train['lmkit'][-1]:.0f}, transformers "
            f"{train['transformers'][-1]:.0f} tokens/sec (load {load_average()[:1]})")

    # ---- generation
    torch_model.eval()  # lmkit's decode calls the model with training=False
    generation: Dict[str, Dict[str, List[float]]] = {}
    for batch in (1, 8):
        prompts = rng.randint(0, args.vocab, size=(batch, args.prompt)).astype(np.int32)
        length = args.prompt + args.new_tokens

        def lmkit_generate() -> float:
            start = time.perf_counter()
            decoding.decode(model, length, prompts=prompts.tolist())
            return time.perf_counter() - start

        def torch_generate() -> float:
            tokens_in = torch.tensor(prompts, dtype=torch.long)
            start = time.perf_counter()
            with torch.no_grad():
                torch_model.generate(tokens_in, attention_mask=torch.ones_like(tokens_in), do_sample=False,
                                     max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                     pad_token_id=0)
            return time.perf_counter() - start

        lmkit_generate()  # traces the decode loop
        torch_generate()
        runs: Dict[str, List[float]] = {"lmkit": [], "transformers": []}
        for r in range(args.repeats):
            runs["lmkit"].append(batch * args.new_tokens / lmkit_generate())
            runs["transformers"].append(batch * args.new_tokens / torch_generate())
        generation[f"batch {batch}"] = runs
        log(f"generation batch {batch}: lmkit {summarize(runs['lmkit'])['median']:.0f}, transformers "
            f"{summarize(runs['transformers'])['median']:.0f} tokens/sec")

    def table(runs: Dict[str, List[float]]) -> Dict[str, Any]:
        return {"tokens_per_sec": {k: [round(v, 1) for v in vs] for k, vs in runs.items()},
                "median": {k: round(summarize(vs)["median"], 1) for k, vs in runs.items()},
                "lmkit/transformers": {
                    "of_medians": round(summarize(runs["lmkit"])["median"]
                                        / summarize(runs["transformers"])["median"], 3),
                    "median_of_rounds": round(median_ratio(runs["lmkit"], runs["transformers"]), 3)}}

    results = {
        "benchmark": "gpt2", "command": command_line(),
        "machine": machine_info(tensorflow=tf.__version__, torch=torch.__version__,
                                transformers=transformers.__version__),
        "threads": args.threads,
        "shape": {"layers": args.layers, "width": args.width, "heads": args.heads, "positions": args.positions,
                  "vocab": args.vocab, "parameters": params},
        "logits_max_abs_difference": max_diff,
        "training": {"batch": args.batch, "window": args.window, "steps_per_run": args.train_steps,
                     **table(train)},
        "generation": {"prompt": args.prompt, "new_tokens": args.new_tokens, "strategy": "greedy, kv cache",
                       **{k: table(v) for k, v in generation.items()}},
        "load_average_at_end": load_average(),
    }
    path = write_json(args.output, results)
    log(f"training lmkit/transformers {results['training']['lmkit/transformers']['median_of_rounds']:.2f}x; "
        + "; ".join(f"generation {k} {v['lmkit/transformers']['median_of_rounds']:.2f}x"
                    for k, v in results["generation"].items() if isinstance(v, dict) and "median" in v)
        + f"; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
