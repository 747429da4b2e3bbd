"""The one error type of :mod:`lmkit.data`."""

from __future__ import annotations

from lmkit.core.errors import UsageError

__all__ = ["DataError"]


class DataError(UsageError):
    """Data that cannot be used as given.

    The message names the file, address or value at fault and says how to fix
    it, e.g. ``batch_size 20 is not divisible by 3 workers; use a multiple of 3``.
    """
