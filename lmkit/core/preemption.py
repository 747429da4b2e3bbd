"""Preemption: a signal stops a command; during training, at the next step boundary with a checkpoint.

Schedulers give notice before they take a machine: Slurm sends SIGTERM (or
the signal of ``--signal``), Kubernetes SIGTERM, spot instances a notice a
launcher turns into a signal. Every ``lmkit`` command (and every script that
goes through :func:`lmkit.cli.common.run_main`) answers SIGTERM, SIGINT and
SIGUSR1 from its first line to its last with exit status
:data:`PREEMPTED_EXIT_STATUS` ("preempted, rerun to continue"), so a job
script that requeues on 75 requeues whatever the job was doing:

* outside training (:func:`install`: the corpus encoded, the tokenizer
  trained, weights loaded, a checkpoint restored, the test split evaluated
  after training) the first signal raises :class:`PreemptionSignal` in the
  main thread. Clean-ups run as the exception passes (the data cache's
  half-written folder is removed), and ``run_main`` prints one line saying
  the signal, what was being done (:func:`doing`) and that rerunning the
  same command continues. A rank waiting in a collective is in C, where its
  own handler cannot run: work that rank 0 does while the others wait sends
  the stop to them through that collective (:func:`as_error`), and past that
  rank 0's leaving ends their wait (Horovod's shutdown); whatever they see
  then, a process that got a signal exits 75;
* during training, :class:`PreemptionWatcher` catches the signals on every
  rank (directly, or forwarded by ``mpirun``, ``horovodrun`` or
  ``lmkit.launch``) and only raises a flag; the trainer passes the flag into
  the compiled step, where it travels with the loss's all-reduce, so every
  rank learns at the same step that some rank was signalled, and all stop at
  the same step boundary. Rank 0 then writes a checkpoint and every process
  exits 75.

The grace period (``preemption_grace_seconds``, default 60 s; outside
training :data:`STARTUP_GRACE_SECONDS`) bounds the whole stop: should it pass
before the process has left, it leaves anyway with the same status, and the
previous checkpoint, never touched by a save in progress (saves are written
aside and renamed into place), is where the rerun continues. A second signal
leaves at once. Helper processes (the token cache's encoders) ignore SIGINT
and SIGUSR1 sent to the whole process group and are stopped by their parent
(:func:`detach_worker`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterator, Optional, TypeVar

from lmkit.core.errors import PreemptedError

__all__ = ["PREEMPTED_EXIT_STATUS", "PREEMPTION_SIGNALS", "STARTUP_GRACE_SECONDS", "PreemptionSignal",
           "PreemptionWatcher", "as_error", "detach_worker", "doing", "install", "leaving", "received", "reclaim",
           "set_doing", "signals_held", "stop_message"]

T = TypeVar("T")

PREEMPTED_EXIT_STATUS = PreemptedError.exit_code
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

#: Seconds from a signal outside training to leaving, stopped cleanly or not (the default
#: ``preemption_grace_seconds``): a rank blocked in a collective whose peer never comes leaves then.
STARTUP_GRACE_SECONDS = 60.0

_NOTHING_LOST = "nothing is lost (what was written before stays, nothing half-written is kept)"


class PreemptionSignal(BaseException):
    """Raised in the main thread by the first preemption signal outside training.

    A :class:`BaseException`, as ``KeyboardInterrupt`` is: an ``except
    Exception`` that calls any failure its own (a checkpoint reader that calls
    it damage, a download that tries the next mirror) lets it pass, while
    clean-ups (``finally``, ``except BaseException: ...; raise``) still run.
    :func:`lmkit.cli.common.run_main` turns it into one line and exit status 75.
    """


class _Command:
    """This process's command-wide handlers: what it is doing, and the first signal it got."""

    def __init__(self) -> None:
        self.pid: Optional[int] = None  # the process that installed the handlers (a fork inherits them)
        self.rank = 0
        self.doing = "starting up"
        self.kept = _NOTHING_LOST
        self.signal_name: Optional[str] = None  # the first preemption signal, here or in a watcher
        self.message = ""
        self.leaving = False  # the command is done or failing: a first signal is only noted


_COMMAND = _Command()


class PreemptionWatcher:
    """Turns the first preemption signal into a flag; a second one, or the grace period, ends the process.

    Use as a context manager around training (the handlers are installed on
    entry, in the main thread, and the previous ones, the command's, put back
    on exit).

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
        # The command's handlers again (lmkit.cli: a signal raises PreemptionSignal): the last checkpoint
        # is written, and a signal in what follows (the test split's evaluation, results.json) keeps it.
        set_doing("finishing after training (the test split's evaluation, results.json)",
                  kept="the trained model's last checkpoint is kept")
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.requested:  # a second signal: no more waiting
            _leave(f"rank {self.rank}: second signal ({name}) while stopping for {self.signal_name}; "
                   "leaving at once, the previous checkpoint stays the latest")
        self.signal_name = name
        self.received_at = time.monotonic()
        # Whatever fails after this (a peer that left first, say) ends the command with 75 too.
        _note(name, f"stopped by {name} during training; the last checkpoint stays the latest; rerun the "
                    "same command to continue")
        if self.grace_seconds > 0:
            threading.Thread(target=self._grace, name="lmkit-preemption-grace", daemon=True).start()

    def _grace(self) -> None:
        if not self._done.wait(self.grace_seconds):
            _leave(f"rank {self.rank}: the grace period of {self.grace_seconds:g} s after "
                   f"{self.signal_name} ran out before the checkpoint was written; leaving, the "
                   "previous checkpoint stays the latest (raise preemption_grace_seconds)")

    def stopped(self) -> None:
        """The stop is complete (checkpoint written): the grace timer has nothing left to do."""
        self._done.set()


def install(rank: int = 0) -> None:
    """Makes SIGTERM, SIGINT and SIGUSR1 stop this command with exit status 75 (once per process).

    The first signal raises :class:`PreemptionSignal` in the main thread,
    wherever it is (``run_main`` prints it and exits 75); a second one leaves
    at once, as does a process still running :data:`STARTUP_GRACE_SECONDS`
    after the first. Does nothing outside the main thread, where Python
    cannot install handlers.

    Args:
      rank: this process's rank (the launcher's), for the messages.
    """
    if _COMMAND.pid == os.getpid() or threading.current_thread() is not threading.main_thread():
        return
    _COMMAND.pid, _COMMAND.rank = os.getpid(), rank
    for sig in PREEMPTION_SIGNALS:
        signal.signal(sig, _on_signal)


def reclaim() -> None:
    """Installs the command's handlers again, when :func:`install` put them in this process.

    C++ code may take a signal for itself without passing it on: the native
    backend's start-up (TensorFlow's coordination service) takes SIGTERM, and
    from then on Python's handler would never run.
    """
    if _COMMAND.pid == os.getpid() and threading.current_thread() is threading.main_thread():
        for sig in PREEMPTION_SIGNALS:
            signal.signal(sig, _on_signal)


def set_doing(what: str, kept: Optional[str] = None) -> None:
    """Says what the command does from now on (the message of a signal names it).

    Args:
      what: e.g. ``"encoding train_file into the data cache"``.
      kept: what a stop now leaves behind; default: nothing is lost.
    """
    _COMMAND.doing, _COMMAND.kept = what, kept or _NOTHING_LOST


@contextlib.contextmanager
def doing(what: str, kept: Optional[str] = None) -> Iterator[None]:
    """:func:`set_doing` for the ``with`` block; what was done before is named again after it."""
    previous = _COMMAND.doing, _COMMAND.kept
    set_doing(what, kept)
    try:
        yield
    finally:
        _COMMAND.doing, _COMMAND.kept = previous


def as_error(fn: Callable[[], T]) -> Callable[[], T]:
    """``fn`` with a preemption signal during it raised as a :class:`~lmkit.core.errors.PreemptedError`.

    For work that rank 0 does while the others wait (``dist.run_on_chief``
    sends an ``Exception`` of rank 0 to every rank): every rank then stops
    at the same point, rather than waiting in a collective for a rank that
    left. The clean-ups inside ``fn`` have run by then.
    """
    def run() -> T:
        try:
            return fn()
        except PreemptionSignal as exc:
            raise PreemptedError(str(exc)) from None
    return run


def received() -> Optional[str]:
    """The name of the first preemption signal this process got (here or in a watcher), else None."""
    return _COMMAND.signal_name


def stop_message() -> str:
    """The line that says which signal stopped the command, while doing what, and what to do now."""
    return _COMMAND.message


def leaving() -> None:
    """The command finished or is failing: a first signal from now on is only noted (a second one still
    leaves at once), so it cannot break the way out with an exception."""
    _COMMAND.leaving = True


def detach_worker(parent_pid: int) -> None:
    """In a helper process (an encoding worker): its parent stops it, not a terminal's or a launcher's signal.

    Ctrl-C reaches the terminal's whole process group, and ``mpirun`` passes
    SIGUSR1 to each rank's: a worker that died of it would break its pool
    (and print a ``KeyboardInterrupt`` traceback) while its parent stops
    cleanly, shutting the pool down. So SIGINT and SIGUSR1 are ignored here.
    SIGTERM keeps its default action: ``ProcessPoolExecutor`` ends the workers
    of a broken pool (one killed by the OOM killer) with it, and a worker that
    ignored it would hang its parent's shutdown. Should the parent die without
    shutting the pool down (SIGKILL, a second signal), the kernel ends the
    worker too (Linux).
    """
    for sig in (signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # started inside signals_held(): SIGTERM must reach it again
        signal.pthread_sigmask(signal.SIG_UNBLOCK, PREEMPTION_SIGNALS)
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent's shutdown still ends it
        pass
    if os.getppid() != parent_pid:  # the parent died before the line above
        os._exit(1)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Holds the preemption signals back for the ``with`` block (main thread); they arrive when it ends.

    Processes started inside inherit the mask: a signal sent to the whole
    process group (``mpirun``'s SIGUSR1, Ctrl-C) cannot end a pool's worker
    before :func:`detach_worker` has set it up, nor multiprocessing's resource
    tracker, which ignores SIGINT and SIGTERM but not SIGUSR1 (its death
    prints a warning and tracebacks). Start a pool and its workers inside it.
    """
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, PREEMPTION_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _on_signal(signum: int, frame: Any) -> None:
    if os.getpid() != _COMMAND.pid:
        return  # a forked helper (the console's filter) runs on until its pipe ends
    name = signal.Signals(signum).name
    if _COMMAND.signal_name is not None:
        _leave(f"rank {_COMMAND.rank}: second signal ({name}) while stopping for {_COMMAND.signal_name}; "
               "leaving at once")
    _note(name, f"stopped by {name} while {_COMMAND.doing}; {_COMMAND.kept}; rerun the same command to continue")
    threading.Thread(target=_grace, args=(_COMMAND.doing,), name="lmkit-preemption-grace", daemon=True).start()
    if not _COMMAND.leaving:
        raise PreemptionSignal(_COMMAND.message)


def _note(name: str, message: str) -> None:
    _COMMAND.signal_name, _COMMAND.message = name, message


def _grace(what: str) -> None:
    time.sleep(STARTUP_GRACE_SECONDS)
    _leave(f"rank {_COMMAND.rank}: still running {STARTUP_GRACE_SECONDS:g} s after {_COMMAND.signal_name} "
           f"(while {what}); leaving")


def _leave(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(PREEMPTED_EXIT_STATUS)
