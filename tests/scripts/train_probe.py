"""Trains a tiny model on generated data and writes what each rank saw.

Run by tests in one process, under ``mpirun -np 2``, with the native backend
on N logical CPU devices (``--backend native --num_replicas N``) and as native
workers started by ``python -m lmkit.launch``; each process writes
``<out>.rank<r>.npz`` with the per-step losses and the final variables.

``--optimizer`` and ``--grad_accum_steps`` take comma-separated lists: the
process then trains once per combination (one start-up for the sweep) and
writes ``<out>.<optimizer>.k<k>.rank<r>.npz`` for each. The optimizer
``larc`` is SGD wrapped in LARC. ``--bomb_at S`` makes the gradient of the
S-th training call Inf (``tests/scripts/gradient_bomb.py``), on every rank
or only on ``--bomb_rank``. ``--model transformer_seq2seq`` or ``rnn_seq2seq``
trains an encoder-decoder on ``--ids`` generated reversal pairs instead.
``--stop_after S`` gives rank ``--stop_rank`` alone a callback that asks to
end the run after its step S (every rank must end at the same step).
"""
import argparse
import json
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def probe_ids(n: int):
    """A learnable stream: mostly "next = (prev * 3 + 1) % 50" with noise."""
    import numpy as np
    rng = np.random.RandomState(0)
    ids = np.zeros(n, np.int32)
    for i in range(1, len(ids)):
        ids[i] = (ids[i - 1] * 3 + 1) % 50 if rng.rand() < 0.8 else rng.randint(50)
    return ids


SEQ2SEQ = ("transformer_seq2seq", "rnn_seq2seq")


class ProbeSpecials:
    """The target ids an encoder-decoder's trainer needs (lmkit's tokenizers: <unk> <eos> <bos> <pad>)."""

    unk_id, eos_id, bos_id, pad_id = 0, 1, 2, 3


def probe_pairs(n: int, vocab: int = 50):
    """``n`` reversal pairs of 2-9 ids in [4, vocab): rows of a batch differ in length, so the ranks' shards
    hold different numbers of target tokens (the loss must still be the global batch's mean per token)."""
    import numpy as np

    from lmkit.data.paired import PairReport, Pairs
    rng = np.random.RandomState(1)
    sources = [rng.randint(4, vocab, rng.randint(2, 10)).astype(np.int32) for _ in range(n)]
    return Pairs(sources, [s[::-1].copy() for s in sources], PairReport(kept=n))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="lstm")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--keep_prob", type=float, default=1.0)
    p.add_argument("--optimizer", default="sgd", help="one or more (comma-separated); larc = SGD + LARC")
    p.add_argument("--grad_accum_steps", default="1", help="one or more (comma-separated)")
    p.add_argument("--precision", default="float32")
    p.add_argument("--jit_compile", default="auto", help="True, False or auto (the config's jit_compile)")
    p.add_argument("--compression", default="none")
    p.add_argument("--max_grad_norm", type=float, default=5.0)
    p.add_argument("--warmup_epochs", type=float, default=0.0)
    p.add_argument("--sparse_as_dense", action="store_true")
    p.add_argument("--seed_by_rank", action="store_true",
                   help="give each rank a different init seed (the broadcast must fix it)")
    p.add_argument("--backend", default=None)
    p.add_argument("--num_replicas", type=int, default=0,
                   help="native backend: replicas in this process (logical CPU devices)")
    p.add_argument("--model_dir", default=None)
    p.add_argument("--num_epochs", type=int, default=None)
    p.add_argument("--ids", type=int, default=3000, help="length of the generated id stream")
    p.add_argument("--learning_rate", type=float, default=None)
    p.add_argument("--bomb_at", type=int, default=-1, help="training call whose gradient becomes Inf")
    p.add_argument("--bomb_rank", type=int, default=-1, help="only this rank's (-1: every rank's)")
    p.add_argument("--stop_after", type=int, default=0, help="a callback asks to end the run after this step")
    p.add_argument("--stop_rank", type=int, default=0, help="the rank whose callback asks")
    args = p.parse_args()

    from lmkit import distributed as dist

    dist.init(backend=args.backend, num_gpus=args.num_replicas)
    optimizers = args.optimizer.split(",")
    accums = [int(k) for k in args.grad_accum_steps.split(",")]
    sweep = len(optimizers) * len(accums) > 1
    for optimizer in optimizers:
        for k in accums:
            out = f"{args.out}.{optimizer}.k{k}" if sweep else args.out
            train_once(args, optimizer, k, out)


def train_once(args, optimizer: str, grad_accum_steps: int, out: str) -> None:
    import numpy as np
    import tensorflow as tf

    from lmkit import distributed as dist
    from lmkit.config import TrainConfig
    from lmkit.models import build_model
    from lmkit.train import Trainer
    from tests.scripts.gradient_bomb import GradientBomb

    larc = optimizer == "larc"
    seq2seq = args.model in SEQ2SEQ
    pairs = dict(data="pairs", source_file="probe.src", target_file="probe.tgt", source_vocab_size=50,
                 max_source_positions=16, share_embeddings=True) if seq2seq else {}
    cfg = TrainConfig.from_dict(dict(
        **pairs, model=args.model, vocab_size=50, hidden_size=16, num_layers=2, init_scale=0.1,
        keep_prob=args.keep_prob, batch_size=args.batch_size, num_steps=6, num_epochs=100,
        learning_rate=args.learning_rate or (0.5 if optimizer in ("sgd", "larc") else 0.01),
        optimizer="sgd" if larc else optimizer,
        larc_params={"larc_eta": 0.02, "larc_mode": "clip"} if larc else None,
        max_grad_norm=args.max_grad_norm, warmup_epochs=args.warmup_epochs, num_heads=2, max_positions=16,
        sparse_as_dense=args.sparse_as_dense, grad_accum_steps=grad_accum_steps, precision=args.precision,
        jit_compile={"True": True, "False": False}.get(args.jit_compile, args.jit_compile),
        compression=args.compression))
    ids = probe_pairs(args.ids) if seq2seq else probe_ids(args.ids)
    seed = 7 + (1000 * dist.rank() if args.seed_by_rank else 0)
    tf.random.set_seed(seed)
    with dist.scope():
        model = build_model(cfg.model_config())
        if args.bomb_at >= 0:
            fires = args.bomb_rank in (-1, dist.rank())
            model = GradientBomb(model, at_call=args.bomb_at if fires else -1)
    before = [v.numpy().copy() for v in model.trainable_variables]
    trainer = Trainer(model, cfg, model_dir=args.model_dir, record_step_losses=True, log=lambda s: None,
                      vocab=ProbeSpecials() if seq2seq else None, callbacks=_callbacks(args))
    result = trainer.fit(ids, max_steps=args.steps, num_epochs=args.num_epochs)
    arrays = {f"var{i}": v.numpy() for i, v in enumerate(model.trainable_variables)}
    arrays.update({f"init{i}": b for i, b in enumerate(before)})
    arrays.update({f"slot{i}": v.numpy() for i, v in enumerate(trainer.optimizer.variables)})
    # Largest difference between the copies a process holds of one variable
    # (native backend: one per replica; otherwise a single copy).
    copies = [getattr(v, "values", (v,)) for v in list(model.variables) + list(trainer.optimizer.variables)]
    arrays["copy_spread"] = np.array(max(
        float(np.max(np.abs(c.numpy().astype(np.float64) - cs[0].numpy().astype(np.float64)), initial=0.0))
        for cs in copies for c in cs))
    np.savez(f"{out}.rank{dist.rank()}.npz", losses=np.array(result.step_losses), **arrays)
    with open(f"{out}.rank{dist.rank()}.json", "w") as f:
        json.dump({"size": dist.size(), "rank": dist.rank(), "steps": result.global_step,
                   "host": socket.gethostname(), "local_size": dist.local_size(),
                   "backend": dist.backend_name(), "replicas": dist.num_replicas(),
                   "resumed_from": result.resumed_from, "skipped_steps": result.skipped_steps,
                   "loss_scale": result.loss_scale,
                   "learning_rate": float(trainer.optimizer.learning_rate.numpy()),
                   "xla": trainer.xla, "device_type": dist.device_type()}, f)


def _callbacks(args):
    """``--stop_after``'s callback on ``--stop_rank`` (none elsewhere)."""
    from lmkit import distributed as dist
    from lmkit.train import Callback

    class StopAfter(Callback):
        def on_step_end(self, info, control):
            if info.step == args.stop_after:
                control.should_stop = True

    return [StopAfter()] if args.stop_after and dist.rank() == args.stop_rank else []


if __name__ == "__main__":
    main()
