"""Setting up the native backend: what ``TF_CONFIG`` says about a multi-worker job, the devices and threads,
and the strategy (:class:`~lmkit.distributed.native.NativeBackend` runs on it).

``python -m lmkit.launch`` writes ``TF_CONFIG`` (:mod:`lmkit.distributed.launch`):
every worker's address and this worker's index. Every line specific to
TensorFlow's distribution carries a ``# NATIVE`` comment.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from lmkit.core.errors import UsageError
from lmkit.distributed.base import DistributedError
from lmkit.distributed.env import is_local_host

__all__ = ["DEFAULT_PACK_BYTES", "PACK_BYTES_ENV", "pack_bytes_setting", "configure_devices", "make_strategy",
           "communication_options", "tf_config_cluster", "tf_config_addresses", "open_servers_warning"]

# Dense gradients are all-reduced in packs of about this many bytes (LMKIT_PACK_BYTES;
# 0 = one pack): small enough that the first pack starts during the backward pass,
# large enough that a pack is not dominated by the collective's fixed cost.
# docs/performance.md has the measurement.
DEFAULT_PACK_BYTES = 4 << 20
PACK_BYTES_ENV = "LMKIT_PACK_BYTES"


def pack_bytes_setting() -> int:
    """The dense gradients' pack size: ``$LMKIT_PACK_BYTES``, else :data:`DEFAULT_PACK_BYTES`."""
    pack = os.environ.get(PACK_BYTES_ENV, "").strip()
    if pack and not pack.isdigit():
        raise UsageError(f"{PACK_BYTES_ENV}={pack!r} must be a number of bytes >= 0 "
                         f"(default {DEFAULT_PACK_BYTES}; 0 = all dense gradients in one all-reduce)")
    return int(pack) if pack else DEFAULT_PACK_BYTES


def configure_devices(logical_cpus: int, intra_op: int, inter_op: int) -> None:
    """Splits the CPU into ``logical_cpus`` devices (replicas on a CPU-only host: tests, laptops) and sets the
    thread pools, unless TensorFlow's runtime started already (:func:`make_strategy` then checks the devices)."""
    try:
        if logical_cpus:
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(  # NATIVE
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(logical_cpus)])
        tf.config.threading.set_intra_op_parallelism_threads(intra_op)
        tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    except RuntimeError:
        pass  # the runtime already started


def make_strategy(cluster: Optional[Tuple[int, int]], gpus: bool, num_gpus: int) -> tf.distribute.Strategy:
    """A MultiWorkerMirroredStrategy for a ``TF_CONFIG`` cluster, else a MirroredStrategy over this host's
    GPUs or ``num_gpus`` logical CPU devices (at least one).

    Raises:
      DistributedError: TensorFlow's runtime started before with fewer logical CPU devices.
    """
    if cluster is not None:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(  # NATIVE: reads TF_CONFIG
            communication_options=communication_options(gpus))
        warning = open_servers_warning(tf_config_addresses())
        if warning and cluster[0] == 0:
            print(warning, file=sys.stderr, flush=True)
        return strategy
    if gpus:
        return tf.distribute.MirroredStrategy(  # NATIVE
            devices=[d.name for d in tf.config.list_logical_devices("GPU")])
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    want = max(1, num_gpus)
    if len(devices) < want:
        raise DistributedError(
            f"num_gpus = {num_gpus} replicas need {want} logical CPU devices, but TensorFlow "
            f"already started with {len(devices)}; call dist.init() before any TensorFlow op")
    return tf.distribute.MirroredStrategy(devices=devices[:want])  # NATIVE


def communication_options(gpus: bool) -> "tf.distribute.experimental.CommunicationOptions":
    """How the workers of a multi-worker job all-reduce: NCCL between GPUs, else TensorFlow's ring.

    The strategy's default (AUTO) leaves GPUs on the ring too, unless NCCL is
    asked for by name.
    """
    impl = tf.distribute.experimental.CommunicationImplementation  # NATIVE
    return tf.distribute.experimental.CommunicationOptions(  # NATIVE
        implementation=impl.NCCL if gpus else impl.RING)


def tf_config_cluster() -> Optional[Tuple[int, int]]:
    """(rank, size) of this worker from ``TF_CONFIG``; None without a multi-worker cluster.

    Raises:
      DistributedError: ``TF_CONFIG`` is not JSON or names another task type.
    """
    raw = os.environ.get("TF_CONFIG", "").strip()
    if not raw:
        return None
    try:
        cfg = json.loads(raw)
        chiefs = len(cfg.get("cluster", {}).get("chief", []))
        size = len(tf_config_addresses())
        task = cfg.get("task", {})
        task_type, index = task.get("type"), int(task.get("index", 0))
    except (ValueError, AttributeError, TypeError) as exc:
        raise DistributedError(f"TF_CONFIG is not valid ({exc}): {raw[:200]!r}; "
                               "let `python -m lmkit.launch` write it") from None
    if size <= 1:
        return None
    if task_type == "chief":
        return index, size
    if task_type == "worker":
        return chiefs + index, size
    raise DistributedError(f"TF_CONFIG task type {task_type!r} is not 'chief' or 'worker'; the "
                           "native backend runs every task as a training worker")


def tf_config_addresses() -> List[str]:
    """The ``host:port`` of every task in ``TF_CONFIG``, in rank order (chief first); [] without it.

    Raises:
      ValueError, AttributeError, TypeError: ``TF_CONFIG`` is not a cluster
        (:func:`tf_config_cluster` turns them into one clear error).
    """
    raw = os.environ.get("TF_CONFIG", "").strip()
    if not raw:
        return []
    cluster = json.loads(raw).get("cluster", {})

    def tasks(job: Any) -> List[str]:  # a list of addresses, or {index: address}
        return [str(job[k]) for k in sorted(job, key=int)] if isinstance(job, dict) else [str(a) for a in job]

    return tasks(cluster.get("chief", [])) + tasks(cluster.get("worker", []))


def _host(address: str) -> str:
    """``"h:1"`` -> ``"h"``, ``"[::1]:1"`` -> ``"::1"``."""
    return address.rpartition(":")[0].strip("[]")


def open_servers_warning(addresses: Sequence[str]) -> Optional[str]:
    """The warning for a multi-worker job whose every worker runs on this host, else None.

    Each worker of a multi-worker job starts TensorFlow's gRPC server, which
    listens on every network interface whatever host its ``TF_CONFIG``
    address names (TensorFlow's ``GrpcServer`` binds ``0.0.0.0:port`` and has
    no setting for the address, up to TensorFlow 2.21 at least:
    ``tests/distributed/native/test_native_exposure.py`` checks it) and runs
    the operations anyone sends it, without authentication. A job across hosts needs reachable servers (on a trusted
    network); a job on one host does not need them at all: the same replicas
    run in one process, with no server (``num_gpus``).

    Args:
      addresses: every worker's ``host:port`` (:func:`tf_config_addresses`).
    """
    if len(addresses) < 2 or not all(is_local_host(_host(a)) for a in addresses):
        return None
    ports = ", ".join(a.rpartition(":")[2] for a in addresses)
    return ("[lmkit] warning: every worker of this job runs on this host, yet TensorFlow's server of each "
            f"(ports {ports}) listens on all network interfaces and runs anyone's operations without "
            "authentication; on one host, run the replicas in one process instead (--backend native "
            "--num_gpus N without lmkit.launch: N GPUs, or N logical CPU devices), or firewall these ports")
