"""Public text corpora that ``lmkit download`` fetches by name, each file checked by its hash.

A corpus is a few plain-text files at a fixed address (a commit of a public
repository, so the bytes never change) with each file's git blob SHA-1
(the id ``git hash-object`` gives it). :func:`fetch_corpus` downloads the
files that are missing, checks each one, and renames them into place only
when all passed: a failure leaves the folder as it was.

Adding a corpus takes one :class:`Corpus` and one line in :data:`CORPORA`.
PTB has its own module (:mod:`lmkit.data.ptb`: an archive, a fallback).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Dict, Mapping, Optional

from lmkit.core.checks import did_you_mean
from lmkit.core.errors import UsageError
from lmkit.core.fileio import work_folder
from lmkit.data.download import download, file_blob_sha1
from lmkit.data.errors import DataError

__all__ = ["Corpus", "CORPORA", "URL_ENV", "fetch_corpus", "corpus_files_present"]

URL_ENV = "LMKIT_CORPUS_URL"  # a mirror: the folder that holds the corpus's files


@dataclass(frozen=True)
class Corpus:
    """A downloadable corpus.

    Attributes:
      name: what ``lmkit download NAME`` calls it.
      url: the folder (http(s) or file://) holding the files.
      files: file name -> git blob SHA-1 of its bytes.
      about: one line: what it is, its size, its licence.
      max_bytes: the size cap of each file's download (a mirror serving
        something else stops there instead of filling the disk).
    """

    name: str
    url: str
    files: Mapping[str, str]
    about: str
    max_bytes: int = 64 << 20


WIKITEXT_2 = Corpus(
    name="wikitext-2",
    # The word-level WikiText-2 of PyTorch's examples, at the commit that last changed it.
    url=("https://raw.githubusercontent.com/pytorch/examples/d5678bc8ac0cdd79dbd5e44d4130271018bcec4e/"
         "word_language_model/data/wikitext-2"),
    files={"train.txt": "2d84b35af79e411d73ea7cae83c73964c6ac83b4",
           "valid.txt": "eec944eb2d9e46061cd34a6913528797db6842fc",
           "test.txt": "6f3fc88e4cd88456ea892971f9f12243e8428624"},
    about="WikiText-2 (Merity et al. 2016), word level, rare words as <unk>: train 2.09M tokens "
          "(about 11 MB), valid 218k, test 246k; CC BY-SA 3.0",
)

#: name -> corpus
CORPORA: Dict[str, Corpus] = {c.name: c for c in (WIKITEXT_2,)}


def corpus_files_present(corpus: Corpus, folder: str) -> bool:
    """True when every file of ``corpus`` is in ``folder``."""
    return all(os.path.isfile(os.path.join(folder, name)) for name in corpus.files)


def fetch_corpus(name: str, folder: str, url: Optional[str] = None, *, verify: bool = True,
                 progress: bool = True, retries: int = 3, timeout: float = 60.0,
                 backoff: float = 1.0) -> Dict[str, str]:
    """Downloads the files of corpus ``name`` into ``folder``; returns file name -> path.

    Files already in ``folder`` are kept as they are (not downloaded, not
    checked: they may be your own copy). The others arrive under temporary
    names, are checked against their git blob SHA-1, and are renamed into
    place together once all passed.

    Args:
      name: a key of :data:`CORPORA`.
      folder: where the files go (created when missing).
      url: a mirror holding the same file names; default ``$LMKIT_CORPUS_URL``,
        else the corpus's own address.
      verify: check each download's hash; False accepts other bytes (a mirror
        with another version).
      progress, retries, timeout, backoff: as :func:`lmkit.data.download.download`.

    Raises:
      UsageError: an unknown corpus name (the known ones listed).
      DataError: a download failed, or a file's hash differs (naming the file,
        both hashes and the fix). Nothing is left half-written.
    """
    if name not in CORPORA:
        raise UsageError(f"unknown corpus {name!r}; {did_you_mean(name, CORPORA)}")
    corpus = CORPORA[name]
    base = (url or os.environ.get(URL_ENV) or corpus.url).rstrip("/")
    paths = {n: os.path.join(folder, n) for n in corpus.files}
    missing = [n for n, p in paths.items() if not os.path.isfile(p)]
    if not missing:
        return paths
    try:
        with work_folder(folder, f".{corpus.name}-download-") as work:
            temps = {n: os.path.join(work, n) for n in missing}
            for n in missing:
                address = f"{base}/{n}"
                if progress:
                    print(f"{corpus.name}: downloading {n} from {address}", file=sys.stderr, flush=True)
                download(address, temps[n], retries=retries, progress=progress, timeout=timeout,
                         backoff=backoff, label=n, max_bytes=corpus.max_bytes)
                found = file_blob_sha1(temps[n])
                if verify and found != corpus.files[n]:
                    raise DataError(
                        f"{address}: {n} has git blob SHA-1 {found}, expected {corpus.files[n]}; the "
                        f"download is corrupt or another version of {corpus.name}, so nothing was "
                        "kept. Try again or another mirror (--url), or pass --no_verify to keep it anyway")
            for n in missing:
                os.replace(temps[n], paths[n])
    except OSError as exc:
        raise DataError(f"cannot write {corpus.name} into {folder} ({exc}); pass a writable folder") from None
    return paths
