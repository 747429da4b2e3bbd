#!/usr/bin/env python
"""Large-batch training on real text: does scaling + warmup (+ LARC / NovoGrad) keep up?

Trains the config_small LSTM shape on WikiText-2 (``valid.txt`` as training
text, 10,000-word vocabulary, the first 60,000 tokens of ``test.txt`` as
validation) for the same number of epochs at the baseline global batch (20)
and at 2x and 4x, with the learning-rate policy of 2 and 4 workers. One
process trains each setting: with the same global batch, N workers follow the
same trajectory as one process (tests/train/test_distributed_training.py), so
only the learning-rate policy needs the worker count (``lr_world_size``).

    python benchmarks/large_batch.py [--epochs 4] [--quick]

Writes benchmarks/results/large_batch.json and large_batch.png.
"""
import argparse
import json
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SETTINGS = [
    # name, batch, workers, overrides
    ("B20 baseline (lr 1.0)", 20, 1, {}),
    ("B40, lr 1.0, no scaling", 40, 2, {}),
    ("B40, sqrt scaling + warmup", 40, 2, {"lr_scaling": "sqrt", "warmup_epochs": 1.0}),
    ("B40, linear scaling + warmup", 40, 2, {"lr_scaling": "linear", "warmup_epochs": 1.0}),
    ("B80, lr 1.0, no scaling", 80, 4, {}),
    ("B80, sqrt scaling + warmup", 80, 4, {"lr_scaling": "sqrt", "warmup_epochs": 1.0}),
    ("B80, linear scaling + warmup", 80, 4, {"lr_scaling": "linear", "warmup_epochs": 1.0}),
    ("B80, linear + warmup + LARC clip (eta 0.02)", 80, 4,
     {"lr_scaling": "linear", "warmup_epochs": 1.0,
      "larc_params": {"larc_eta": 0.02, "larc_mode": "clip", "min_update": 1e-7, "epsilon": 1e-7}}),
    ("B80, NovoGrad lr 0.01, sqrt + warmup", 80, 4,
     {"optimizer": "novograd", "learning_rate": 0.01, "lr_scaling": "sqrt", "warmup_epochs": 1.0,
      "optimizer_params": {"beta1": 0.95, "beta2": 0.98}}),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--data", default=os.path.join(ROOT, "data", "wikitext-2"),
                   help="a folder with the WikiText-2 files (lmkit download wikitext-2)")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "large_batch"))
    p.add_argument("--quick", action="store_true", help="2 epochs on a quarter of the text")
    p.add_argument("--only", default=None, help="comma-separated setting indices")
    args = p.parse_args()

    import numpy as np
    import tensorflow as tf

    from lmkit import distributed as dist
    from lmkit.config import load_config
    from lmkit.data import Vocab
    from lmkit.models import build_model
    from lmkit.train import Trainer

    dist.init(backend="local")
    train_file = os.path.join(args.data, "valid.txt")
    test_file = os.path.join(args.data, "test.txt")
    vocab = Vocab.build(train_file, max_size=10000, newline_token="<eos>", bos_token=None, pad_token=None)

    def ids_of(path):
        with open(path, encoding="utf-8") as f:
            toks = [t for line in f for t in line.split() + ["<eos>"]]
        return np.array(vocab.encode(toks), np.int32)

    train, valid = ids_of(train_file), ids_of(test_file)[:60000]
    epochs = args.epochs
    if args.quick:
        train, valid, epochs = train[: len(train) // 4], valid[:15000], 2
    chosen = [SETTINGS[int(i)] for i in args.only.split(",")] if args.only else SETTINGS
    runs = []
    for name, batch, workers, overrides in chosen:
        cfg = load_config("config_small", dict(vocab_size=len(vocab), batch_size=batch, num_epochs=epochs,
                                               lr_decay_start_epoch=max(1, epochs - 2), **overrides))
        tf.random.set_seed(cfg.run.seed)
        model = build_model(cfg.model_config())
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        trainer = Trainer(model, cfg, lr_world_size=workers, log=lambda s: print("  " + s, flush=True))
        result = trainer.fit(train, valid)
        runs.append({"name": name, "global_batch": batch, "workers_emulated": workers,
                     "overrides": overrides, "valid_perplexity": [e.valid_perplexity for e in result.epochs],
                     "train_perplexity": [e.train_perplexity for e in result.epochs],
                     "learning_rate": [e.learning_rate for e in result.epochs],
                     "words_per_sec": [e.tokens_per_sec for e in result.epochs],
                     "seconds": time.perf_counter() - t0})
    out = {"command": " ".join([sys.executable.split("/")[-1]] + sys.argv), "machine": platform.platform(),
           "cpus": os.cpu_count(), "load_average": os.getloadavg(), "train_tokens": int(len(train)),
           "valid_tokens": int(len(valid)), "vocab": len(vocab), "epochs": epochs, "runs": runs}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(out, f, indent=2)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in runs:
        style = "-" if r["global_batch"] == 20 else ("--" if r["global_batch"] == 40 else ":")
        ax.plot(range(1, epochs + 1), r["valid_perplexity"], style, marker="o", label=r["name"])
    ax.set_xlabel("epoch")
    ax.set_ylabel(f"validation perplexity (first {len(valid):,} tokens of WikiText-2 test)")
    ax.set_yscale("log")
    ax.set_title("config_small LSTM on WikiText-2: larger global batches")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=110)
    print(f"wrote {args.out}.json and .png")


if __name__ == "__main__":
    main()
