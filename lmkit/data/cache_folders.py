"""The data cache's temporary folders: their names, and the sweep of those killed writers left.

The token cache (:mod:`lmkit.data.token_cache`) and the tokenizer cache
(:mod:`lmkit.data.tokenizers`) write into ``<cache>/.tmp-<key>-<random>``
folders (:class:`lmkit.core.fileio.TempFolder`), renamed into place when
whole; the next writer into the cache removes the ones whose writer died.
"""

from __future__ import annotations

import re
from typing import Callable, Tuple

from lmkit.core import fileio

__all__ = ["TEMP_PREFIX", "sweep_temp_folders"]

#: The names of temporary folders in the cache: ``.tmp-<key>-<random>``.
TEMP_PREFIX = ".tmp-"
_OLD_TOKENIZER_TEMP = re.compile(r"tokenizer-.+\.tmp\d+")  # the tokenizer cache's, before locks


def sweep_temp_folders(root: str, log: Callable[[str], None] = lambda line: None) -> Tuple[int, int]:
    """Removes the temporary folders in the cache ``root`` that killed encodings (or tokenizer saves)
    left behind (:func:`lmkit.core.fileio.sweep_temp_folders`); one log line when it removed any.

    Returns:
      ``(folders removed, bytes freed)``.
    """
    return fileio.sweep_temp_folders(
        root, lambda name: name.startswith(TEMP_PREFIX) or bool(_OLD_TOKENIZER_TEMP.fullmatch(name)),
        log, what="encodings", where=f"the data cache {root}")
