#!/usr/bin/env python
"""Trains a PTB language model in one process with ``lmkit train`` (no Horovod needed).

    python examples/lm_ptb.py --config config_small

The same as ``lmkit train`` (``lmkit/cli/train.py``, ``lmkit train --help`` for
the flags) at size 1; its checkpoints resume under ``mpirun -np N lmkit train``
and the other way round. examples/lm_ptb_distributed.py builds the same
training from lmkit's modules, in a page.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lmkit.cli import train  # noqa: E402  (imports no TensorFlow)
from lmkit.cli.common import run_main  # noqa: E402


def main(argv=None) -> int:
    return train.main(argv, prog="lm_ptb.py", distributed=False)


if __name__ == "__main__":
    run_main(main)
