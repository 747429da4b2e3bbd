"""Deprecated: the old name of :mod:`lmkit.distributed`, kept for one release.

``lmkit/dist`` read like a build-output folder: pytest's default
``norecursedirs``, ``.gitignore``'s ``dist/`` and linters' default excludes
all skip such folders. ``import lmkit.dist`` (and ``lmkit.dist.env`` etc.)
still works and gives the very modules of :mod:`lmkit.distributed` (one
backend state, the same classes), with a :class:`DeprecationWarning`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Optional, Sequence

OLD, NEW = __name__, "lmkit.distributed"

warnings.warn(f"{OLD} is deprecated and will be removed in the next release; import {NEW} "
              "instead (e.g. `from lmkit import distributed as dist`)", DeprecationWarning, stacklevel=2)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``lmkit.dist.X`` as the module ``lmkit.distributed.X`` itself (no second copy)."""

    def find_spec(self, name: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None):
        if not name.startswith(OLD + "."):
            return None
        real = importlib.import_module(NEW + name[len(OLD):])
        spec = importlib.util.spec_from_loader(name, self)
        spec.loader_state = (real, real.__spec__)
        return spec

    def create_module(self, spec):
        return spec.loader_state[0]

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = module.__spec__.loader_state[1]  # the import gave it the alias's spec


if not any(isinstance(f, _Alias) for f in sys.meta_path):
    sys.meta_path.insert(0, _Alias())
sys.modules[OLD] = importlib.import_module(NEW)
