"""Old module names of lmkit, and where each one lives now (no TensorFlow import).

lmkit 0.3 laid the package out by the data flow (``core``, ``config``,
``layers``, ``models``, ``hub``, ``data``, ``decoding``, ``train``,
``optim``, ``distributed``, ``cli``). Code written for 0.2 keeps working for
one release: importing an old name gives a :class:`DeprecationWarning` that
names the new home, and a module object that forwards every attribute to it
(``from lmkit.modules.llama import RMSNorm`` still works). A name that left
its module has its own line in :data:`NAMES`; one that is gone for good
(``lmkit.dist``) is an ``ImportError`` naming its replacement.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings
from typing import Any, Dict, Optional, Sequence

__all__ = ["MODULES", "NAMES", "GONE", "install", "new_home"]

#: old module -> the module that holds its contents now
MODULES: Dict[str, str] = {
    "lmkit.attention_kernels": "lmkit.layers.kernels",
    "lmkit.chat": "lmkit.hub.chat",
    "lmkit.checks": "lmkit.core.checks",
    "lmkit.cli.data": "lmkit.data.pipeline",
    "lmkit.console": "lmkit.core.console",
    "lmkit.data.hf_tokenizer": "lmkit.hub.tokenizer",
    "lmkit.errors": "lmkit.core.errors",
    "lmkit.fileio": "lmkit.core.fileio",
    "lmkit.generation": "lmkit.decoding.generation",
    "lmkit.hf": "lmkit.hub.hf",
    "lmkit.hf_bart": "lmkit.hub.hf_bart",
    "lmkit.hf_llama": "lmkit.hub.hf_llama",
    "lmkit.layout": "lmkit.core.layout",
    "lmkit.lora": "lmkit.models.build",
    "lmkit.losses": "lmkit.train.losses",
    "lmkit.models.base": "lmkit.models.protocols",
    "lmkit.models.rnn_seq2seq": "lmkit.models.rnn.seq2seq",
    "lmkit.models.transformer": "lmkit.models.gpt2.model",
    "lmkit.models.transformer_seq2seq": "lmkit.models.bart.model",
    "lmkit.modules": "lmkit.layers",
    "lmkit.modules.attention_rnn": "lmkit.layers.attention_rnn",
    "lmkit.modules.base": "lmkit.layers.base",
    "lmkit.modules.cells": "lmkit.layers.cells",
    "lmkit.modules.cudnn_attention": "lmkit.layers.kernels.cudnn",
    "lmkit.modules.embedders": "lmkit.layers.embeddings",
    "lmkit.modules.encoder_decoder": "lmkit.layers.encoder_decoder",
    "lmkit.modules.llama": "lmkit.layers.llama",
    "lmkit.modules.lora": "lmkit.layers.lora",
    "lmkit.modules.projection": "lmkit.layers.projection",
    "lmkit.modules.rnn": "lmkit.layers.rnn",
    "lmkit.modules.transformer": "lmkit.layers.transformer",
    "lmkit.precision": "lmkit.layers.precision",
    "lmkit.preemption": "lmkit.core.preemption",
    "lmkit.progress": "lmkit.core.progress",
    "lmkit.registry": "lmkit.core.registry",
    "lmkit.transduction": "lmkit.decoding.transduction",
    "lmkit.xla": "lmkit.core.xla",
}

#: ``old.module.Name`` -> ``new.module:Name``, for names that left the module of :data:`MODULES`
NAMES: Dict[str, str] = {}

#: old module -> what replaces it; importing it fails with a message that says so
GONE: Dict[str, str] = {
    "lmkit.dist": "lmkit.distributed (`from lmkit import distributed as dist`)",
}


def new_home(old: str) -> Optional[str]:
    """Where the module or name ``old`` (dotted) lives now, or None when it did not move."""
    if old in MODULES:
        return MODULES[old]
    module, _, name = old.rpartition(".")
    if old in NAMES:
        return NAMES[old].replace(":", ".")
    if module in MODULES:
        return f"{MODULES[module]}.{name}"
    return None


class _Moved(types.ModuleType):
    """An old module name: every attribute read comes from the new module (or the new home of the name)."""

    def __getattr__(self, name: str) -> Any:
        old = f"{self.__name__}.{name}"
        if old in NAMES:
            module, _, attr = NAMES[old].partition(":")
            return getattr(importlib.import_module(module), attr)
        target = importlib.import_module(MODULES[self.__name__])
        try:
            return getattr(target, name)
        except AttributeError:
            raise AttributeError(f"{self.__name__} (now {target.__name__}) has no {name!r}") from None


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Optional[Sequence[str]], target: Optional[types.ModuleType] = None):
        if name in MODULES or name in GONE:
            return importlib.util.spec_from_loader(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        if spec.name in GONE:
            raise ImportError(f"{spec.name} was removed in lmkit 0.3; use {GONE[spec.name]}", name=spec.name)
        warnings.warn(f"{spec.name} is now {MODULES[spec.name]}; import it from there (the old name goes in "
                      "the next release)", DeprecationWarning, stacklevel=3)
        module = _Moved(spec.name)
        module.__path__ = []  # a package, so that old submodule names import too
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install() -> None:
    """Puts the finder of old names on ``sys.meta_path`` (once); ``import lmkit`` calls it."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
