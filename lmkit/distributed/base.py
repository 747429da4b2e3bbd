"""The interface every distributed backend implements.

A backend answers who this process is (``rank``/``size``), moves tensors and
Python objects between processes (the collectives), averages gradients, and
says how replicas map onto processes. :mod:`lmkit.distributed` holds the one
backend in use and forwards its public functions to it; adding a backend is
one file with a :class:`Backend` subclass and one line in
``lmkit.distributed.BACKENDS``.

The defaults here describe the common case of one replica per process
(Horovod, a single local process); a backend with several replicas in one
process (the native one) overrides the replica methods.
"""

from __future__ import annotations

import abc
import contextlib
from typing import Any, Callable, ContextManager, List, Optional, Sequence

from lmkit.distributed.env import DistributedError, ThreadSettings  # noqa: F401 (DistributedError: its public home)

__all__ = ["AveragingTape", "Backend", "DistributedError", "REDUCE_OPS", "COMPRESSIONS"]

REDUCE_OPS = ("average", "sum", "min", "max")
COMPRESSIONS = ("none", "fp16")


class AveragingTape:
    """A gradient tape whose ``gradient()`` returns ``backend.average_gradients`` of its gradients.

    Every backend averages through one method, so the tape a user gets from
    :func:`lmkit.distributed.DistributedGradientTape` and the trainer's step agree
    (fp16 compression included).
    """

    def __init__(self, tape: Any, backend: "Backend", sparse_as_dense: bool,
                 compression: str) -> None:
        self._tape = tape
        self._backend = backend
        self._sparse_as_dense = sparse_as_dense
        self._compression = compression

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = None) -> Any:
        import tensorflow as tf  # this module stays importable without TensorFlow

        grads = self._tape.gradient(
            target, sources, output_gradients=output_gradients,
            unconnected_gradients=unconnected_gradients or tf.UnconnectedGradients.NONE)
        flat = tf.nest.flatten(grads)
        averaged = self._backend.average_gradients(flat, self._sparse_as_dense, self._compression)
        return tf.nest.pack_sequence_as(grads, averaged)

    def __getattr__(self, name: str) -> Any:  # watch(), stop_recording(), ...
        return getattr(self._tape, name)


class Backend(abc.ABC):
    """A distributed runtime: identity, collectives, gradient averaging and replicas.

    Subclasses set :attr:`name` (the key of ``lmkit.distributed.BACKENDS``) and
    implement the abstract methods; :meth:`create` builds one, configuring
    devices and CPU threads before TensorFlow's runtime starts.
    """

    name: str = ""
    threads: Optional[ThreadSettings] = None  # CPU threads chosen by create()

    @classmethod
    @abc.abstractmethod
    def create(cls, *, intra_op_threads: Optional[int], inter_op_threads: Optional[int],
               num_gpus: int) -> "Backend":
        """Initialises the runtime and returns the backend (called once, by ``dist.init``)."""

    # ------------------------------------------------------------- identity
    @abc.abstractmethod
    def rank(self) -> int:
        """Global rank of this process."""

    @abc.abstractmethod
    def size(self) -> int:
        """Number of processes."""

    @abc.abstractmethod
    def local_rank(self) -> int:
        """Rank among the processes of this host."""

    @abc.abstractmethod
    def local_size(self) -> int:
        """Processes on this host."""

    # ---------------------------------------------------------- collectives
    @abc.abstractmethod
    def barrier(self) -> None:
        """Blocks until every process arrives."""

    @abc.abstractmethod
    def allreduce(self, tensor: Any, op: str, name: Optional[str]) -> Any:
        """Reduces ``tensor`` over all ranks with ``op`` (one of :data:`REDUCE_OPS`)."""

    @abc.abstractmethod
    def allgather(self, tensor: Any, name: Optional[str]) -> Any:
        """Concatenates every rank's tensor along the first axis."""

    @abc.abstractmethod
    def broadcast(self, tensor: Any, root: int, name: Optional[str]) -> Any:
        """Rank ``root``'s tensor on every rank."""

    @abc.abstractmethod
    def broadcast_object(self, obj: Any, root: int) -> Any:
        """Rank ``root``'s picklable object on every rank."""

    @abc.abstractmethod
    def allgather_object(self, obj: Any) -> List[Any]:
        """Every rank's picklable object, in rank order."""

    @abc.abstractmethod
    def broadcast_variables(self, variables: Sequence[Any], root: int) -> None:
        """Overwrites ``variables`` with their values on ``root``."""

    # ------------------------------------------------------------ gradients
    def gradient_tape(self, tape: Any, sparse_as_dense: bool, compression: str) -> Any:
        """A tape whose ``gradient()`` averages over the replicas with :meth:`average_gradients`."""
        return AveragingTape(tape, self, sparse_as_dense, compression)

    @abc.abstractmethod
    def average_gradients(self, grads: Sequence[Any], sparse_as_dense: bool,
                          compression: str) -> List[Any]:
        """The gradients averaged over the replicas (None entries pass through)."""

    # ------------------------------------------------- replicas (default: 1)
    def num_replicas(self) -> int:
        """Data-parallel replicas over the whole job."""
        return self.size()

    def local_replicas(self) -> int:
        """Replicas in this process."""
        return 1

    def device_type(self) -> str:
        """``"GPU"`` when this process's replicas compute on GPUs, else ``"CPU"``."""
        import tensorflow as tf
        return "GPU" if tf.config.list_logical_devices("GPU") else "CPU"

    def scope(self) -> ContextManager[Any]:
        """Where to create the variables that training updates."""
        return contextlib.nullcontext()

    def run(self, fn: Callable[..., Any], args: Sequence[Any]) -> Any:
        """``fn(*args)`` once per local replica."""
        return fn(*args)

    def per_replica(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` made once per local replica."""
        return fn()

    def first(self, value: Any) -> Any:
        """The first local replica's part of a per-replica value."""
        return value

    def local_rows(self, value: Any) -> Any:
        """This process's rows of a per-replica value (its local replicas' parts, in order)."""
        return value

    # ------------------------------------------------------------ lifecycle
    def is_peer_failure(self, exc: BaseException) -> bool:
        """True when ``exc`` is a collective cancelled because another rank failed."""
        del exc
        return False

    def shutdown(self) -> None:
        """Releases the runtime (tests switch backends in one process)."""
        return None
