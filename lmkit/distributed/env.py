"""What the process environment says about the job, and CPU thread settings.

No TensorFlow import: the command-line tools ask :func:`launcher_rank` before
TensorFlow loads, so that a bad flag is reported once (by rank 0) at once.

* Launchers: ``mpirun`` (Open MPI, MPICH, Intel MPI), Slurm's PMI, PMIx,
  ``horovodrun --gloo`` and ``python -m lmkit.launch`` each leave their own
  variables; :data:`LAUNCHER_SIZE_ENV` and :data:`LAUNCHER_RANK_ENV` list them.
* Threads: :func:`thread_settings` shares a host's cores among its ranks.
* Open MPI's busy polling: :func:`quiet_mpi_polling`.
* Hosts: :func:`is_local_host` tells this machine's names from other hosts'.
* Devices: :func:`choose_gpus` decides which GPUs a process takes (also
  under a scheduler that shows each process its own), :func:`pin_gpus` and
  :func:`configure_devices` apply that (they import TensorFlow when called).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from lmkit.core.errors import UsageError

__all__ = [
    "BACKEND_ENV",
    "DistributedError",
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
    "choose_gpus",
    "gpus_pinned",
    "pin_gpus",
    "GPU_PINNING_ENV",
    "cpu_count",
    "LOCAL_NAMES",
    "is_local_host",
]


class DistributedError(RuntimeError):
    """Raised when the distributed runtime cannot be used as asked."""


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

# This machine's loopback names and addresses (its own host names are added when asked).
LOCAL_NAMES: Tuple[str, ...] = ("127.0.0.1", "localhost", "::1")

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


def is_local_host(host: str) -> bool:
    """True for this machine's loopback addresses and its own host names."""
    names = set(LOCAL_NAMES)
    try:
        names.update({socket.gethostname(), socket.getfqdn()})
    except OSError:
        pass
    return host in names


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


# Set per process by a scheduler that gives each process its own GPUs (Slurm's
# --gpus-per-task, a launcher's per-rank CUDA_VISIBLE_DEVICES, ROCm's equivalents).
GPU_PINNING_ENV: Tuple[str, ...] = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def gpus_pinned(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True when the environment restricts which GPUs this process sees (a scheduler's doing)."""
    environ = os.environ if environ is None else environ
    return any(environ.get(k, "").strip() for k in GPU_PINNING_ENV)


def choose_gpus(local_rank: int, local_size: int, visible: int, per_process: int = 1,
                pinned: bool = False) -> List[int]:
    """Which of the GPUs this process sees it uses (indices into its visible GPUs).

    * none visible: none (the process computes on the CPU);
    * every GPU of the host visible (``visible >= local_size * per_process``,
      as ``mpirun`` or ``lmkit.launch`` leave them): the block of
      ``per_process`` GPUs at its local rank;
    * exactly ``per_process`` visible while the environment restricts them
      (``pinned``: Slurm's ``--gpus-per-task``, a per-rank
      ``CUDA_VISIBLE_DEVICES``): all of them, they are this process's own;
    * anything else means processes of this host would share GPUs.

    Raises:
      UsageError: more GPUs wanted on this host than it has (the message says how to fix it).
    """
    if visible == 0:
        return []
    if visible >= local_size * per_process:
        return list(range(local_rank * per_process, (local_rank + 1) * per_process))
    if visible == per_process and pinned:
        return list(range(per_process))
    want = local_size * per_process
    why = (f"{local_size} process(es) on this host with {per_process} GPU(s) each need {want} GPUs, but "
           f"this process sees {visible}")
    if visible == per_process:
        why += (" and all of them see the same ones (no CUDA_VISIBLE_DEVICES per process): they would "
                "share GPUs")
    raise UsageError(f"{why}; start at most {max(1, visible // per_process)} process(es) per host, or give "
                     "each process its own GPUs (Slurm: --gpus-per-task, or CUDA_VISIBLE_DEVICES per rank)")


def _device_names(devices: Sequence[Any]) -> List[str]:
    return [getattr(d, "name", str(d)) for d in devices]


def pin_gpus(local_rank: int, local_size: int, per_process: int = 1, tf_config: Any = None,
             environ: Optional[Mapping[str, str]] = None) -> List[Any]:
    """Makes this process see only its GPUs (:func:`choose_gpus`), with memory growth on.

    Must run before TensorFlow initialises its runtime (the first op). When
    the runtime has started already, the GPUs it sees must be the chosen
    ones: anything else is an error, never a silent fallback.

    Args:
      tf_config: ``tf.config`` (tests pass a fake one with a device list).

    Returns:
      The GPUs (physical devices) this process uses; [] on a host without GPUs.

    Raises:
      UsageError: more processes than GPUs on this host (:func:`choose_gpus`).
      DistributedError: TensorFlow started before with other GPUs visible.
    """
    if tf_config is None:
        import tensorflow as tf
        tf_config = tf.config
    gpus = list(tf_config.list_physical_devices("GPU"))
    chosen = [gpus[i] for i in choose_gpus(local_rank, local_size, len(gpus), per_process, gpus_pinned(environ))]
    if not gpus:
        return []
    try:
        for gpu in gpus:
            tf_config.experimental.set_memory_growth(gpu, True)
        tf_config.set_visible_devices(chosen, "GPU")
    except RuntimeError:  # the runtime already started: checked below
        pass
    seen = _device_names(tf_config.get_visible_devices("GPU"))
    if seen != _device_names(chosen):
        raise DistributedError(
            f"local rank {local_rank} of {local_size} should use GPU(s) {_device_names(chosen)}, but TensorFlow "
            f"started before dist.init() and sees {seen}; call dist.init() (or run an lmkit command) before "
            "any TensorFlow op")
    return chosen


def configure_devices(local_rank: int, local_size: int, threads: ThreadSettings, tf_config: Any = None,
                      environ: Optional[Mapping[str, str]] = None) -> List[Any]:
    """Pins this rank to its own GPU (if the host has any, :func:`pin_gpus`) and sets CPU threads.

    Must run before TensorFlow initialises its runtime (the first op); the
    thread settings cannot change later (tests that created tensors first
    keep TensorFlow's), the GPUs must already be the right ones.

    Returns:
      The GPUs this process uses ([] without GPUs).
    """
    if tf_config is None:
        import tensorflow as tf
        tf_config = tf.config
    chosen = pin_gpus(local_rank, local_size, 1, tf_config, environ)
    try:
        tf_config.threading.set_intra_op_parallelism_threads(threads.intra_op)
        tf_config.threading.set_inter_op_parallelism_threads(threads.inter_op)
    except RuntimeError:
        pass  # the runtime already started (e.g. a test created tensors first)
    return chosen
