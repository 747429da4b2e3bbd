"""Small metrics and logging helpers for the trainer (rank 0 prints)."""

from __future__ import annotations

import math
import sys
import time
from typing import Dict, Optional, TextIO


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
        self._printed = 0  # the step of the last line (non-terminal output)

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
        elif step - self._printed >= self.every or step == self.total:
            self._printed = step
            self.stream.write(f"{self.prefix} step {step}/{self.total} {text}\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def scalar_summary(name: str, value: float) -> None:
    """What ``tf.summary.scalar`` writes, without needing TensorBoard installed.

    ``tf.summary.scalar`` lives in the TensorBoard package, which TensorFlow
    2.20+ no longer installs; ``tf.summary.write`` is TensorFlow's own, and the
    "scalars" plugin tag makes TensorBoard show the value as a scalar.
    """
    import tensorflow as tf
    from tensorflow.core.framework import summary_pb2

    metadata = summary_pb2.SummaryMetadata()
    metadata.plugin_data.plugin_name = "scalars"
    tf.summary.write(name, tf.constant(value, tf.float32), metadata=metadata)


class Summaries:
    """TensorBoard scalars of a run in ``<folder>`` (rank 0 only; a no-op elsewhere).

    Args:
      folder: where the event files go; None writes nothing.
    """

    def __init__(self, folder: Optional[str]) -> None:
        self._writer = None
        if folder is not None:
            import tensorflow as tf
            self._writer = tf.summary.create_file_writer(folder)

    def write(self, step: int, values: Dict[str, Optional[float]]) -> None:
        """Writes every value that is not None at ``step`` and flushes."""
        if self._writer is None:
            return
        with self._writer.as_default(step=step):
            for name, value in values.items():
                if value is not None:
                    scalar_summary(name, value)
        self._writer.flush()
