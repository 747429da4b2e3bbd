"""Progress lines for long work outside training (encoding, evaluation): rate and time left, every few seconds."""

from __future__ import annotations

import sys
import time
from typing import Callable

__all__ = ["rate_progress", "stderr_line"]


def stderr_line(line: str) -> None:
    """Prints a progress line on stderr (stdout carries a command's results)."""
    print(line, file=sys.stderr, flush=True)


def rate_progress(log: Callable[[str], None], what: str, total: float, *, unit: str, scale: float = 1.0,
                  digits: int = 0, every: float = 2.0) -> Callable[..., None]:
    """A callback ``update(done, final=False)`` that logs ``what: done/total unit, rate unit/s, about N s left``.

    A line is logged at most every ``every`` seconds (none for work that ends
    sooner), and always for ``final=True`` (without the time left). Amounts
    are divided by ``scale`` (1e6 for MB) and shown with ``digits`` decimals.
    """
    start = last = time.perf_counter()

    def update(done: float, final: bool = False) -> None:
        nonlocal last
        now = time.perf_counter()
        if not final and now - last < every:
            return
        last = now
        rate = done / max(now - start, 1e-9)
        eta = (total - done) / rate if rate > 0 else float("inf")
        log(f"{what}: {done / scale:.{digits}f}/{total / scale:.{digits}f} {unit}, {rate / scale:.1f} {unit}/s"
            + ("" if final else f", about {eta:.0f} s left"))
    return update
