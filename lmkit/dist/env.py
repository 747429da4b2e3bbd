"""What the process environment says about the job, and CPU thread settings.

No TensorFlow import: the command-line tools ask :func:`launcher_rank` before
TensorFlow loads, so that a bad flag is reported once (by rank 0) at once.

* Launchers: ``mpirun`` (Open MPI, MPICH, Intel MPI), Slurm's PMI, PMIx,
  ``horovodrun --gloo`` and ``python -m lmkit.launch`` each leave their own
  variables; :data:`LAUNCHER_SIZE_ENV` and :data:`LAUNCHER_RANK_ENV` list them.
* Threads: :func:`thread_settings` shares a host's cores among its ranks.
* Open MPI's busy polling: :func:`quiet_mpi_polling`.
* Devices: :func:`configure_devices` gives each rank its own GPU (imports
  TensorFlow when called).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Tuple

from lmkit.errors import UsageError

__all__ = [
    "BACKEND_ENV",
    "LAUNCHER_SIZE_ENV",
    "LAUNCHER_RANK_ENV",
    "LOCAL_RANK_ENV",
    "LOCAL_SIZE_ENV",
    "MPI_YIELD_ENV",
    "INTRA_OP_ENV",
    "INTER_OP_ENV",
    "ThreadSettings",
    "launched_by_mpi_or_horovodrun",
    "launcher_rank",
    "quiet_mpi_polling",
    "thread_settings",
    "configure_devices",
    "cpu_count",
]

BACKEND_ENV = "LMKIT_BACKEND"  # set by lmkit.launch to "native"
LOCAL_RANK_ENV = "LMKIT_LOCAL_RANK"  # set by lmkit.launch
LOCAL_SIZE_ENV = "LMKIT_LOCAL_SIZE"
INTRA_OP_ENV = "LMKIT_INTRA_OP_THREADS"
INTER_OP_ENV = "LMKIT_INTER_OP_THREADS"

# Set by a launcher that starts one process per rank (their presence means
# "started by mpirun/horovodrun/srun").
LAUNCHER_SIZE_ENV: Tuple[str, ...] = (
    "OMPI_COMM_WORLD_SIZE",  # Open MPI's mpirun
    "PMI_SIZE",  # MPICH / Intel MPI / Slurm PMI
    "PMIX_RANK",  # PMIx launchers
    "HOROVOD_RANK",  # horovodrun --gloo
)
# Where each launcher puts the rank of the process, in the order to look.
LAUNCHER_RANK_ENV: Tuple[str, ...] = (
    "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "HOROVOD_RANK",
    "RANK",  # lmkit.launch
)

# Read by Open MPI when Horovod initialises it (MPI_Init inside hvd.init()).
MPI_YIELD_ENV = "OMPI_MCA_mpi_yield_when_idle"


def launched_by_mpi_or_horovodrun() -> bool:
    """True when a launcher (mpirun, horovodrun, srun) started this process."""
    return any(k in os.environ for k in LAUNCHER_SIZE_ENV)


def launcher_rank() -> int:
    """This process's rank as the launcher set it (before any initialisation); 0 without one."""
    for key in LAUNCHER_RANK_ENV:
        value = os.environ.get(key)
        if value is not None and value.isdigit():
            return int(value)
    return 0


def quiet_mpi_polling() -> None:
    """Makes Open MPI yield the core while it waits, unless the user chose otherwise.

    Open MPI busy-polls inside a collective (and Horovod's background thread
    negotiates every cycle through MPI), yielding only when it sees a host
    oversubscribed. With one rank per core, as on a CPU host, the polling
    takes the core from that rank's own compute threads (measured in
    ``docs/performance.md``); GPU hosts lose nothing measurable, the wait is
    for NCCL or the network either way. Set
    ``OMPI_MCA_mpi_yield_when_idle=0`` to keep Open MPI's own choice.
    """
    os.environ.setdefault(MPI_YIELD_ENV, "1")


@dataclass(frozen=True)
class ThreadSettings:
    """CPU thread settings chosen for this rank."""

    intra_op: int
    inter_op: int


def cpu_count() -> int:
    """Cores this process may run on (mpirun may bind a rank to fewer than the host has)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _env_int(key: str) -> int:
    return int(os.environ.get(key, "0") or 0)


def thread_settings(local_size: int, intra_op: Optional[int] = None,
                    inter_op: Optional[int] = None, min_inter_op: int = 1) -> ThreadSettings:
    """Threads for one rank when ``local_size`` ranks share this host.

    Each rank gets about ``cores / local_size`` intra-op threads so that the
    ranks of one host do not oversubscribe its cores, and ``min(intra, 4)``
    inter-op threads, at least ``min_inter_op`` (the native backend's
    in-process replicas need 2). A rank with one core gets one inter-op
    thread: a second one, idle most of the time, still takes turns on that
    core (``docs/performance.md`` has the measurement). Overrides come from
    the arguments, then from ``LMKIT_INTRA_OP_THREADS`` /
    ``LMKIT_INTER_OP_THREADS``.

    Raises:
      ValueError: a thread count below 1.
    """
    total = os.cpu_count() or 1
    bound = cpu_count()
    default_intra = max(1, min(bound, total // max(1, local_size)))
    intra = intra_op or _env_int(INTRA_OP_ENV) or default_intra
    inter = inter_op or _env_int(INTER_OP_ENV) or max(min_inter_op, min(intra, 4))
    if intra < 1 or inter < 1:
        raise UsageError(f"thread counts must be >= 1, got intra_op={intra}, inter_op={inter}")
    return ThreadSettings(intra_op=intra, inter_op=inter)


def configure_devices(local_rank: int, threads: ThreadSettings) -> None:
    """Pins this rank to its own GPU (if the host has any) and sets CPU threads.

    Must run before TensorFlow initialises its runtime (the first op); later
    the settings stay as they are.
    """
    import tensorflow as tf

    try:
        gpus = tf.config.list_physical_devices("GPU")
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        if gpus:
            tf.config.set_visible_devices(gpus[local_rank % len(gpus)], "GPU")
        tf.config.threading.set_intra_op_parallelism_threads(threads.intra_op)
        tf.config.threading.set_inter_op_parallelism_threads(threads.inter_op)
    except RuntimeError:
        pass  # the runtime already started (e.g. a test created tensors first)
