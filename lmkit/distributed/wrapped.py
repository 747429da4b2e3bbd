"""``python -m lmkit.launch --mpirun ARGS...`` (or ``--horovodrun``, ``--mpiexec``): a Horovod job whose
ranks a scheduler's signal stops with a checkpoint.

Open MPI's ``mpirun`` cannot forward SIGTERM (it sends the ranks SIGCONT,
SIGTERM only ``odls_base_sigkill_timeout`` seconds later and SIGKILL as long
after that, then exits 1), and ``horovodrun`` over MPI runs mpirun under
``sh -c``, which dies of a signal without passing it on. :func:`run_wrapped`
runs the launcher and turns SIGTERM, SIGINT and SIGUSR1 sent to this process
into SIGUSR1 to each Open MPI launcher in its process tree, which mpirun
forwards at once to every rank on every host (``horovodrun --gloo``: SIGTERM
to horovodrun, which passes it to the ranks); it exits with the launcher's
status (75 after a preemption through mpirun).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from lmkit.core.errors import UsageError
from lmkit.core.preemption import PREEMPTION_SIGNALS

__all__ = ["WRAPPED_LAUNCHERS", "PREEMPTION_WAIT", "run_wrapped", "mpi_launchers_below", "main_wrapped"]

# How long the ranks (or workers) may take to finish a preemption stop after the first one left.
PREEMPTION_WAIT = 120.0
# `python -m lmkit.launch --NAME ARGS...` runs launcher NAME with ARGS (a Horovod job).
WRAPPED_LAUNCHERS = ("mpirun", "mpiexec", "horovodrun")
# Process names of Open MPI's launcher (mpirun and mpiexec are links to orterun; 5.x: prterun).
_OPEN_MPI_LAUNCHERS = ("mpirun", "mpiexec", "orterun", "prterun")
# Signals received before the wrapper ends the launcher itself (the first two are passed on).
_GIVE_UP = 3


def _children_by_parent(proc_root: str = "/proc") -> Dict[int, List[Tuple[int, str]]]:
    """Every process's children as (pid, name), from ``/proc/PID/stat``."""
    children: Dict[int, List[Tuple[int, str]]] = {}
    for entry in os.listdir(proc_root):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc_root, entry, "stat")) as f:
                stat = f.read()
        except OSError:  # gone since the listing
            continue
        # "pid (name) state ppid ...": the name may hold spaces and parentheses.
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append((int(entry), name))
    return children


def mpi_launchers_below(pid: int, proc_root: str = "/proc") -> List[int]:
    """The Open MPI launchers (mpirun, mpiexec, orterun, prterun) among ``pid`` and its
    descendants, outermost first; their own descendants (ranks, orted) are not searched."""
    children = _children_by_parent(proc_root)
    name = ""
    try:
        with open(os.path.join(proc_root, str(pid), "comm")) as f:
            name = f.read().strip()
    except OSError:
        pass
    found, todo = [], [(pid, name)]
    while todo:
        p, n = todo.pop(0)
        if n in _OPEN_MPI_LAUNCHERS:
            found.append(p)
            continue
        todo.extend(children.get(p, []))
    return found


def _die_with_parent() -> None:
    """In the launcher's child: SIGTERM when the wrapper dies (even of SIGKILL), so an
    orphaned job does not train on unseen; mpirun then aborts its ranks."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _own_group_dying_with_parent() -> None:
    """In the launcher's child: its own process group (``Popen(process_group=0)`` is Python 3.11+
    only), then :func:`_die_with_parent`."""
    os.setpgid(0, 0)
    _die_with_parent()


def run_wrapped(command: Sequence[str], give_up_after: float = PREEMPTION_WAIT + 60.0) -> int:
    """Runs a Horovod launcher (``mpirun ...``, ``horovodrun ...``) with its ranks as a
    preemptible job: SIGTERM, SIGINT or SIGUSR1 to this process becomes SIGUSR1 to every
    Open MPI launcher in the command's process tree (mpirun forwards it to all ranks at
    once; they stop together with a checkpoint and exit 75), or SIGTERM to the command
    when it has none (``horovodrun --gloo`` passes that on). A second signal is sent on the
    same way (the ranks then leave at once); a third, or a stop that takes longer than
    ``give_up_after`` seconds, ends the launcher with SIGTERM (Open MPI then kills the ranks).

    Returns the launcher's exit status (128 + N when a signal N ended it).
    """
    interactive = sys.stdin is not None and sys.stdin.isatty()
    received: List[Tuple[float, int]] = []  # (when, signal)
    proc: Optional[subprocess.Popen] = None

    def on_signal(signum: int, frame: object) -> None:
        received.append((time.monotonic(), signum))
        if proc is not None:  # else held until the launcher exists (below)
            _pass_on(proc, command, signum, len(received))

    # The handlers come first: a scheduler's signal while the launcher starts is held and
    # passed on once it exists, never lost to whatever handler was there before.
    previous = {sig: signal.signal(sig, on_signal) for sig in PREEMPTION_SIGNALS}
    try:
        try:
            # Its own process group: Ctrl-C in a terminal reaches this wrapper only (mpirun
            # would abort on SIGINT); a terminal's stdin is not passed on (the ranks do not read it).
            proc = subprocess.Popen(list(command), preexec_fn=_own_group_dying_with_parent,
                                    stdin=subprocess.DEVNULL if interactive else None)
        except FileNotFoundError:
            raise UsageError(f"python -m lmkit.launch --{os.path.basename(command[0])}: "
                             f"{command[0]!r} was not found; install it or put it on PATH") from None
        if received:
            _pass_on(proc, command, received[-1][1], len(received))
        code = _wait_for_launcher(proc, received, give_up_after)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code if code >= 0 else 128 - code


def _pass_on(proc: subprocess.Popen, command: Sequence[str], signum: int, count: int) -> None:
    """The ``count``-th signal received, passed on to the launcher ``proc`` (see :func:`run_wrapped`)."""
    if proc.poll() is not None:
        return
    if count >= _GIVE_UP:
        proc.send_signal(signal.SIGTERM)
        return
    targets = mpi_launchers_below(proc.pid)
    name = signal.Signals(signum).name
    if not targets:
        print(f"[launch] {name}: passing SIGTERM to {os.path.basename(command[0])} "
              f"(pid {proc.pid}) for the ranks to stop with a checkpoint", file=sys.stderr, flush=True)
        proc.send_signal(signal.SIGTERM)
        return
    print(f"[launch] {name}: passing SIGUSR1 to Open MPI's launcher (pid "
          f"{', '.join(map(str, targets))}) for the ranks to stop with a checkpoint",
          file=sys.stderr, flush=True)
    for pid in targets:
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass


def _wait_for_launcher(proc: subprocess.Popen, received: List[Tuple[float, int]], give_up_after: float) -> int:
    """The launcher's return code; a stop that takes longer than ``give_up_after`` seconds after the first
    signal ends it with SIGTERM (counted as the signal that gives up)."""
    while True:
        try:
            return proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            if received and time.monotonic() - received[0][0] > give_up_after and len(received) < _GIVE_UP:
                print(f"[launch] the job did not stop within {give_up_after:g} s of the signal; "
                      "ending it", file=sys.stderr, flush=True)
                received.extend([(time.monotonic(), signal.SIGTERM)] * (_GIVE_UP - len(received)))
                proc.send_signal(signal.SIGTERM)


def main_wrapped(argv: List[str]) -> int:
    """``python -m lmkit.launch --mpirun ARGS...``: runs that launcher (see :func:`run_wrapped`)."""
    if len(argv) == 1:
        print(f"python -m lmkit.launch {argv[0]}: give the launcher's arguments, e.g. "
              f"{argv[0]} -np 2 python -m lmkit train --config config_small", file=sys.stderr)
        return 2
    try:
        return run_wrapped([argv[0][2:], *argv[1:]])
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
