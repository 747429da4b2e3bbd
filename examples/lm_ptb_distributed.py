#!/usr/bin/env python
"""Trains a PTB language model on N workers with Horovod or TensorFlow's own distribution.

    mpirun -np 2 python examples/lm_ptb_distributed.py --config config_small
    python examples/lm_ptb_distributed.py --backend native --num_gpus 2 --config config_small
    python -m lmkit.launch --hosts h1,h2 --num_workers 2 -- \
        python examples/lm_ptb_distributed.py --backend native --config config_small

The same as ``lmkit train`` (see ``lmkit/cli/train.py``): downloads the Penn
Treebank when --data_path lacks it (rank 0 only), splits each global batch of
``batch_size`` rows across the workers, broadcasts the variables from rank 0,
evaluates on rank 0 and reports perplexity and tokens/sec. Runs unchanged in
one process (``python examples/...``).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lmkit.cli import train  # noqa: E402  (imports no TensorFlow)
from lmkit.cli.common import run_main  # noqa: E402


def main(argv=None, distributed: bool = True) -> int:
    prog = "lm_ptb_distributed.py" if distributed else "lm_ptb.py"
    return train.main(argv, prog=prog, distributed=distributed)


if __name__ == "__main__":
    run_main(main)
