"""Ends a rank that stops making progress, so the launcher stops the whole job.

A rank stuck outside the collectives (a deadlock, a hung file system) leaves
the others waiting in the next collective forever: launchers end a job only
when a process exits, and Horovod's stall check only warns (and
``horovodrun --gloo`` has been seen to hang until SIGKILL).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from typing import Any, Optional

from lmkit.core.errors import UsageError

__all__ = ["COLLECTIVE_TIMEOUT_ENV", "DEFAULT_COLLECTIVE_TIMEOUT", "Watchdog"]

COLLECTIVE_TIMEOUT_ENV = "LMKIT_COLLECTIVE_TIMEOUT"
DEFAULT_COLLECTIVE_TIMEOUT = 300.0  # seconds without progress before a rank ends the job


class Watchdog:
    """Ends this process when training makes no progress for ``limit`` seconds.

    Training steps, evaluation batches and checkpoint saves report progress
    (:meth:`beat`); after ``limit`` seconds without any, this rank prints
    where it is stuck and exits with status 1, so the launcher stops the job.

    The first beat arms it (compiling the first step may take long);
    :meth:`pause` disarms it until the next beat (a rank waiting while rank
    0 alone evaluates and saves: rank 0's own watchdog covers that time). A
    rank waiting inside TensorFlow or Horovod (in a collective) gives the
    stuck rank a head start of ``max(5, limit / 5)`` seconds, so that the
    stuck rank is the one that reports.

    Args:
      rank: this process's rank, for the message.
      limit: seconds without progress; 0 turns the watchdog off.
    """

    def __init__(self, rank: int, limit: float) -> None:
        self.rank = rank
        self.limit = limit
        self._last: Optional[float] = None  # time of the last beat; None = not armed
        self._after: Any = "start-up"
        self._stop = threading.Event()
        if limit > 0:
            threading.Thread(target=self._watch, name="lmkit-watchdog", daemon=True).start()

    @classmethod
    def from_env(cls, rank: int, processes: int) -> "Watchdog":
        """Reads ``LMKIT_COLLECTIVE_TIMEOUT``; off in a single process (no peer to wait for).

        Raises:
          UsageError: the variable is not a number.
        """
        raw = os.environ.get(COLLECTIVE_TIMEOUT_ENV, "").strip()
        try:
            limit = float(raw) if raw else DEFAULT_COLLECTIVE_TIMEOUT
        except ValueError:
            raise UsageError(f"{COLLECTIVE_TIMEOUT_ENV}={raw!r} is not a number of seconds; "
                             "set it to e.g. 600, or 0 to turn the watchdog off") from None
        return cls(rank, limit if processes > 1 else 0.0)

    def beat(self, after: Any) -> None:
        """Records progress: ``after`` is the global step just finished, or what just happened."""
        self._after = after
        self._last = time.monotonic()

    def pause(self) -> None:
        """Disarms until the next :meth:`beat`."""
        self._last = None

    def stop(self) -> None:
        """Ends the watching thread."""
        self._stop.set()

    def _watch(self) -> None:
        head_start = max(5.0, self.limit / 5)
        while not self._stop.wait(min(2.0, self.limit / 10)):
            last = self._last
            if last is None:
                continue
            idle = time.monotonic() - last
            if idle < self.limit or self._stop.is_set():
                continue
            # Where is the main thread? Inside a library means waiting in a collective.
            frame = sys._current_frames().get(threading.main_thread().ident)
            stack = traceback.extract_stack(frame) if frame is not None else []
            own = [f for f in stack if "site-packages" not in f.filename
                   and "dist-packages" not in f.filename]
            waiting = bool(own) and stack[-1] is not own[-1]
            if waiting and idle < self.limit + head_start:
                continue
            self._report(idle, own, waiting)
            os._exit(1)

    def _report(self, idle: float, own: list, waiting: bool) -> None:
        after = (f"training step {self._after} finished" if isinstance(self._after, int)
                 else self._after)
        where = (f"{own[-1].filename}:{own[-1].lineno} in {own[-1].name} ({own[-1].line})"
                 if own else "an unknown place")
        why = ("waiting inside TensorFlow/Horovod (a collective operation waits for every "
               "rank): another rank is stuck or gone" if waiting else
               "the other ranks wait for this one in the next collective operation")
        sys.stderr.write(
            f"rank {self.rank} failed: no progress for {idle:.0f} s since {after}; it is at "
            f"{where}, {why}. Ending this rank so that the launcher stops the job "
            f"({COLLECTIVE_TIMEOUT_ENV}={self.limit:g} s; raise it if a step, an evaluation "
            "or a checkpoint save may take longer, 0 turns this check off)\n")
        sys.stderr.flush()
        sys.stdout.flush()
