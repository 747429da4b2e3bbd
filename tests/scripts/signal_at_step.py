"""Runs a training script with one rank sending itself SIGTERM before a given step: a scheduler's notice.

Used by ``tests/examples``; nothing here is part of lmkit. The script runs
unchanged (as ``__main__``); this wrapper only counts the calls of
:meth:`lmkit.train.resume.Boundaries.flags` (one before every step, in
``lmkit train`` and in the examples alike) and, on rank ``--rank``, sends
SIGTERM to its own process at call ``--step`` (1-based: before this
process's step N)::

    mpirun -np 2 python tests/scripts/signal_at_step.py --rank 1 --step 70 -- \\
        examples/lm_ptb_distributed.py --config cfg.py --data_path data --model_dir model
"""
import argparse
import os
import runpy
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _install(rank: int, step: int) -> None:
    from lmkit.distributed.env import launcher_rank
    from lmkit.train import resume

    if launcher_rank() != rank:
        return
    flags = resume.Boundaries.flags
    calls = [0]

    def signalled(self):
        calls[0] += 1
        if calls[0] == step:
            print(f"rank {rank}: SIGTERM to myself before step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
        return flags(self)

    resume.Boundaries.flags = signalled


def main() -> None:
    argv = sys.argv[1:]
    if "--" not in argv:
        sys.exit("usage: signal_at_step.py --rank R --step N -- script.py <its flags>")
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--step", type=int, required=True)
    args = p.parse_args(argv[:argv.index("--")])
    script, *script_args = argv[argv.index("--") + 1:]
    sys.path.insert(0, ROOT)
    _install(args.rank, args.step)
    sys.argv = [script, *script_args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
