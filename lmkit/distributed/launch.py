"""Starts the workers of a native-backend job (``use_horovod = False``) on one or more hosts.

    python -m lmkit.launch --hosts 127.0.0.1 --num_workers 2 -- \\
        python examples/lm_ptb_distributed.py --use_horovod false --config config_small

TensorFlow's ``MultiWorkerMirroredStrategy`` learns the cluster from the
``TF_CONFIG`` environment variable of each worker: the address (host:port) of
every worker and this worker's index.  The launcher writes it, together with

* ``LMKIT_BACKEND=native`` (``dist.init()`` picks the native backend),
* ``RANK`` (the worker's index, so errors are printed once by rank 0),
* ``LMKIT_LOCAL_RANK`` / ``LMKIT_LOCAL_SIZE`` (workers sharing a host share
  its cores and GPUs),

and then

* starts the workers of this host (``127.0.0.1``, ``localhost`` or its own
  name) as subprocesses and waits for them; when one fails the others are
  stopped, its exit status is returned, and the job's last line names the
  worker that failed first, with its status or signal (the others' errors
  that follow are mostly the consequence);
* passes SIGTERM, SIGINT and SIGUSR1 on to the workers of this host, which
  then stop together at a step boundary after a checkpoint (exit status 75,
  "preempted, rerun to continue"), and waits for all of them;
* binds each worker of this host to its share of the cores this launcher
  may use (``--bind cores``, the default, as ``mpirun --bind-to core``
  does; ``--bind none`` leaves them free);
* for every other host prints the exact command to run there (start them by
  hand or from a scheduler), or with ``--ssh`` runs it through ``ssh host``
  in the same directory (needs password-less SSH and the same checkout and
  virtual environment on every host, as Horovod does), or with ``--rsh AGENT``
  through ``AGENT host command`` (as Open MPI's ``plm_rsh_agent``; e.g.
  ``scripts/two_hosts.py``'s agent enters a network namespace); those
  commands carry this shell's ``NCCL_*``, ``LMKIT_*``, ``TF_*``, ``CUDA_*``
  and ``XLA_*`` variables and any named with ``--env NAME``, as
  ``mpirun -x`` would.

``python -m lmkit.launch --mpirun ARGS...`` and ``--horovodrun ARGS...``
run that launcher instead (a Horovod job) and make SIGTERM, SIGINT and
SIGUSR1 sent to this process a preemption of its ranks
(:mod:`lmkit.distributed.wrapped`).

Worker ``i`` of ``N`` runs on host ``i // (N / number of hosts)``, or as many
as ``host:slots`` says; its port is ``--port`` + its index on that host (on a
job that stays on this host, free ports are picked when ``--port`` is not given).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from lmkit.core.errors import PEER_FAILED_EXIT_STATUS, NonFiniteError, UsageError
from lmkit.core.preemption import PREEMPTED_EXIT_STATUS, PREEMPTION_SIGNALS
from lmkit.distributed.env import BACKEND_ENV, LOCAL_RANK_ENV, LOCAL_SIZE_ENV, is_local_host
from lmkit.distributed.wrapped import PREEMPTION_WAIT, WRAPPED_LAUNCHERS, main_wrapped

__all__ = ["Worker", "plan", "worker_env", "forwarded_env", "remote_command", "core_sets", "main",
           "FORWARDED_PREFIXES", "WRAPPED_LAUNCHERS"]

DEFAULT_PORT = 23456
# The lowest port picked for a job on this host when --port is not given (below the ephemeral range).
_FIRST_PICKED_PORT = 10000
# Variables passed to the workers of other hosts, as `mpirun -x NAME` would (--env adds names).
FORWARDED_PREFIXES = ("NCCL_", "LMKIT_", "TF_", "CUDA_", "XLA_")
# How long a bystander's exit (status 4: another rank failed) waits for the exit of the worker that
# caused it: the two can reach the launcher in either order when they end within moments of each other.
CAUSE_WAIT = 5.0


@dataclass(frozen=True)
class Worker:
    """One worker of the job.

    Attributes:
      rank: index of the worker (0 is the chief: it evaluates, logs and saves).
      host: where it runs.
      port: the port its TensorFlow server listens on.
      local_rank: index among the workers of its host.
      local_size: number of workers on its host.
    """

    rank: int
    host: str
    port: int
    local_rank: int
    local_size: int

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _free_ports(count: int) -> List[int]:
    """Ports free on every interface right now (held open together, so all differ), below the kernel's
    ephemeral range.

    A port the kernel hands out for ``bind(0)`` comes from its ephemeral range,
    where every outgoing connection of the machine also takes its local port:
    on a busy machine one could take it in the moment between this pick and the
    worker's server binding it ("Address already in use"). Below that range
    only a process that binds the very port can; the kernel's own pick is the
    fallback when none is free there.
    """
    low = _ephemeral_range()[0]
    candidates = random.Random().sample(range(_FIRST_PICKED_PORT, low), max(0, low - _FIRST_PICKED_PORT))
    socks: List[socket.socket] = []
    try:
        for port in [*candidates, *[0] * count]:
            if len(socks) == count:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("", port))  # every interface, as TensorFlow's server binds it
            except OSError:
                s.close()
                continue
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _ephemeral_range() -> Tuple[int, int]:
    """The kernel's range of ports for outgoing connections and ``bind(0)`` (Linux's default elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _parse_hosts(hosts: str, num_workers: int) -> List[Tuple[str, int]]:
    """``"h1,h2"`` or ``"h1:2,h2:2"`` -> [(host, workers on it)]."""
    if num_workers < 1:
        raise UsageError(f"--num_workers {num_workers} must be >= 1")
    items = [h.strip() for h in hosts.split(",") if h.strip()]
    if not items:
        raise UsageError(f"--hosts {hosts!r} names no host; e.g. --hosts 127.0.0.1 or --hosts h1,h2")
    parsed: List[Tuple[str, Optional[int]]] = []
    for item in items:
        # "host:slots"; an IPv6 address (several colons) has no slots.
        host, slots = item.split(":") if item.count(":") == 1 else (item, "")
        if slots and (not slots.isdigit() or int(slots) < 1):
            raise UsageError(f"--hosts entry {item!r}: slots must be a positive integer (host:2)")
        parsed.append((host, int(slots) if slots else None))
    if all(s is None for _, s in parsed):
        if num_workers % len(parsed):
            raise UsageError(f"--num_workers {num_workers} cannot be spread evenly over {len(parsed)} "
                             f"hosts; use a multiple of {len(parsed)} or give slots (h1:3,h2:1)")
        return [(h, num_workers // len(parsed)) for h, _ in parsed]
    if any(s is None for _, s in parsed):
        raise UsageError(f"--hosts {hosts!r}: give slots for every host or for none")
    total = sum(s for _, s in parsed)  # type: ignore[misc]
    if total != num_workers:
        raise UsageError(f"--hosts {hosts!r} has {total} slots but --num_workers is {num_workers}; "
                         "make them agree")
    return [(h, s) for h, s in parsed]  # type: ignore[misc]


def plan(hosts: str, num_workers: int, port: Optional[int] = None) -> List[Worker]:
    """The workers of a job, in rank order.

    Args:
      hosts: comma-separated host names, each optionally ``host:slots``.
      num_workers: total number of workers.
      port: first port on each host; None picks free ports when every host is
        this one, else uses 23456.

    Returns:
      One :class:`Worker` per rank.

    Raises:
      ValueError: the hosts and the number of workers do not fit together.
    """
    per_host = _parse_hosts(hosts, num_workers)
    all_local = all(is_local_host(h) for h, _ in per_host)
    free = _free_ports(num_workers) if port is None and all_local else None
    workers = []
    for host, count in per_host:
        for local in range(count):
            rank = len(workers)
            p = free[rank] if free else (port or DEFAULT_PORT) + local
            workers.append(Worker(rank=rank, host=host, port=p, local_rank=local, local_size=count))
    addresses = [w.address for w in workers]
    if len(set(addresses)) != len(addresses):
        raise UsageError(f"two workers share an address ({addresses}); list each host once")
    return workers


def worker_env(worker: Worker, workers: Sequence[Worker]) -> Dict[str, str]:
    """The environment variables that make ``worker`` one of ``workers``."""
    tf_config = {"cluster": {"worker": [w.address for w in workers]},
                 "task": {"type": "worker", "index": worker.rank}}
    return {"TF_CONFIG": json.dumps(tf_config, separators=(",", ":")),
            BACKEND_ENV: "native",
            "RANK": str(worker.rank),
            LOCAL_RANK_ENV: str(worker.local_rank),
            LOCAL_SIZE_ENV: str(worker.local_size)}


def forwarded_env(environ: Optional[Mapping[str, str]] = None,
                  names: Sequence[str] = ()) -> Dict[str, str]:
    """The variables of ``environ`` (default: this process's) that other hosts' workers get.

    Those starting with one of :data:`FORWARDED_PREFIXES` (NCCL's, lmkit's,
    TensorFlow's, CUDA's and XLA's settings), as ``mpirun -x`` would pass
    them, and every name in ``names`` (``--env NAME``) that is set.
    """
    environ = os.environ if environ is None else environ
    return {k: v for k, v in sorted(environ.items())
            if k.startswith(FORWARDED_PREFIXES) or k in names}


def remote_command(worker: Worker, workers: Sequence[Worker], command: Sequence[str],
                   cwd: str, forwarded: Optional[Mapping[str, str]] = None) -> str:
    """The shell command that starts ``worker`` on its host (run from any shell there).

    The worker's own variables (:func:`worker_env`) come first and win over
    ``forwarded`` (default: :func:`forwarded_env`). The worker replaces the
    shell (``exec``), so a signal sent to the process that runs this command
    reaches the worker itself.
    """
    own = worker_env(worker, workers)
    forwarded = forwarded_env() if forwarded is None else forwarded
    env = {**own, **{k: v for k, v in forwarded.items() if k not in own}}
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return f"cd {shlex.quote(cwd)} && exec env {env} {' '.join(shlex.quote(c) for c in command)}"


def core_sets(count: int, cpus: Optional[Sequence[int]] = None) -> List[Optional[List[int]]]:
    """Each of ``count`` workers' share of ``cpus`` (default: the cores this process may use).

    Consecutive blocks of equal size, as ``mpirun --bind-to core`` places its
    ranks; None for every worker when there are fewer cores than workers
    (then binding would put two workers on one core).
    """
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else sorted(cpus)
    per = len(cpus) // count if count else 0
    if per < 1:
        return [None] * count
    return [cpus[i * per:(i + 1) * per] for i in range(count)]


def _stop(procs: Sequence[subprocess.Popen], grace: float = 10.0) -> None:
    """Ends the workers still running: SIGTERM twice (an lmkit worker leaves at once on the
    second; one signal would ask it to checkpoint first), then SIGKILL after ``grace`` s."""
    for _ in range(2):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        time.sleep(0.2)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parses the flags, starts the workers and returns the job's exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].startswith("--") and argv[0][2:] in WRAPPED_LAUNCHERS:
        return main_wrapped(argv)
    parser = _parser()
    args = parser.parse_args(argv)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        parser.error("no command given; put it after --, e.g. -- python examples/lm_ptb_distributed.py")
    try:
        workers = plan(args.hosts, args.num_workers, args.port)
    except ValueError as exc:
        parser.error(str(exc))
    cwd = os.getcwd()
    bad = [n for n in args.env if not n.isidentifier()]
    if bad:
        parser.error(f"--env {bad[0]!r} is not a variable name; give a name, e.g. --env PYTHONPATH")
    forwarded = forwarded_env(names=args.env)
    if args.dry_run:
        for w in workers:
            print(f"# worker {w.rank} on {w.host}\n{remote_command(w, workers, command, cwd, forwarded)}")
        return 0
    agent = shlex.split(args.rsh) if args.rsh else (["ssh", "-o", "BatchMode=yes"] if args.ssh else None)
    local = [w for w in workers if is_local_host(w.host)]
    remote = [w for w in workers if w not in local]
    cores = dict(zip((w.rank for w in local),
                     core_sets(len(local)) if args.bind == "cores" else [None] * len(local)))
    if remote and not agent:
        print("[launch] start these workers on their hosts (same checkout and venv):", file=sys.stderr)
        for w in remote:
            print(f"[launch] on {w.host}: {remote_command(w, workers, command, cwd, forwarded)}",
                  file=sys.stderr)
    return _start_and_wait(workers, command, cores, agent, lambda w: remote_command(w, workers, command, cwd,
                                                                                   forwarded))


def _parser() -> argparse.ArgumentParser:
    """The flags of ``python -m lmkit.launch`` (a native-backend job)."""
    parser = argparse.ArgumentParser(
        prog="python -m lmkit.launch",
        description="Start the workers of a native-backend (TF_CONFIG) lmkit job.",
        epilog="example: python -m lmkit.launch --hosts 127.0.0.1 --num_workers 2 -- "
               "python examples/lm_ptb_distributed.py --use_horovod false.  A Horovod job: "
               "python -m lmkit.launch --mpirun -np 2 python -m lmkit train ... (or --horovodrun "
               "ARGS) runs that launcher and turns SIGTERM into a preemption of its ranks.")
    parser.add_argument("--hosts", default="127.0.0.1",
                        help="comma-separated hosts, optionally host:slots (default 127.0.0.1)")
    parser.add_argument("--num_workers", type=int, required=True, help="total number of workers")
    parser.add_argument("--port", type=int, default=None,
                        help=f"first port on each host (default: free ports on this host, else {DEFAULT_PORT})")
    parser.add_argument("--ssh", action="store_true",
                        help="start the workers of other hosts through ssh (else print their commands)")
    parser.add_argument("--rsh", default=None, metavar="AGENT",
                        help="start the workers of other hosts as `AGENT host command` "
                             "(like mpirun's plm_rsh_agent; --ssh is `ssh -o BatchMode=yes`)")
    parser.add_argument("--bind", choices=("cores", "none"), default="cores",
                        help="bind each worker of this host to its share of the cores (default), "
                             "or leave them free")
    parser.add_argument("--env", "-x", action="append", default=[], metavar="NAME",
                        help="also pass this variable to other hosts' workers (repeatable; those "
                             f"starting with {', '.join(FORWARDED_PREFIXES)} always are)")
    parser.add_argument("--dry_run", action="store_true", help="print every worker's command and exit")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- followed by the training command")
    return parser


def _start_and_wait(workers: Sequence[Worker], command: Sequence[str], cores: Dict[int, Optional[List[int]]],
                    agent: Optional[List[str]], remote: Callable[[Worker], str]) -> int:
    """Starts this host's workers (bound to ``cores``) and, through ``agent``, the others' (``remote(w)`` is a
    worker's command line there); passes scheduler signals on; returns the job's exit status."""
    procs: List[subprocess.Popen] = []
    started: List[Worker] = []  # the worker of each of procs
    signalled: List[int] = []
    reached = [0]  # how many of procs the signals went to

    def forward(signum: int, frame: object) -> None:
        # A scheduler's notice (SIGTERM, SIGUSR1, Ctrl-C) goes to every worker of this host:
        # they stop together at a step boundary and rank 0 writes a checkpoint.
        signalled.append(signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)
        reached[0] = len(procs)

    previous = {sig: signal.signal(sig, forward) for sig in PREEMPTION_SIGNALS}
    try:
        for w in workers:
            if w.rank in cores:  # this host's (is_local_host, asked once per worker above)
                bind = cores[w.rank]
                procs.append(subprocess.Popen(
                    command, env={**os.environ, **worker_env(w, workers)},
                    preexec_fn=(lambda c=bind: os.sched_setaffinity(0, c)) if bind else None))
                started.append(w)
            elif agent:
                procs.append(subprocess.Popen([*agent, w.host, remote(w)]))
                started.append(w)
        if signalled:  # a notice while the workers started: the later ones get it too
            for p in procs[reached[0]:]:
                p.send_signal(signalled[-1])
        return _wait(procs, signalled, started, len(workers))
    except KeyboardInterrupt:
        _stop(procs)
        return 130
    finally:  # main is also called in-process (tests, notebooks): its handlers do not outlive it
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# Statuses every lmkit rank exits with together, after rank 0 printed why (bad input, a
# non-finite loss, a preemption): which worker's exit the launcher saw first says nothing.
_EVERY_RANK_STATUSES = (UsageError.exit_code, NonFiniteError.exit_code, PREEMPTED_EXIT_STATUS)


def _exit_text(code: int) -> str:
    """``exit status N`` or ``killed by SIGNAME`` for a Popen return code."""
    if code >= 0:
        return f"exit status {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def _note_end(proc: subprocess.Popen, index: int, ended: List[int]) -> None:
    """On its own thread: appends ``index`` to ``ended`` when ``proc`` ends, then reaps it.

    Noted before reaped (``WNOWAIT``): a process that sees this one gone knows
    that its own end, if it ends now, comes later in ``ended``.
    """
    if hasattr(os, "waitid"):
        try:
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            pass  # reaped already (Popen.send_signal polls)
    else:  # macOS: noted when reaped
        proc.wait()
    ended.append(index)
    proc.wait()


def _wait(procs: Sequence[subprocess.Popen], signalled: Sequence[int], workers: Sequence[Worker],
          size: int) -> int:
    """The job's exit status: 0 when every worker succeeded, else that of the first to fail.

    A worker that fails while the others still run stops them, unless the job
    is stopping for a preemption (a signal, or a worker's preempted status):
    then every worker finishes its own stop, within the grace period. The
    worker that failed first (in time: the others' errors after it are mostly
    its consequence) is named on stderr, with its status or signal. A
    bystander's status (4: its collective was cancelled because another rank
    failed) never comes first while another worker's failure arrives within
    :data:`CAUSE_WAIT` seconds: the two exits can reach this process in
    either order.

    Args:
      procs: the started workers' processes.
      signalled: the preemption signals received so far (the list grows).
      workers: the :class:`Worker` of each of ``procs`` (for the messages).
      size: the job's number of workers (those of other hosts included).
    """
    ended: List[int] = []  # indices into procs, in the order their processes ended
    for i, p in enumerate(procs):
        threading.Thread(target=_note_end, args=(p, i, ended), name=f"lmkit-launch-wait-{i}",
                         daemon=True).start()
    cause_deadline: Optional[float] = None
    while True:
        done = list(ended)
        if any(procs[i].returncode is None for i in done):  # noted, not reaped yet: a moment
            time.sleep(0.01)
            continue
        failed = [i for i in done if procs[i].returncode != 0]
        if not failed:
            if len(done) == len(procs):
                return 0
            time.sleep(0.2)
            continue
        causes = [i for i in failed if procs[i].returncode != PEER_FAILED_EXIT_STATUS]
        if not causes and len(ended) < len(procs):  # only bystanders so far: the cause's exit may be on its way
            cause_deadline = cause_deadline or time.monotonic() + CAUSE_WAIT
            if time.monotonic() < cause_deadline:
                time.sleep(0.01)
                continue
        first = (causes or failed)[0]
        name = f"worker {workers[first].rank} of {size} (on {workers[first].host}, pid {procs[first].pid})"
        return _end_after_failure(procs, ended, procs[first].returncode, name, bool(signalled))


def _end_after_failure(procs: Sequence[subprocess.Popen], ended: List[int], code: int, name: str,
                       signalled: bool) -> int:
    """Once the worker ``name`` failed first with return ``code``: waits for the others' own stop after a
    preemption, stops those still running, names the cause last; returns the job's exit status."""
    def running() -> bool:
        return len(ended) < len(procs)

    if (signalled or code == PREEMPTED_EXIT_STATUS) and running():
        deadline = time.monotonic() + PREEMPTION_WAIT
        while running() and time.monotonic() < deadline:
            time.sleep(0.2)
    if running():
        how = "stopped" if code == PREEMPTED_EXIT_STATUS else "failed"
        print(f"[launch] {name} {how} ({_exit_text(code)}); stopping the others", file=sys.stderr, flush=True)
        _stop(procs)
    if len(procs) > 1 and code not in _EVERY_RANK_STATUSES:
        # The job's last line names the cause, which the other workers' errors may have buried.
        why = ("it stopped because a worker of another host failed; that worker's output says why"
               if code == PEER_FAILED_EXIT_STATUS else
               "its own message above says why" if code > 0 else
               "a signal from outside, e.g. the kernel's when memory ran out")
        print(f"[launch] the job failed: {name} failed first ({_exit_text(code)}; {why}); "
              "the other workers' errors after it follow from it", file=sys.stderr, flush=True)
    return code if code > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
