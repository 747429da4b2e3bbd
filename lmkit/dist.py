"""The one place in lmkit that talks to the distributed runtime.

Everything else in lmkit (trainer, data loading, examples) calls the functions
of this module and never imports Horovod.  That keeps the distributed seams in
one file and lets another backend stand beside Horovod (Horovod 0.28.1 is its
last release).

Backends:

* ``"horovod"``: Horovod over MPI or Gloo, launched with ``mpirun``/``horovodrun``.
  Also works in a plain ``python script.py`` process (size 1, rank 0).
* ``"local"``: one process, no Horovod needed.  Chosen automatically when
  Horovod is not installed and the process was not started by a launcher.

Typical use::

    from lmkit import dist
    dist.init()                        # first thing in main()
    dist.broadcast_variables(model.variables + optimizer.variables)
    tape = dist.DistributedGradientTape(tape)
    if dist.is_chief(): evaluate()     # never a collective on this path

Lines that are specific to Horovod carry a ``# HVD`` comment.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from typing import Any, Callable, Iterable, List, Optional, Sequence, TypeVar

import numpy as np
import tensorflow as tf

T = TypeVar("T")

SUPPORTED_TF_FOR_HOROVOD = ("2.18",)
_LAUNCHER_ENV = (
    "OMPI_COMM_WORLD_SIZE",  # Open MPI's mpirun
    "PMI_SIZE",  # MPICH / Intel MPI / Slurm PMI
    "PMIX_RANK",  # PMIx launchers
    "HOROVOD_RANK",  # horovodrun --gloo
)


class DistributedError(RuntimeError):
    """Raised when the distributed runtime cannot be used as asked."""


@dataclass(frozen=True)
class ThreadSettings:
    """CPU thread settings chosen for this rank."""

    intra_op: int
    inter_op: int


class _Backend:
    """Interface of a distributed backend; the default is a single process."""

    name = "local"

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1

    def local_rank(self) -> int:
        return 0

    def local_size(self) -> int:
        return 1

    def barrier(self) -> None:
        return None

    def allreduce(self, tensor, op: str, name: Optional[str]):
        return tf.convert_to_tensor(tensor)

    def allgather(self, tensor, name: Optional[str]):
        return tf.convert_to_tensor(tensor)

    def broadcast(self, tensor, root: int, name: Optional[str]):
        return tf.convert_to_tensor(tensor)

    def broadcast_object(self, obj: Any, root: int) -> Any:
        return obj

    def allgather_object(self, obj: Any) -> List[Any]:
        return [obj]

    def broadcast_variables(self, variables: Sequence[tf.Variable], root: int) -> None:
        return None

    def gradient_tape(self, tape, sparse_as_dense: bool, compression: str):
        return tape

    def average_gradients(self, grads, sparse_as_dense: bool, compression: str):
        return list(grads)


class _HorovodBackend(_Backend):
    name = "horovod"

    def __init__(self, hvd_module) -> None:
        self.hvd = hvd_module

    def rank(self) -> int:
        return self.hvd.rank()  # HVD

    def size(self) -> int:
        return self.hvd.size()  # HVD

    def local_rank(self) -> int:
        return self.hvd.local_rank()  # HVD

    def local_size(self) -> int:
        return self.hvd.local_size()  # HVD

    def _op(self, op: str):
        ops = {"average": self.hvd.Average, "sum": self.hvd.Sum,  # HVD
               "min": self.hvd.Min, "max": self.hvd.Max}  # HVD
        if op not in ops:
            raise ValueError(f"allreduce op {op!r} is not one of {sorted(ops)}")
        return ops[op]

    def _compression(self, compression: str):
        table = {"none": self.hvd.Compression.none, "fp16": self.hvd.Compression.fp16}  # HVD
        if compression not in table:
            raise ValueError(f"compression {compression!r} is not one of {sorted(table)}")
        return table[compression]

    def barrier(self) -> None:
        if hasattr(self.hvd, "barrier"):
            self.hvd.barrier()  # HVD
        else:  # older Horovod: any collective synchronises
            self.hvd.allreduce(tf.constant(0.0), op=self.hvd.Sum, name="lmkit.barrier")  # HVD

    def allreduce(self, tensor, op: str, name: Optional[str]):
        return self.hvd.allreduce(tensor, op=self._op(op), name=name)  # HVD

    def allgather(self, tensor, name: Optional[str]):
        return self.hvd.allgather(tensor, name=name)  # HVD

    def broadcast(self, tensor, root: int, name: Optional[str]):
        return self.hvd.broadcast(tensor, root_rank=root, name=name)  # HVD

    def broadcast_object(self, obj: Any, root: int) -> Any:
        return self.hvd.broadcast_object(obj, root_rank=root)  # HVD

    def allgather_object(self, obj: Any) -> List[Any]:
        return list(self.hvd.allgather_object(obj))  # HVD

    def broadcast_variables(self, variables: Sequence[tf.Variable], root: int) -> None:
        if variables:
            self.hvd.broadcast_variables(list(variables), root_rank=root)  # HVD

    def gradient_tape(self, tape, sparse_as_dense: bool, compression: str):
        return self.hvd.DistributedGradientTape(  # HVD
            tape, sparse_as_dense=sparse_as_dense, compression=self._compression(compression))

    def average_gradients(self, grads, sparse_as_dense: bool, compression: str):
        comp = self._compression(compression)
        out = []
        for i, g in enumerate(grads):
            if g is None:
                out.append(None)
                continue
            if isinstance(g, tf.IndexedSlices) and sparse_as_dense:
                g = tf.convert_to_tensor(g)
            out.append(self.hvd.allreduce(g, op=self.hvd.Average, compression=comp,  # HVD
                                          name=f"lmkit.grad.{i}"))
        return out


_BACKEND: Optional[_Backend] = None
_THREADS: Optional[ThreadSettings] = None


def launched_by_mpi_or_horovodrun() -> bool:
    """True when a launcher (mpirun, horovodrun, srun) started this process."""
    return any(k in os.environ for k in _LAUNCHER_ENV)


def _import_horovod():
    try:
        import horovod.tensorflow as hvd  # HVD
    except Exception as exc:  # ImportError, or a broken build (undefined symbols)
        raise DistributedError(
            "the Horovod backend needs horovod==0.28.1 built against TensorFlow "
            f"{' or '.join(SUPPORTED_TF_FOR_HOROVOD)}.x (found TensorFlow {tf.__version__}): "
            f"import failed with {type(exc).__name__}: {exc}. Run `make setup`, or use the "
            "native backend (use_horovod=False) on newer TensorFlow.") from exc
    return hvd


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def thread_settings(local_size: int, intra_op: Optional[int] = None,
                    inter_op: Optional[int] = None) -> ThreadSettings:
    """Threads for one rank when ``local_size`` ranks share this host.

    Each rank gets about ``cores / local_size`` intra-op threads so that the
    ranks of one host do not oversubscribe its cores.  Overrides come from the
    arguments, then from ``LMKIT_INTRA_OP_THREADS`` / ``LMKIT_INTER_OP_THREADS``.
    """
    total = os.cpu_count() or 1
    bound = _cpu_count()  # mpirun may bind each rank to fewer cores
    default_intra = max(1, min(bound, total // max(1, local_size)))
    intra = intra_op or int(os.environ.get("LMKIT_INTRA_OP_THREADS", "0") or 0) or default_intra
    inter = inter_op or int(os.environ.get("LMKIT_INTER_OP_THREADS", "0") or 0) or max(2, min(intra, 4))
    if intra < 1 or inter < 1:
        raise ValueError(f"thread counts must be >= 1, got intra_op={intra}, inter_op={inter}")
    return ThreadSettings(intra_op=intra, inter_op=inter)


def _configure_devices(local_rank: int, threads: ThreadSettings) -> None:
    """Pin this rank to its own GPU (if any) and set CPU threads.

    Must run before TensorFlow initialises its runtime (the first op).
    """
    try:
        gpus = tf.config.list_physical_devices("GPU")
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        if gpus:
            tf.config.set_visible_devices(gpus[local_rank % len(gpus)], "GPU")
        tf.config.threading.set_intra_op_parallelism_threads(threads.intra_op)
        tf.config.threading.set_inter_op_parallelism_threads(threads.inter_op)
    except RuntimeError:
        # The runtime was already initialised (e.g. a test created tensors
        # first); the settings then stay as they are.
        pass


def init(backend: Optional[str] = None, intra_op_threads: Optional[int] = None,
         inter_op_threads: Optional[int] = None) -> str:
    """Initialise the distributed runtime once; later calls return at once.

    Args:
      backend: ``"horovod"``, ``"local"`` or ``None`` (the default: Horovod when
        it is importable or a launcher started us, else a single local process).
        The environment variable ``LMKIT_BACKEND`` overrides the default.
      intra_op_threads: CPU threads per op; default cores / ranks on this host.
      inter_op_threads: ops run in parallel; default min(intra, 4), at least 2.

    Returns:
      The name of the backend in use.

    Raises:
      DistributedError: Horovod was asked for (or a launcher started us) but
        cannot be imported.
    """
    global _BACKEND, _THREADS
    if _BACKEND is not None:
        return _BACKEND.name
    backend = backend or os.environ.get("LMKIT_BACKEND") or None
    if backend not in (None, "horovod", "local"):
        raise ValueError(f"backend {backend!r} is not one of 'horovod', 'local'")
    if backend is None:
        if launched_by_mpi_or_horovodrun():
            backend = "horovod"
        else:
            try:
                _import_horovod()
                backend = "horovod"
            except DistributedError:
                backend = "local"
    if backend == "horovod":
        hvd = _import_horovod()
        hvd.init()  # HVD
        impl: _Backend = _HorovodBackend(hvd)
    else:
        impl = _Backend()
    _THREADS = thread_settings(impl.local_size(), intra_op_threads, inter_op_threads)
    _configure_devices(impl.local_rank(), _THREADS)
    _BACKEND = impl
    return impl.name


def _backend() -> _Backend:
    if _BACKEND is None:
        init()
    assert _BACKEND is not None
    return _BACKEND


def backend_name() -> str:
    """Name of the backend in use (initialises on first call)."""
    return _backend().name


def threads() -> ThreadSettings:
    """The CPU thread settings chosen at :func:`init`."""
    _backend()
    assert _THREADS is not None
    return _THREADS


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


def is_chief() -> bool:
    """True on rank 0, the rank that evaluates, logs and writes checkpoints."""
    return rank() == 0


def barrier() -> None:
    """Block until every rank reaches this point."""
    _backend().barrier()


def allreduce(tensor, op: str = "average", name: Optional[str] = None) -> tf.Tensor:
    """Reduce a tensor over all ranks (``average``, ``sum``, ``min`` or ``max``)."""
    return _backend().allreduce(tensor, op, name)


def allgather(tensor, name: Optional[str] = None) -> tf.Tensor:
    """Concatenate the tensors of all ranks along their first dimension."""
    return _backend().allgather(tensor, name)


def broadcast(tensor, root: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """The value of ``tensor`` on rank ``root``, on every rank."""
    return _backend().broadcast(tensor, root, name)


def allreduce_scalar(value: float, op: str = "average") -> float:
    """Reduce a Python number over all ranks; returns a Python float."""
    out = allreduce(tf.constant(float(value), dtype=tf.float64), op=op)
    return float(np.asarray(out))


def broadcast_scalar(value: float, root: int = 0) -> float:
    """Rank ``root``'s Python number, on every rank."""
    return float(np.asarray(broadcast(tf.constant(float(value), dtype=tf.float64), root)))


def broadcast_object(obj: T, root: int = 0) -> T:
    """Rank ``root``'s picklable object, on every rank."""
    return _backend().broadcast_object(obj, root)


def allgather_object(obj: Any) -> List[Any]:
    """A list with every rank's picklable object, in rank order."""
    return _backend().allgather_object(obj)


def broadcast_variables(variables: Iterable[tf.Variable], root: int = 0) -> None:
    """Overwrite ``variables`` on every rank with their values on ``root``."""
    _backend().broadcast_variables(list(variables), root)


def DistributedGradientTape(tape: tf.GradientTape, sparse_as_dense: bool = False,  # noqa: N802
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


def shutdown() -> None:
    """Shut the backend down (tests use this between backends)."""
    global _BACKEND, _THREADS
    if _BACKEND is not None and _BACKEND.name == "horovod":
        _BACKEND.hvd.shutdown()  # HVD
    _BACKEND = None
    _THREADS = None
