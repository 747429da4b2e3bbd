"""The Horovod backend: one process per replica, launched by ``mpirun`` or ``horovodrun``.

The only file of lmkit that imports Horovod; every Horovod-specific line
carries a ``# HVD`` comment. Horovod 0.28.1 (its last release) builds only
against TensorFlow up to 2.18, so :func:`import_horovod` refuses other
versions with a message naming the fix (``make setup``, or the native
backend).

Started as a plain ``python script.py`` this backend is a job of size 1.
"""

from __future__ import annotations

import sys
from typing import Any, List, Optional, Sequence

import tensorflow as tf

from lmkit.core.checks import check_choice
from lmkit.distributed.base import COMPRESSIONS, REDUCE_OPS, Backend, DistributedError
from lmkit.distributed.env import configure_devices, quiet_mpi_polling, thread_settings

__all__ = ["HorovodBackend", "SUPPORTED_TF_FOR_HOROVOD", "import_horovod", "nccl_warning"]

SUPPORTED_TF_FOR_HOROVOD = ("2.18",)


def import_horovod():
    """``horovod.tensorflow``, when it was built against this TensorFlow.

    Raises:
      DistributedError: the TensorFlow version is not one Horovod builds
        against, or the import fails (not installed, a broken build).
    """
    needs = ("the Horovod backend needs horovod==0.28.1 built against TensorFlow "
             f"{' or '.join(SUPPORTED_TF_FOR_HOROVOD)}.x (found TensorFlow {tf.__version__})")
    fix = "Run `make setup`, or use the native backend (use_horovod=False) on newer TensorFlow."
    if not tf.__version__.startswith(tuple(v + "." for v in SUPPORTED_TF_FOR_HOROVOD)):
        # Even when an old build imports, it would run against the wrong TensorFlow ABI.
        raise DistributedError(f"{needs}. {fix}")
    try:
        import horovod.tensorflow as hvd  # HVD
    except Exception as exc:  # ImportError, or a broken build (undefined symbols)
        raise DistributedError(
            f"{needs}: import failed with {type(exc).__name__}: {exc}. {fix}") from exc
    return hvd


def nccl_warning(hvd: Any, device_type: str) -> Optional[str]:
    """The warning for a job on GPUs whose Horovod was built without NCCL, else None.

    Without NCCL Horovod averages GPU tensors through MPI or Gloo on the host:
    every gradient is copied to the CPU and back at each step.
    """
    if device_type != "GPU" or hvd.size() == 1 or hvd.nccl_built():  # HVD
        return None
    return ("[lmkit] warning: GPUs are visible but this Horovod was built without NCCL, so "
            "gradients are averaged through the host; rebuild it with `make setup` on a GPU "
            "machine (HOROVOD_GPU_OPERATIONS=NCCL), see the README's GPU section")


class HorovodBackend(Backend):
    """Horovod over MPI or Gloo; every process is one replica."""

    name = "horovod"

    def __init__(self, hvd_module: Any) -> None:
        self.hvd = hvd_module

    @classmethod
    def create(cls, *, intra_op_threads: Optional[int] = None, inter_op_threads: Optional[int] = None,
               num_gpus: int = 0) -> "HorovodBackend":
        del num_gpus  # one GPU per process, chosen by local rank
        hvd = import_horovod()
        quiet_mpi_polling()
        hvd.init()  # HVD
        backend = cls(hvd)
        backend.threads = thread_settings(backend.local_size(), intra_op_threads, inter_op_threads)
        configure_devices(backend.local_rank(), backend.local_size(), backend.threads)
        warning = nccl_warning(hvd, backend.device_type())
        if warning and backend.rank() == 0:
            print(warning, file=sys.stderr, flush=True)
        return backend

    # ------------------------------------------------------------- identity
    def rank(self) -> int:
        return self.hvd.rank()  # HVD

    def size(self) -> int:
        return self.hvd.size()  # HVD

    def local_rank(self) -> int:
        return self.hvd.local_rank()  # HVD

    def local_size(self) -> int:
        return self.hvd.local_size()  # HVD

    def _op(self, op: str):
        check_choice("allreduce op", op, REDUCE_OPS)
        return {"average": self.hvd.Average, "sum": self.hvd.Sum,  # HVD
                "min": self.hvd.Min, "max": self.hvd.Max}[op]  # HVD

    def _compression(self, compression: str):
        check_choice("compression", compression, COMPRESSIONS)
        return {"none": self.hvd.Compression.none, "fp16": self.hvd.Compression.fp16}[compression]  # HVD

    # ---------------------------------------------------------- collectives
    def barrier(self) -> None:
        if hasattr(self.hvd, "barrier"):
            self.hvd.barrier()  # HVD
        else:  # older Horovod: any collective synchronises
            self.hvd.allreduce(tf.constant(0.0), op=self.hvd.Sum, name="lmkit.barrier")  # HVD

    def allreduce(self, tensor: Any, op: str, name: Optional[str]) -> Any:
        self._op(op)  # an unknown op is an error also in one process
        if self.size() == 1:  # the identity, with no Horovod op (which XLA cannot compile)
            return tf.identity(tensor)
        return self.hvd.allreduce(tensor, op=self._op(op), name=name)  # HVD

    def allgather(self, tensor: Any, name: Optional[str]) -> Any:
        return self.hvd.allgather(tensor, name=name)  # HVD

    def broadcast(self, tensor: Any, root: int, name: Optional[str]) -> Any:
        return self.hvd.broadcast(tensor, root_rank=root, name=name)  # HVD

    def broadcast_object(self, obj: Any, root: int) -> Any:
        return self.hvd.broadcast_object(obj, root_rank=root)  # HVD

    def allgather_object(self, obj: Any) -> List[Any]:
        return list(self.hvd.allgather_object(obj))  # HVD

    def broadcast_variables(self, variables: Sequence[Any], root: int) -> None:
        if variables:
            self.hvd.broadcast_variables(list(variables), root_rank=root)  # HVD

    # ------------------------------------------------------------ gradients
    def gradient_tape(self, tape: Any, sparse_as_dense: bool, compression: str) -> Any:
        self._compression(compression)
        if self.size() == 1:  # nothing to average; keeps a one-process step XLA-compilable
            return tape
        return super().gradient_tape(tape, sparse_as_dense, compression)

    def average_gradients(self, grads: Sequence[Any], sparse_as_dense: bool,
                          compression: str) -> List[Any]:
        comp = self._compression(compression)
        if self.size() == 1:  # nothing to average (and no Horovod op inside an XLA-compiled step)
            return list(grads)
        out = []
        for i, g in enumerate(grads):
            if g is None:
                out.append(None)
                continue
            if isinstance(g, tf.IndexedSlices) and sparse_as_dense:
                g = tf.convert_to_tensor(g)
            op = self.hvd.Average  # HVD
            if compression == "fp16" and not isinstance(g, tf.IndexedSlices):
                # Divided by the worker count before the float16 cast and summed on the wire:
                # a loss-scaled gradient summed over N workers in float16 would overflow
                # (Horovod's prescale_factor applies after the cast).
                g, op = g * tf.cast(1.0 / self.size(), g.dtype), self.hvd.Sum  # HVD
            out.append(self.hvd.allreduce(g, op=op, compression=comp, name=f"lmkit.grad.{i}"))  # HVD
        return out

    # ------------------------------------------------------------ lifecycle
    def is_peer_failure(self, exc: BaseException) -> bool:
        return "Horovod has been shut down" in str(exc)  # HVD: a peer raised, exited or stalled

    def shutdown(self) -> None:
        self.hvd.shutdown()  # HVD
