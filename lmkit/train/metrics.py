"""Small metrics and logging helpers for the trainer (rank 0 prints)."""

from __future__ import annotations

import math
import sys
import time
from typing import Callable, Dict, Optional, TextIO


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


def duration(seconds: float) -> str:
    """``1h02m``, ``3m05s`` or ``42s``: a time left, short."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class StepLines:
    """The log of a run planned in steps: ``step S/N | loss L | lr R | T tokens/s | MFU M% | eta E`` lines.

    ``loss`` is the mean loss per token of the steps since the previous
    line, averaged over the workers; MFU is the model's FLOPs over the
    devices' peak (``-`` where the peak is not known, e.g. on CPUs).

    Args:
      total: the run's planned steps ``N``.
      every: a line every this many global steps (0: about 50 lines a run); the last step always has one.
      log: prints a line (rank 0's: the trainer's ``log``).
      flops_per_token: the model's training FLOPs per token (None: no MFU).
      peak_flops_tera: every device's peak together, in TFLOP/s (None: not known).
    """

    def __init__(self, total: int, every: int, log: Callable[[str], None], flops_per_token: Optional[float] = None,
                 peak_flops_tera: Optional[float] = None) -> None:
        self.total = total
        self.every = every or max(1, total // 50)
        self.log = log
        self.flops_per_token = flops_per_token
        self.peak = peak_flops_tera
        self._loss, self._count = 0.0, 0

    def due(self, step: int) -> bool:
        """Whether global step ``step`` (1-based: the steps done) gets a line."""
        return step % self.every == 0 or step >= self.total

    def add(self, loss_sum: float, steps: int) -> None:
        """Counts ``steps`` applied steps whose per-token losses sum to ``loss_sum``."""
        self._loss += loss_sum
        self._count += steps

    def show(self, step: int, lr: float, tokens_per_sec: float, steps_per_sec: float) -> str:
        """Logs (and returns) the line of ``step``; the loss restarts its average."""
        loss = f"{self._loss / self._count:.4f}" if self._count else "-"
        self._loss, self._count = 0.0, 0
        mfu = "-"
        if self.flops_per_token and self.peak:
            mfu = f"{100 * tokens_per_sec * self.flops_per_token / (self.peak * 1e12):.1f}%"
        eta = duration((self.total - step) / steps_per_sec) if steps_per_sec > 0 else "-"
        line = (f"step {step}/{self.total} | loss {loss} | lr {lr:.3g} | {tokens_per_sec:,.0f} tokens/s | "
                f"MFU {mfu} | eta {eta}")
        self.log(line)
        return line


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
