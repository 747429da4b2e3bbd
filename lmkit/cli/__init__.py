"""The ``lmkit`` command: ``lmkit train``, ``prepare``, ``generate``, ``evaluate``, ``export``, ``serve``.

Installed with the package (``lmkit``), and also ``python -m lmkit``. Every
command answers a bad flag at once, before TensorFlow loads, prints one
``error:`` line for bad input (rank 0 only) and exits 2, and answers
SIGTERM, SIGINT and SIGUSR1 at any point with one line and exit status 75
(:mod:`lmkit.core.preemption`: rerun the same command to continue); see
:func:`lmkit.cli.common.run_main` for the other exit statuses.
"""

from __future__ import annotations

import importlib
import sys
from typing import List, Optional

from lmkit.core.checks import did_you_mean

__all__ = ["COMMANDS", "main"]

#: command -> (module with main(argv, prog), one-line description)
COMMANDS = {
    "train": ("lmkit.cli.train", "train a language model on PTB or your own text (or an encoder-decoder on "
                                 "source/target pairs), on 1 or N workers"),
    "prepare": ("lmkit.cli.prepare", "encode your text into the data cache ahead of training (lmkit train's flags)"),
    "generate": ("lmkit.cli.generate", "generate text from a trained model folder (an encoder-decoder: one line "
                                       "per source)"),
    "evaluate": ("lmkit.cli.evaluate", "perplexity of a trained model on a text file or a split (an "
                                       "encoder-decoder: also BLEU and exact match)"),
    "export": ("lmkit.cli.export", "write a trained GPT-2 or Llama-family run as a Hugging Face folder"),
    "serve": ("lmkit.cli.serve", "serve a model over an OpenAI-compatible HTTP API, with a playground page"),
    "download": ("lmkit.cli.download", "fetch a public corpus (wikitext-2, ptb), each file checked by its hash"),
}


def _usage() -> str:
    from lmkit import __version__
    lines = [f"usage: lmkit {{{','.join(COMMANDS)}}} [flags]   (lmkit {__version__})", "",
             "commands:"]
    lines += [f"  {name:<10} {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "lmkit COMMAND --help shows a command's flags; lmkit --version its version."]
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> None:
    """Runs ``lmkit COMMAND [flags]`` and exits with its status."""
    from lmkit.cli.common import run_main
    from lmkit.distributed.env import launcher_rank

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        (sys.stdout if argv else sys.stderr).write(_usage())
        sys.exit(0 if argv else 2)
    if argv[0] == "--version":
        from lmkit import __version__
        print(f"lmkit {__version__}")
        sys.exit(0)
    command = argv[0]
    if command not in COMMANDS:
        if launcher_rank() == 0:
            sys.stderr.write(_usage() + f"lmkit: error: unknown command {command!r}; "
                             f"{did_you_mean(command, COMMANDS)}\n")
        sys.exit(2)

    def run(args: Optional[List[str]]) -> int:  # inside run_main: a signal while it imports is a preemption too
        from lmkit.core.preemption import set_doing
        set_doing(f"running lmkit {command}")  # the commands say more as they go
        module = importlib.import_module(COMMANDS[command][0])
        return module.main(args, prog=f"lmkit {command}")

    run_main(run, argv[1:])
