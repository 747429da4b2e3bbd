"""The one place in lmkit that talks to the distributed runtime.

Everything else in lmkit (trainer, data loading, examples) calls the
functions of this package and never imports Horovod or names a
``tf.distribute`` strategy. Each backend is one file behind the interface of
:mod:`lmkit.distributed.base`:

* ``"horovod"`` (:mod:`lmkit.distributed.horovod`): Horovod over MPI or Gloo,
  launched with ``mpirun``/``horovodrun``; also a job of size 1 in a plain
  ``python script.py`` process. The only file that imports Horovod.
* ``"native"`` (:mod:`lmkit.distributed.native`): TensorFlow's own distribution, any
  TensorFlow version: ``MirroredStrategy`` for replicas in one process,
  ``MultiWorkerMirroredStrategy`` across processes started by
  ``python -m lmkit.launch``.
* ``"local"`` (:mod:`lmkit.distributed.local`): one process, no Horovod needed.

``"auto"`` (the default) picks Horovod when a launcher started the process or
Horovod is importable, else ``local``; ``LMKIT_BACKEND`` overrides it
(``lmkit.launch`` sets it to ``native``). :mod:`lmkit.distributed.env` holds what
the environment says (launcher variables, threads per rank).

Terms: a *process* (``rank()`` of ``size()``) does the host-side work (data,
logging, checkpoints on rank 0); a *replica* is one data-parallel copy of the
model (``num_replicas()`` in all, ``local_replicas()`` in this process). With
Horovod every process is one replica; the native backend may hold several
replicas in one process.

Typical use::

    from lmkit import distributed as dist
    dist.init()                        # first thing in main()
    with dist.scope():                 # variables that training updates
        model = build_model(...)
    dist.broadcast_variables(model.variables + optimizer.variables)

    def replica_step(x, y, state):     # x, y: this replica's rows
        with tf.GradientTape() as tape:
            loss, state = ...
        grads = dist.DistributedGradientTape(tape).gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        return dist.allreduce(loss), state

    @tf.function
    def step(x, y, state):             # x, y: this process's rows
        loss, state = dist.run(replica_step, (x, y, state))
        return dist.first(loss), state

    state = dist.per_replica(lambda: model.initial_state(local_batch))
    if dist.is_chief(): evaluate()     # never a collective on this path

Work done once for every rank (a download, a tokenizer trained, files
encoded) goes through :func:`rank0_first`, :func:`agree` and
:func:`read_or_receive`, which keep the ranks together when one of them
fails or is signalled (``lmkit.train.run_data`` builds a run's data on them).

Importing this package imports neither TensorFlow nor Horovod; :func:`init`
loads the chosen backend.
"""

from __future__ import annotations

import os
import pickle
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Dict, Iterable, List, Optional, Sequence, TypeVar

import numpy as np

from lmkit.core.checks import check_choice
from lmkit.core.registry import lookup
from lmkit.distributed.base import Backend, DistributedError
from lmkit.distributed.env import (
    BACKEND_ENV,
    ThreadSettings,
    launched_by_mpi_or_horovodrun,
    launcher_rank,
    thread_settings,
)

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

__all__ = [
    "BACKENDS", "BACKEND_CHOICES", "Backend", "DistributedError", "ThreadSettings",
    "init", "initialized", "shutdown", "backend_name", "threads", "thread_settings",
    "launched_by_mpi_or_horovodrun", "launcher_rank",
    "rank", "size", "local_rank", "local_size", "num_replicas", "local_replicas", "is_chief", "device_type",
    "scope", "run", "per_replica", "first", "local_rows",
    "barrier", "allreduce", "allgather", "broadcast", "allreduce_scalar", "broadcast_scalar",
    "broadcast_object", "allgather_object", "agree", "rank0_first", "read_or_receive", "broadcast_variables",
    "DistributedGradientTape", "average_gradients", "run_on_chief", "is_peer_failure",
]

T = TypeVar("T")

# The backends by name: "module:Class", imported only when chosen (one line a backend).
BACKENDS: Dict[str, str] = {
    "horovod": "lmkit.distributed.horovod:HorovodBackend",
    "native": "lmkit.distributed.native:NativeBackend",
    "local": "lmkit.distributed.local:LocalBackend",
}
BACKEND_CHOICES = ("auto", *BACKENDS)

_BACKEND: Optional[Backend] = None


def backend_class(name: str) -> type:
    """The :class:`Backend` subclass registered as ``name``."""
    return lookup(BACKENDS, name, "backend")


def _resolve(backend: Optional[str]) -> str:
    """``"auto"``/None -> Horovod when launched by mpirun/horovodrun or importable, else local."""
    backend = backend or os.environ.get(BACKEND_ENV) or "auto"
    check_choice("backend", backend, BACKEND_CHOICES)
    if backend != "auto":
        return backend
    if launched_by_mpi_or_horovodrun():
        return "horovod"
    try:
        backend_class("horovod")  # imports TensorFlow, not yet Horovod
        from lmkit.distributed.horovod import import_horovod
        import_horovod()
        return "horovod"
    except DistributedError:
        return "local"


def init(backend: Optional[str] = None, intra_op_threads: Optional[int] = None,
         inter_op_threads: Optional[int] = None, num_gpus: int = 0) -> str:
    """Initialise the distributed runtime once; later calls return at once.

    Args:
      backend: ``"horovod"``, ``"native"``, ``"local"``, ``"auto"`` or None
        (= ``"auto"``: Horovod when it is importable or a launcher started
        us, else a single local process). The environment variable
        ``LMKIT_BACKEND`` overrides None and ``"auto"`` (``lmkit.launch``
        sets it to ``native``).
      intra_op_threads: CPU threads per op; default cores / processes on this host.
      inter_op_threads: ops run in parallel; default min(intra, 4) (at least 2 for
        the native backend).
      num_gpus: native backend only: replicas in this process (0 = every GPU
        of the host, or one replica on the CPU). On a host without GPUs,
        ``num_gpus > 1`` runs that many replicas on logical CPU devices.

    Returns:
      The name of the backend in use.

    Raises:
      DistributedError: Horovod was asked for (or a launcher started us) but
        cannot be imported; or the native backend cannot be set up as asked.
      UsageError: an unknown backend or a bad ``num_gpus``.
    """
    global _BACKEND
    if _BACKEND is not None:
        return _BACKEND.name
    if backend == "auto":
        backend = None
    name = _resolve(backend)
    _BACKEND = backend_class(name).create(intra_op_threads=intra_op_threads,
                                          inter_op_threads=inter_op_threads, num_gpus=num_gpus)
    return _BACKEND.name


def _backend() -> Backend:
    if _BACKEND is None:
        init()
    assert _BACKEND is not None
    return _BACKEND


def backend_name() -> str:
    """Name of the backend in use (initialises on first call)."""
    return _backend().name


def initialized() -> bool:
    """True once :func:`init` has run (and :func:`shutdown` has not)."""
    return _BACKEND is not None


def threads() -> ThreadSettings:
    """The CPU thread settings chosen at :func:`init`."""
    backend = _backend()
    assert backend.threads is not None
    return backend.threads


def rank() -> int:
    """Global rank of this process (0 .. size-1)."""
    return _backend().rank()


def size() -> int:
    """Number of processes in the job."""
    return _backend().size()


def local_rank() -> int:
    """Rank of this process among those on the same host."""
    return _backend().local_rank()


def local_size() -> int:
    """Number of processes on this host."""
    return _backend().local_size()


def num_replicas() -> int:
    """Data-parallel replicas over the whole job (the global batch is split over them).

    Horovod: one per process (``size()``); native: processes x replicas per process.
    """
    return _backend().num_replicas()


def local_replicas() -> int:
    """Replicas that this process runs (1 with Horovod)."""
    return _backend().local_replicas()


def device_type() -> str:
    """``"GPU"`` when this process's replicas compute on GPUs, else ``"CPU"``.

    Decides what runs fastest where (``jit_compile = "auto"``: XLA on GPUs).
    """
    return _backend().device_type()


def scope() -> ContextManager[Any]:
    """Context under which to create the variables that training updates.

    With the native backend they become one copy per replica (mirrored
    variables); with Horovod this does nothing.  Create the model (and any
    optimizer handed to the trainer) inside it::

        with dist.scope():
            model = build_model(config.model_config())
    """
    return _backend().scope()


def run(fn: Callable[..., T], args: Sequence[Any] = ()) -> T:
    """Runs ``fn(*args)`` once per local replica (call it inside a ``tf.function``).

    Tensors in ``args`` hold this process's rows: each replica receives one
    contiguous block of them (replica i of this process rows
    ``[i*b, (i+1)*b)``), the same split Horovod makes across ranks.  Values
    made by :func:`per_replica` or returned by an earlier ``run`` are
    per-replica already and go to their replica unchanged.  Inside ``fn``,
    :func:`allreduce` and :func:`DistributedGradientTape` reduce over every
    replica of the job.

    Returns:
      ``fn``'s result: per-replica values (read one with :func:`first`, or
      pass them to the next ``run``); with Horovod, ``fn``'s plain result.
    """
    return _backend().run(fn, args)


def per_replica(fn: Callable[[], T]) -> T:
    """``fn()`` made once for each local replica (e.g. a zero RNN state), for :func:`run`.

    Returns None when ``fn`` returns None.
    """
    return _backend().per_replica(fn)


def first(value: T) -> T:
    """The first local replica's part of a result of :func:`run` (plain values pass through).

    Use it for values that agree on every replica, such as an all-reduced loss.
    """
    return _backend().first(value)


def local_rows(value: T) -> T:
    """This process's rows of a result of :func:`run` or :func:`per_replica` (plain values pass through).

    With several replicas in one process (native backend) their parts are
    joined along the batch axis in replica order, which is row order: the
    inverse of the split :func:`run` makes.
    """
    return _backend().local_rows(value)


def is_chief() -> bool:
    """True on rank 0, the rank that evaluates, logs and writes checkpoints."""
    return rank() == 0


def barrier() -> None:
    """Block until every rank reaches this point."""
    _backend().barrier()


def allreduce(tensor, op: str = "average", name: Optional[str] = None) -> "tf.Tensor":
    """Reduce a tensor over all ranks (``average``, ``sum``, ``min`` or ``max``)."""
    return _backend().allreduce(tensor, op, name)


def allgather(tensor, name: Optional[str] = None) -> "tf.Tensor":
    """Concatenate the tensors of all ranks along their first dimension."""
    return _backend().allgather(tensor, name)


def broadcast(tensor, root: int = 0, name: Optional[str] = None) -> "tf.Tensor":
    """The value of ``tensor`` on rank ``root``, on every rank."""
    return _backend().broadcast(tensor, root, name)


def allreduce_scalar(value: float, op: str = "average") -> float:
    """Reduce a Python number over all ranks; returns a Python float."""
    import tensorflow as tf
    out = allreduce(tf.constant(float(value), dtype=tf.float64), op=op)
    return float(np.asarray(out))


def broadcast_scalar(value: float, root: int = 0) -> float:
    """Rank ``root``'s Python number, on every rank."""
    import tensorflow as tf
    return float(np.asarray(broadcast(tf.constant(float(value), dtype=tf.float64), root)))


def broadcast_object(obj: T, root: int = 0) -> T:
    """Rank ``root``'s picklable object, on every rank."""
    return _backend().broadcast_object(obj, root)


def allgather_object(obj: Any) -> List[Any]:
    """A list with every rank's picklable object, in rank order."""
    return _backend().allgather_object(obj)


def agree(fn: Callable[[], T]) -> T:
    """Runs ``fn`` on every rank; a :class:`~lmkit.core.errors.UsageError` on any rank is raised on all, and
    so is a preemption signal during ``fn`` (as a :class:`~lmkit.core.errors.PreemptedError`, before any
    usage error).

    Per-rank work (reading local files) can fail on one rank only; that rank
    alone would leave while the others wait in the next collective, and its
    message would be lost (only rank 0 prints usage errors). Every rank must
    call this, in the same order.
    """
    from lmkit.core.errors import PreemptedError, UsageError
    from lmkit.core.preemption import PreemptionSignal
    try:
        result, error = fn(), None
    except UsageError as exc:
        result, error = None, ("usage", str(exc))
    except PreemptionSignal as exc:  # its clean-ups have run: every rank stops here, together
        result, error = None, ("preempted", str(exc))
    failed = [(r, e) for r, e in enumerate(allgather_object(error)) if e is not None]
    stops = [message for _, (kind, message) in failed if kind == "preempted"]
    if stops:
        raise PreemptedError(stops[0])
    if failed:
        r, (_, message) = failed[0]
        raise UsageError(message if r == 0 else f"on rank {r}: {message}")
    return result


def rank0_first(fn: Callable[[], T]) -> T:
    """``fn()`` on rank 0 while the other ranks wait; every rank gets its result (a download, a tokenizer
    trained, files encoded: work done once, that the others then read).

    :func:`run_on_chief`, and a preemption signal on rank 0 during ``fn`` is a
    :class:`~lmkit.core.errors.PreemptedError` on every rank, so all stop at
    the same point. Every rank must call this, in the same order.
    """
    from lmkit.core.preemption import as_error
    return run_on_chief(as_error(fn))


def read_or_receive(readable: bool, read: Callable[[], T]) -> T:
    """``read()`` on every rank when every rank can (``readable`` on all: :func:`agree`), else rank 0's
    result, sent to the others (:func:`rank0_first`): a host that does not see rank 0's files still gets
    their content. Every rank must call this, in the same order.
    """
    if all(allgather_object(readable)):
        return agree(read)
    return rank0_first(read)


def broadcast_variables(variables: Iterable["tf.Variable"], root: int = 0) -> None:
    """Overwrite ``variables`` on every rank with their values on ``root``."""
    _backend().broadcast_variables(list(variables), root)


def DistributedGradientTape(tape: "tf.GradientTape", sparse_as_dense: bool = False,  # noqa: N802
                            compression: str = "none"):
    """Wrap a tape so that ``gradient()`` returns gradients averaged over ranks.

    Dense gradients are allreduced; ``IndexedSlices`` gradients (embedding
    lookups) are allgathered unless ``sparse_as_dense`` turns them into dense
    tensors first.  ``compression="fp16"`` halves the bytes of dense
    gradients (it does not apply to sparse ones).
    """
    return _backend().gradient_tape(tape, sparse_as_dense, compression)


def average_gradients(grads: Sequence[Any], sparse_as_dense: bool = False,
                      compression: str = "none") -> List[Any]:
    """Average a list of gradients over ranks (``None`` entries pass through)."""
    return _backend().average_gradients(grads, sparse_as_dense, compression)


def run_on_chief(fn: Callable[[], T]) -> T:
    """Run ``fn`` on rank 0 only and give every rank its result.

    An exception on rank 0 is re-raised on every rank (as the same type when
    it can be pickled), so the other ranks never wait for a result that will
    not come.  Every rank must call this, in the same order.
    """
    result: Any = None
    error: Optional[BaseException] = None
    if is_chief():
        try:
            result = fn()
        except Exception as exc:  # sent to the other ranks below
            error = exc
    payload = (result, _picklable_error(error))
    result, error = broadcast_object(payload, 0)
    if error is not None:
        raise error
    return result


def _picklable_error(error: Optional[BaseException]) -> Optional[BaseException]:
    if error is None:
        return None
    try:
        pickle.dumps(error)
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


def is_peer_failure(exc: BaseException) -> bool:
    """True when ``exc`` is a collective operation cancelled because another rank failed.

    The rank that sees it is a bystander: the rank that failed (or the
    launcher, for a killed one) reports the cause. False before :func:`init`.
    """
    return _BACKEND is not None and _BACKEND.is_peer_failure(exc)


def shutdown() -> None:
    """Shut the backend down (tests use this between backends)."""
    global _BACKEND
    if _BACKEND is not None:
        _BACKEND.shutdown()
    _BACKEND = None
