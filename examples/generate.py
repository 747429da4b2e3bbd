#!/usr/bin/env python
"""Generates text from a trained lmkit language model: the same as ``lmkit generate``.

    python examples/generate.py --model_dir runs/config_small \
        --prompt "the company said" --strategy top_p --top_p 0.9 \
        --num_samples 5 --max_length 50 --seed 0

See ``lmkit/cli/generate.py`` (or ``lmkit generate --help``) for the flags
and the output.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lmkit.cli import generate  # noqa: E402  (imports no TensorFlow)
from lmkit.cli.common import run_main  # noqa: E402

if __name__ == "__main__":
    run_main(lambda argv: generate.main(argv, prog="generate.py"))
