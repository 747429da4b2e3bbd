"""``lmkit prepare``: encode a text corpus into the data cache ahead of training.

    lmkit prepare --config config_transformer --train_file 'corpus/*.txt' --valid_file valid.txt \\
        --tokenizer sentencepiece --vocab_size 8000 [--data_cache /shared/lmkit-cache]

Takes ``lmkit train``'s flags (write your training command with ``prepare``
in place of ``train``) and stops where training would start: the tokenizer
is trained (or found) and kept in the data cache, and every split is
encoded by every core into the cache's token files (an encoder-decoder's
source and target files line by line, with both tokenizers when they differ). A later ``lmkit train``
with the same text, tokenizer settings and ``--data_cache``, in any model
folder, on any number of ranks, copies the tokenizer and maps the files
instead of encoding (a folder on a shared file system serves every host).
Nothing is written into a model folder; training flags (epochs, batch
size...) are accepted and ignored.

Exit status: 0 done, 2 bad input (one ``error:`` line), 75 stopped by SIGTERM,
SIGINT or SIGUSR1 (nothing half-written is left in the cache; run it again), 1 a crash.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import List, Optional

from lmkit.core.errors import UsageError

__all__ = ["main"]


def main(argv: Optional[List[str]] = None, prog: str = "lmkit prepare") -> int:
    """Encodes as the flags say; returns the exit status (errors are raised, see ``run_main``)."""
    from lmkit.cli.train import build_parser, config_from_args
    from lmkit.data.token_cache import cache_root

    parser = build_parser(prog, distributed=False)
    parser.description = __doc__.split("\n\n")[0].split(": ", 1)[1]
    args = parser.parse_args(argv)
    config = config_from_args(args, distributed=False)
    if config.data.kind not in ("text", "pairs"):
        raise UsageError("lmkit prepare encodes your own text; pass --train_file (or --source_file and "
                         "--target_file; PTB needs no preparing: lmkit train downloads and reads it)")
    cache = cache_root(config.data.data_cache)
    if cache is None:
        raise UsageError("--data_cache none leaves nothing to prepare; give a cache folder (or leave "
                         "the flag out for ~/.cache/lmkit/tokens)")

    from lmkit import distributed as dist
    from lmkit.core.preemption import set_doing
    from lmkit.train.run_data import load_run_data

    dist.init(backend="local")  # one process: the encoding uses every core itself
    start = time.perf_counter()
    def log(line: str) -> None:
        if not line.startswith("tokenizer: "):  # it names the temporary folder; the last line says where it is kept
            print(line, flush=True)

    set_doing(f"preparing the data cache {cache}")
    with tempfile.TemporaryDirectory(prefix="lmkit-prepare-") as folder:  # the tokenizer's first home
        data = load_run_data(config, os.path.join(folder, "model"), args.data_path, args.data_url,
                             verify=not args.no_verify_data, log=log)
    print(f"prepared in {time.perf_counter() - start:.1f} s: {data.vocab.name} tokenizer of "
          f"{data.vocab.vocab_size} ids and the token files in {cache}; `lmkit train` with the same "
          "flags reads them", flush=True)
    return 0
