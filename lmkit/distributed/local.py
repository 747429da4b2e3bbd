"""The single-process backend: no launcher, no peers, no Horovod needed.

Every collective returns its input (the "average" over one rank is the value
itself), so code written for N workers runs unchanged in one process.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from lmkit.distributed.base import Backend
from lmkit.distributed.env import configure_devices, thread_settings

__all__ = ["LocalBackend"]


class LocalBackend(Backend):
    """One process, one replica (``rank() == 0``, ``size() == 1``)."""

    name = "local"

    def __init__(self) -> None:
        self.threads = thread_settings(1)

    @classmethod
    def create(cls, *, intra_op_threads: Optional[int] = None, inter_op_threads: Optional[int] = None,
               num_gpus: int = 0) -> "LocalBackend":
        del num_gpus  # one replica on this process's device
        backend = cls()
        backend.threads = thread_settings(1, intra_op_threads, inter_op_threads)
        configure_devices(0, 1, backend.threads)
        return backend

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

    def allreduce(self, tensor: Any, op: str, name: Optional[str]) -> Any:
        import tensorflow as tf
        return tf.convert_to_tensor(tensor)

    def allgather(self, tensor: Any, name: Optional[str]) -> Any:
        import tensorflow as tf
        return tf.convert_to_tensor(tensor)

    def broadcast(self, tensor: Any, root: int, name: Optional[str]) -> Any:
        import tensorflow as tf
        return tf.convert_to_tensor(tensor)

    def broadcast_object(self, obj: Any, root: int) -> Any:
        return obj

    def allgather_object(self, obj: Any) -> List[Any]:
        return [obj]

    def broadcast_variables(self, variables: Sequence[Any], root: int) -> None:
        return None

    def gradient_tape(self, tape: Any, sparse_as_dense: bool, compression: str) -> Any:
        return tape

    def average_gradients(self, grads: Sequence[Any], sparse_as_dense: bool,
                          compression: str) -> List[Any]:
        return list(grads)
