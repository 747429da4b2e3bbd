"""Registries of named parts, loaded on first use (no TensorFlow import here).

lmkit's extension points (models, samplers, distributed backends,
tokenizers) each keep one dict from a name to ``"module:Class"``; the class is
imported only when the name is used, so listing the names (for a config
check or a command-line flag) stays cheap. A user's own part is named the
same way, by import path.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping, Sequence, Tuple

from lmkit.core.checks import did_you_mean
from lmkit.core.errors import UsageError

__all__ = ["import_object", "lookup", "names", "lazy_attributes"]


def import_object(path: str, what: str) -> Any:
    """The object at ``"package.module:Name"`` (``Name`` may be dotted).

    Args:
      path: the import path.
      what: what it names, for messages (``"model"``, ``"sampler"``).

    Raises:
      UsageError: not an import path, a module that does not import, or a
        missing name.
    """
    module_name, _, attr = str(path).partition(":")
    if not module_name or not attr:
        raise UsageError(f"{what} {path!r} is not an import path; write it as 'package.module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"{what} {path!r}: module {module_name!r} cannot be imported ({exc}); "
                         "install it or put its folder on PYTHONPATH") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"{what} {path!r}: module {module_name!r} has no {attr!r}; "
                             "check the name after the ':'")
        obj = getattr(obj, part)
    return obj


def lookup(registry: Mapping[str, str], name: Any, what: str) -> Any:
    """The object registered as ``name`` in ``registry`` (name -> ``"module:Class"``).

    Raises:
      UsageError: ``unknown <what> 'x'; did you mean 'y'? choices: ...``.
    """
    if not isinstance(name, str) or name not in registry:
        raise UsageError(f"unknown {what} {name!r}; {did_you_mean(name, registry)}")
    return import_object(registry[name], what)


def names(path: str, what: str) -> Tuple[str, ...]:
    """The names of the registry at ``path``: ``"package.module:NAME"`` naming a dict (its keys)
    or a sequence of names.

    A lower layer checks a name this way without importing the higher layer
    that owns the registry (``names("lmkit.data.tokenizers:TOKENIZERS",
    "tokenizers")``); the module is imported on the first call.

    Raises:
      UsageError: ``path`` does not resolve (see :func:`import_object`).
    """
    return tuple(import_object(path, what))


def lazy_attributes(package: str, modules: Sequence[str]) -> Callable[[str], Any]:
    """A package's module ``__getattr__`` (PEP 562) that finds a name in its ``modules``, imported on first use.

    A model family's ``__init__.py`` keeps its registry entries cheap to read (no TensorFlow import) while
    ``lmkit.models.gpt2.TransformerLanguageModel`` still works::

        __getattr__ = lazy_attributes(__name__, ("model",))

    The function raises AttributeError for a name none of the modules has.
    """
    def __getattr__(name: str) -> Any:
        for module in modules:
            found = importlib.import_module(f"{package}.{module}")
            if hasattr(found, name):
                return getattr(found, name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
