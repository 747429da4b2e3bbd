#!/usr/bin/env python
"""Trains a PTB language model in one process (no Horovod needed).

    python examples/lm_ptb.py --config config_small

The same trainer as examples/lm_ptb_distributed.py, at size 1; its
checkpoints resume under mpirun and the other way round.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lm_ptb_distributed import main as _main  # noqa: E402

from lmkit.cli.common import run_main  # noqa: E402


def main(argv=None) -> int:
    return _main(argv, distributed=False)


if __name__ == "__main__":
    run_main(main)
