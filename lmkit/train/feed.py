"""Sending a training step's inputs to its device ahead of the step (``device_prefetch``).

A copy from host memory to a GPU is queued behind the work already queued on
the GPU, and, as we read TensorFlow's eager runtime, the host waits for it to
finish. If so, when each step's window is copied as the step starts, the host
cannot start step i + 1 before step i has ended, and the GPU idles while the
host starts it (a hypothesis: benchmarks/gpu_session.sh's ``idle`` stage
measures it; the option stays off until it has).
:class:`WindowFeed` makes the copies on a thread of its own, ``ahead`` steps
early: the host then starts a step on inputs that are already there.
:func:`flag_tensors` keeps the step's flags on the device for the
same reason. On a CPU the copies are no copies; the feed changes nothing
there but the thread that makes the tensors (which the tests use).
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import tensorflow as tf

from lmkit import distributed as dist

__all__ = ["WindowFeed", "feed_device", "flag_tensors", "host_flags", "window_feed"]


def feed_device() -> str:
    """Where a step's inputs go: this process's GPU when it runs one replica on a GPU, else the host."""
    if dist.device_type() == "GPU" and dist.local_replicas() == 1:
        gpus = tf.config.list_logical_devices("GPU")
        if gpus:
            return gpus[0].name
    return "/CPU:0"


class WindowFeed:
    """The windows ``batches[i]`` as tensors on ``device``, made ``ahead`` steps early on one thread.

    Args:
      batches: a sequence of numpy nests (a :class:`~lmkit.data.batching.Batches`).
      device: a TensorFlow device name (:func:`feed_device`).
      ahead: how many steps after the one asked for are being copied meanwhile (>= 1).

    ``get(i)`` returns window ``i``'s ``(inputs, targets)``; asking for the windows
    in another order works (each is made when first asked for) but gains nothing.
    Call :meth:`close` (or use it as a context manager) when the epoch ends.
    """

    def __init__(self, batches: Sequence[Any], device: str, ahead: int = 2) -> None:
        if ahead < 1:
            raise ValueError(f"ahead {ahead!r} must be >= 1")
        self.batches = batches
        self.device = device
        self.ahead = ahead
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmkit-feed")
        self._pending: Dict[int, concurrent.futures.Future] = {}

    def _make(self, index: int) -> Any:
        with tf.device(self.device):
            return tf.nest.map_structure(lambda a: tf.identity(tf.constant(a)), self.batches[index])

    def _submit(self, index: int) -> None:
        if 0 <= index < len(self.batches) and index not in self._pending:
            self._pending[index] = self._pool.submit(self._make, index)

    def get(self, index: int) -> Tuple[Any, Any]:
        """Window ``index``'s tensors; starts copying the next ``ahead`` windows."""
        self._submit(index)
        for later in range(index + 1, index + 1 + self.ahead):
            self._submit(later)
        for old in [i for i in self._pending if i < index]:  # skipped windows (a resume): drop them
            self._pending.pop(old).cancel()
        return self._pending.pop(index).result()

    def close(self) -> None:
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()
        self._pool.shutdown(wait=True)

    def __enter__(self) -> "WindowFeed":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def window_feed(batches: Sequence[Any], ahead: int) -> Optional[WindowFeed]:
    """``batches``' windows sent to the step's device (:func:`feed_device`) ``ahead`` steps early, or None
    when ``ahead`` is 0 (``TrainConfig.device_prefetch``)."""
    return WindowFeed(batches, feed_device(), ahead) if ahead else None


def host_flags(stop: float, save: float, end: float = 0.0) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The step's flags ``(stop, save, end)`` as float32 scalars in host memory, made at every step (no
    device_prefetch). Scalars, not one vector: the native backend splits a tensor's rows among its replicas."""
    return tf.constant(stop, tf.float32), tf.constant(save, tf.float32), tf.constant(end, tf.float32)


def flag_tensors(device: str) -> Callable[..., Tuple[tf.Tensor, tf.Tensor, tf.Tensor]]:
    """A function ``(stop, save, end=0) -> (tensor, tensor, tensor)`` whose float32 scalars live on ``device``,
    made once per value (the flags are 0 or 1): no copy from host memory at each step."""
    cache: Dict[float, tf.Tensor] = {}

    def flags(stop: float, save: float, end: float = 0.0) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        out = []
        for value in (float(stop), float(save), float(end)):
            if value not in cache:
                with tf.device(device):
                    cache[value] = tf.identity(tf.constant(value, tf.float32))
            out.append(cache[value])
        return out[0], out[1], out[2]

    return flags
