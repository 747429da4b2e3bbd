"""``lmkit download``: fetch a public corpus to train on, each file checked by its hash.

    lmkit download wikitext-2                   # into data/wikitext-2
    lmkit download wikitext-2 --dir /data/wt2 [--url MIRROR] [--no_verify]
    lmkit download ptb --dir data/ptb           # what lmkit train --data_path does itself
    lmkit download --list

Files already in the folder are kept (no download); the others are checked
against their git blob SHA-1 and renamed into place together, so a failed
or corrupt download leaves nothing behind. The last line names the files.

Exit status: 0 done, 2 bad input or a failed download (one ``error:`` line), 1 a crash.
"""

from __future__ import annotations

import argparse
import os
from typing import List, Optional

__all__ = ["main"]


def build_parser(prog: str) -> argparse.ArgumentParser:
    from lmkit.data.corpora import CORPORA, URL_ENV
    names = ", ".join(["ptb", *CORPORA])
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("corpus", nargs="?", help=f"which corpus: {names}")
    parser.add_argument("--dir", default=None, help="the folder to write (default data/<corpus>)")
    parser.add_argument("--url", default=None,
                        help=f"a mirror: the folder holding the same files (default ${URL_ENV}, "
                             "else the corpus's own address; for ptb: simple-examples.tgz's address)")
    parser.add_argument("--no_verify", action="store_true",
                        help="keep downloads whose hash differs (another version, a repacked mirror)")
    parser.add_argument("--list", action="store_true", help="list the corpora and exit")
    return parser


def main(argv: Optional[List[str]] = None, prog: str = "lmkit download") -> int:
    """Downloads as the flags say; returns the exit status (errors are raised, see ``run_main``)."""
    from lmkit.core.errors import UsageError
    from lmkit.data.corpora import CORPORA, fetch_corpus

    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.list:
        print("ptb         Penn Treebank (Mikolov's simple-examples): 929k/73k/82k words, 10k vocabulary")
        for corpus in CORPORA.values():
            print(f"{corpus.name:<11} {corpus.about}")
        return 0
    if not args.corpus:
        raise UsageError(f"name a corpus, e.g. `{prog} wikitext-2` (`{prog} --list` lists them)")
    known = ["ptb", *CORPORA]
    if args.corpus not in known:
        from lmkit.core.checks import did_you_mean
        raise UsageError(f"unknown corpus {args.corpus!r}; {did_you_mean(args.corpus, known)}")
    folder = args.dir or os.path.join("data", args.corpus)
    if args.corpus == "ptb":
        from lmkit.data.ptb import PTB_FILES, PTB_VOCAB_SIZE, ensure_ptb
        found = ensure_ptb(folder, url=args.url, verify=not args.no_verify,
                           expected_vocab_size=None if args.no_verify else PTB_VOCAB_SIZE)
        paths = [os.path.join(found, name) for name in PTB_FILES]
    else:
        paths = list(fetch_corpus(args.corpus, folder, url=args.url, verify=not args.no_verify).values())
    print(f"{args.corpus}: {', '.join(paths)}")
    return 0
