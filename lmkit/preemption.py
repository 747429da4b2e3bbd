"""Preemption: a signal asks training to stop at the next step boundary, with a checkpoint.

Schedulers give notice before they take a machine: Slurm sends SIGTERM (or
the signal of ``--signal``), Kubernetes SIGTERM, spot instances a notice a
launcher turns into a signal. :class:`PreemptionWatcher` catches SIGTERM,
SIGINT and SIGUSR1 on every rank (directly, or forwarded by ``mpirun``,
``horovodrun`` or ``lmkit.launch``) and only raises a flag; the trainer
passes the flag into the compiled step, where it travels with the loss's
all-reduce, so every rank learns at the same step that some rank was
signalled, and all stop at the same step boundary. Rank 0 then writes a
checkpoint and every process exits with :data:`PREEMPTED_EXIT_STATUS`
("preempted, rerun to continue").

The grace period (``preemption_grace_seconds``, default 60 s) bounds the
whole stop: should it pass before the checkpoint is written, the process
leaves anyway with the same status, and the previous checkpoint, never
touched by a save in progress (saves are written aside and renamed into
place), is where the rerun continues. A second signal leaves at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any, Dict, Optional

from lmkit.errors import PreemptedError

__all__ = ["PREEMPTED_EXIT_STATUS", "PREEMPTION_SIGNALS", "PreemptionWatcher"]

PREEMPTED_EXIT_STATUS = PreemptedError.exit_code
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class PreemptionWatcher:
    """Turns the first preemption signal into a flag; a second one, or the grace period, ends the process.

    Use as a context manager around training (the handlers are installed on
    entry, in the main thread, and the previous ones put back on exit).

    Args:
      rank: this process's rank, for the messages.
      grace_seconds: time from the first signal to leaving, checkpoint or
        not; 0 waits without limit.
    """

    def __init__(self, rank: int, grace_seconds: float) -> None:
        self.rank = rank
        self.grace_seconds = grace_seconds
        self.signal_name: Optional[str] = None
        self.received_at: Optional[float] = None
        self._previous: Dict[int, Any] = {}
        self._done = threading.Event()

    @property
    def requested(self) -> bool:
        """True once a preemption signal reached this process."""
        return self.signal_name is not None

    def __enter__(self) -> "PreemptionWatcher":
        if threading.current_thread() is threading.main_thread():
            for sig in PREEMPTION_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.requested:  # a second signal: no more waiting
            self._leave(f"rank {self.rank}: second signal ({name}) while stopping for {self.signal_name}; "
                        "leaving at once, the previous checkpoint stays the latest")
        self.signal_name = name
        self.received_at = time.monotonic()
        if self.grace_seconds > 0:
            threading.Thread(target=self._grace, name="lmkit-preemption-grace", daemon=True).start()

    def _grace(self) -> None:
        if not self._done.wait(self.grace_seconds):
            self._leave(f"rank {self.rank}: the grace period of {self.grace_seconds:g} s after "
                        f"{self.signal_name} ran out before the checkpoint was written; leaving, the "
                        "previous checkpoint stays the latest (raise preemption_grace_seconds)")

    def stopped(self) -> None:
        """The stop is complete (checkpoint written): the grace timer has nothing left to do."""
        self._done.set()

    def _leave(self, message: str) -> None:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(PREEMPTED_EXIT_STATUS)
