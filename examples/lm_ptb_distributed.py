#!/usr/bin/env python
"""Trains a PTB language model on N workers with Horovod or TensorFlow's own distribution.

    mpirun -np 2 python examples/lm_ptb_distributed.py --config config_small
    python examples/lm_ptb_distributed.py --backend native --num_gpus 2 --config config_small
    python -m lmkit.launch --hosts h1,h2 --num_workers 2 -- \
        python examples/lm_ptb_distributed.py --backend native --config config_small

Downloads the Penn Treebank when --data_path lacks it (rank 0 only), splits
each global batch of ``batch_size`` rows across the workers, broadcasts the
variables from rank 0, evaluates on rank 0 and reports perplexity and
words/sec. Runs unchanged in one process (``python examples/...``).
Every line that is specific to distributed training is marked ``# DIST``.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lmkit.dist import BACKEND_CHOICES  # noqa: E402  (imports no TensorFlow)
from lmkit.train.cli import ptb_arg_parser, run_main  # noqa: E402



def main(argv=None, distributed: bool = True) -> int:
    prog = "lm_ptb_distributed.py" if distributed else "lm_ptb.py"
    parser = ptb_arg_parser(prog, __doc__.split("\n\n")[0], distributed)
    if distributed:  # DIST: which backend
        parser.add_argument("--backend", choices=list(BACKEND_CHOICES), default=None,
                            help="horovod: start with mpirun/horovodrun; native: TensorFlow's own "
                                 "distribution (start with python, or python -m lmkit.launch for several "
                                 "hosts); auto: Horovod when installed, else one local process; "
                                 "default: the config's backend")
        parser.add_argument("--use_horovod", type=str.lower, choices=["true", "false"], default=None,
                            help="OpenSeq2Seq's spelling: true = --backend horovod, false = --backend native")
        parser.add_argument("--num_gpus", type=int, default=None,
                            help="backend native: replicas in this process, one per GPU (logical CPU "
                                 "devices on a host without GPUs); 0 = all GPUs; default: the config's num_gpus")
    args = parser.parse_args(argv)

    # Imports after the flags, so `--help` and flag errors answer at once.
    from lmkit import dist
    from lmkit.config import load_config
    from lmkit.errors import UsageError
    from lmkit.models import build_model
    from lmkit.train import Trainer
    from lmkit.train.cli import load_ptb_everywhere, parse_overrides

    overrides = parse_overrides(args.overrides)
    if args.seed is not None:
        overrides["seed"] = args.seed
    if distributed:
        if args.sparse_as_dense:
            overrides["sparse_as_dense"] = True  # DIST
        if args.fp16_allreduce:
            overrides["compression"] = "fp16"  # DIST
        if args.use_horovod is not None:
            overrides["backend"] = "horovod" if args.use_horovod == "true" else "native"  # DIST
        if args.backend is not None:
            overrides["backend"] = args.backend  # DIST
        if args.num_gpus is not None:
            overrides["num_gpus"] = args.num_gpus  # DIST
    config = load_config(args.config, overrides)  # plain Python: no TensorFlow op yet
    # Initialise before any TensorFlow op: pins GPUs (or makes the replicas) and sets CPU threads.
    dist.init(backend=config.backend if distributed else "local",  # DIST
              intra_op_threads=args.intra_op_threads, num_gpus=config.num_gpus)
    replicas = dist.num_replicas()  # DIST: the global batch is split across the replicas
    if config.batch_size % replicas:
        raise UsageError(f"batch_size {config.batch_size} is not divisible by {replicas} workers; "
                         f"use a multiple of {replicas}")
    model_dir = args.model_dir or os.path.join("runs", os.path.basename(args.config).replace(".py", ""))
    if args.no_resume and os.path.isdir(os.path.join(model_dir, "checkpoints")) and \
            os.listdir(os.path.join(model_dir, "checkpoints")):
        raise UsageError(f"--no_resume, but {model_dir} already holds checkpoints; "
                         "pass a new --model_dir or drop --no_resume to continue that run")

    # Rank 0 downloads when needed; the other ranks wait, then read.  # DIST
    data = load_ptb_everywhere(args.data_path, args.data_url, expected_vocab_size=config.vocab_size,
                               verify=not args.no_verify_data)
    if len(data.vocab) != config.vocab_size:
        raise UsageError(f"the data has {len(data.vocab)} words but the config says vocab_size = "
                         f"{config.vocab_size}; set vocab_size = {len(data.vocab)}")

    import tensorflow as tf
    tf.random.set_seed(config.seed)  # same initial values everywhere; rank 0's win anyway
    with dist.scope():  # DIST: native backend: one copy of each variable per replica
        model = build_model(config.model_config())
    trainer = Trainer(model, config, model_dir=model_dir, vocab=data.vocab)
    result = trainer.fit(data.train, data.valid, data.test, max_steps=args.max_steps,
                         num_epochs=args.num_epochs)
    if dist.is_chief() and result.epochs:  # DIST: rank 0 reports
        last = result.epochs[-1]
        print(f"done: {len(result.epochs)} epoch(s), final valid perplexity "
              f"{last.valid_perplexity if last.valid_perplexity is not None else float('nan'):.2f}, "
              f"test perplexity {result.test_perplexity if result.test_perplexity is not None else float('nan'):.2f}, "
              f"{last.words_per_sec:.0f} words/sec on {replicas} worker(s); results in {model_dir}/results.json",
              flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
