"""Small metrics and logging helpers for the trainer (rank 0 prints)."""

from __future__ import annotations

import math
import sys
import time
from typing import Optional, TextIO


def perplexity(mean_loss_per_word: float) -> float:
    """exp(loss), capped so a diverged run prints ``inf`` rather than raising."""
    if not math.isfinite(mean_loss_per_word):
        return float("nan")
    return math.exp(min(mean_loss_per_word, 700.0))


class ProgressBar:
    """A one-line progress display on a terminal; periodic lines elsewhere.

    Args:
      total: number of steps in the epoch.
      prefix: text before the bar (e.g. ``"epoch 3/13"``).
      stream: where to write (stderr by default).
      enabled: False on ranks other than 0.
    """

    def __init__(self, total: int, prefix: str, stream: Optional[TextIO] = None,
                 enabled: bool = True, every: int = 0) -> None:
        self.total = max(1, total)
        self.prefix = prefix
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.every = every or max(1, self.total // 10)
        self.start = time.perf_counter()

    def update(self, step: int, text: str = "") -> None:
        """Shows progress after ``step`` steps (1-based)."""
        if not self.enabled:
            return
        if self.tty:
            width = 30
            filled = int(width * step / self.total)
            bar = "#" * filled + "." * (width - filled)
            self.stream.write(f"\r{self.prefix} [{bar}] {step}/{self.total} {text}   ")
            self.stream.flush()
        elif step % self.every == 0 or step == self.total:
            self.stream.write(f"{self.prefix} step {step}/{self.total} {text}\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
