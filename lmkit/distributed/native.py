"""The native backend: TensorFlow's own distribution, any TensorFlow version.

On one host, ``tf.distribute.MirroredStrategy`` runs ``num_gpus``
data-parallel replicas in one process (on a CPU-only host, over that many
logical CPU devices); across hosts, ``tf.distribute.MultiWorkerMirroredStrategy``
runs one process per worker, configured by ``TF_CONFIG`` (``python -m
lmkit.launch`` writes it; :mod:`lmkit.distributed.native_setup` reads it and
builds the strategy). Every line specific to TensorFlow's distribution
carries a ``# NATIVE`` comment.

Why the strategies' own replica model (``strategy.run``) serves both cases
rather than raw collective ops per process: one code path serves one host
and many; the multi-worker strategy sets up the cluster, health checks and
collective keys that raw ops would make us re-implement; and on a CPU-only
host the same path is testable with logical devices. Variables are created
under :meth:`NativeBackend.scope` and keep the default
``VariableAggregation.NONE``: in replica context each replica then updates
its own copy, and since gradients are all-reduced before the update every
replica applies the same update -- Horovod's model, with no ``merge_call``
(which would be illegal inside the trainer's ``tf.cond``). A checkpoint
holds one copy of each variable under the same name as with Horovod, so a
run started with one backend resumes with the other.
"""

from __future__ import annotations

import os
import pickle
from typing import Any, Callable, ContextManager, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from lmkit.core.checks import check_choice, check_divisible
from lmkit.core.errors import UsageError
from lmkit.distributed.base import COMPRESSIONS, REDUCE_OPS, Backend, DistributedError
from lmkit.distributed.env import (
    LOCAL_RANK_ENV,
    LOCAL_SIZE_ENV,
    launched_by_mpi_or_horovodrun,
    pin_gpus,
    thread_settings,
)
from lmkit.distributed.native_setup import (
    DEFAULT_PACK_BYTES,
    configure_devices,
    make_strategy,
    pack_bytes_setting,
    tf_config_cluster,
)

__all__ = ["NativeBackend"]

_REPLICA_REDUCE = {"average": tf.distribute.ReduceOp.MEAN, "sum": tf.distribute.ReduceOp.SUM}  # NATIVE
_COLLECTIVE_DTYPES = (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)
# How TensorFlow aborts the collectives of the other workers when one failed, exited or was
# killed (its connections closed): those workers are bystanders, not the cause.
_PEER_ABORTED = "Collective ops is aborted by"


def _reduce_stacked(stacked: tf.Tensor, op: str) -> tf.Tensor:
    """Reduces ``stacked`` [participants, ...] over its first axis."""
    if op == "sum":
        return tf.reduce_sum(stacked, axis=0)
    if op == "average":
        return tf.reduce_mean(stacked, axis=0)
    if op == "min":
        return tf.reduce_min(stacked, axis=0)
    if op == "max":
        return tf.reduce_max(stacked, axis=0)
    raise AssertionError(op)  # checked by the caller


def _on_replica_device(value):
    """``value`` made inside the replica: a value handed to the replica unchanged has no
    device yet, and the strategy reduces to the device of the value."""
    if isinstance(value, tf.IndexedSlices):
        return tf.IndexedSlices(tf.identity(value.values), tf.identity(value.indices), value.dense_shape)
    return tf.identity(value)


def _packable_slices(g: Any) -> bool:
    """True for IndexedSlices that :meth:`NativeBackend._replica_average` gathers in one call:
    2-D float32 values and int32/int64 indices, all with static shapes."""
    return (isinstance(g, tf.IndexedSlices) and g.values.dtype == tf.float32
            and g.indices.dtype in (tf.int32, tf.int64) and g.values.shape.rank == 2
            and g.values.shape.is_fully_defined() and g.indices.shape.is_fully_defined())


def _indices_as(indices: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """[rows] integer indices as [rows, words] of ``dtype`` (exact: a bitcast)."""
    words = tf.bitcast(indices, dtype)  # int32 -> [rows], int64 -> [rows, 2]
    return words[:, tf.newaxis] if words.shape.rank == 1 else words


def _indices_from(words: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """The inverse of :func:`_indices_as`."""
    return tf.bitcast(words[:, 0] if dtype == tf.int32 else words, dtype)


class NativeBackend(Backend):
    """TensorFlow's own distribution: a MirroredStrategy or MultiWorkerMirroredStrategy.

    Collectives inside :meth:`run` (replica context) go through the replica
    context; collectives outside it (start-up, objects, barriers) are process
    level and go through ``strategy.gather``, which every process of a
    multi-worker job must call in the same order -- the same rule as Horovod's.
    """

    name = "native"

    def __init__(self, strategy: tf.distribute.Strategy, rank: int, size: int,
                 local_rank: int, local_size: int, pack_bytes: int = DEFAULT_PACK_BYTES) -> None:
        self.strategy = strategy
        self.pack_bytes = pack_bytes
        self._rank = rank
        self._size = size
        self._local_rank = local_rank
        self._local_size = local_size
        self._local = len(strategy.extended.worker_devices)  # NATIVE
        self._gather_fn: Optional[Callable[..., Any]] = None

    @classmethod
    def create(cls, *, intra_op_threads: Optional[int] = None, inter_op_threads: Optional[int] = None,
               num_gpus: int = 0) -> "NativeBackend":
        """Configures the devices, then builds the strategy (which starts TensorFlow's runtime).

        Raises:
          UsageError: a bad ``num_gpus`` for this host, or more workers on it than GPUs.
          DistributedError: started by mpirun/horovodrun, a bad ``TF_CONFIG``,
            or TensorFlow's runtime started before with too few devices.
        """
        if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 0:
            raise UsageError(f"num_gpus = {num_gpus!r} must be an integer >= 0 "
                             "(0 = every GPU of the host, or one CPU replica)")
        pack_bytes = pack_bytes_setting()
        cluster = tf_config_cluster()
        if cluster is None and launched_by_mpi_or_horovodrun():
            raise DistributedError(
                "use_horovod=False (the native backend) was started by mpirun/horovodrun, which would "
                "run independent copies; start it with `python` on one host or with "
                "`python -m lmkit.launch` on several, or set use_horovod=True")
        local_rank = int(os.environ.get(LOCAL_RANK_ENV, "0") or 0)
        local_size = int(os.environ.get(LOCAL_SIZE_ENV, "1") or 1)
        threads = thread_settings(local_size, intra_op_threads, inter_op_threads, min_inter_op=2)
        gpus = tf.config.list_physical_devices("GPU")
        if cluster is not None and not gpus and num_gpus > 1:
            raise UsageError(f"num_gpus = {num_gpus}, but on a host without GPUs each worker of a "
                             "multi-worker job is one replica; start more workers instead "
                             "(python -m lmkit.launch --num_workers N)")
        if gpus:
            # Workers that share a host share out its GPUs by local rank; under a scheduler
            # that shows each worker only its own (Slurm --gpus-per-task), it takes those.
            pin_gpus(local_rank, local_size, num_gpus or max(1, len(gpus) // local_size))
        configure_devices(logical_cpus=num_gpus if not gpus and cluster is None and num_gpus > 1 else 0,
                           intra_op=threads.intra_op, inter_op=threads.inter_op)
        strategy = make_strategy(cluster, bool(gpus), num_gpus)
        rank, size = cluster or (0, 1)
        backend = cls(strategy, rank, size, local_rank, local_size, pack_bytes=pack_bytes)
        backend.threads = threads
        return backend

    # ------------------------------------------------------------- identity
    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def local_rank(self) -> int:
        return self._local_rank

    def local_size(self) -> int:
        return self._local_size

    def num_replicas(self) -> int:
        return self.strategy.num_replicas_in_sync  # NATIVE

    def local_replicas(self) -> int:
        return self._local

    def device_type(self) -> str:
        devices = self.strategy.extended.worker_devices  # NATIVE
        return "GPU" if any("GPU" in d.upper() for d in devices) else "CPU"

    def scope(self) -> ContextManager[Any]:
        return self.strategy.scope()  # NATIVE

    def _in_replica_context(self) -> bool:
        """True inside :meth:`run` (the strategy's replica context)."""
        return (tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context()  # NATIVE
                and tf.distribute.get_strategy() is self.strategy)

    # ------------------------------------------------------------- replicas
    def run(self, fn: Callable[..., Any], args: Sequence[Any]) -> Any:
        args = tuple(args)
        local = self._local
        # Per-replica leaves (the carried RNN state) and Python values pass
        # through; tensors hold this process's rows and each replica takes one
        # contiguous block of them, as each Horovod rank takes its rows.
        split = tf.nest.map_structure(
            lambda a: ((tf.is_tensor(a) or isinstance(a, np.ndarray)) and len(a.shape) > 0
                       and not isinstance(a, tf.distribute.DistributedValues)), args)

        def replica_fn(*replica_args):
            ctx = tf.distribute.get_replica_context()  # NATIVE
            index = ctx.replica_id_in_sync_group % local  # this process's replicas are consecutive
            static_index = tf.get_static_value(index)

            def cut(value, do_split):
                if not do_split or local == 1:
                    return value
                value = tf.convert_to_tensor(value)
                rows = value.shape[0]
                if rows is not None:
                    check_divisible("this process's batch of rows", rows, local, "replicas")
                if rows is not None and static_index is not None:
                    per = rows // local
                    return value[static_index * per:(static_index + 1) * per]
                per = tf.shape(value)[0] // local
                return value[index * per:(index + 1) * per]

            return fn(*tf.nest.map_structure(cut, replica_args, split))

        return self.strategy.run(replica_fn, args=args)  # NATIVE

    def per_replica(self, fn: Callable[[], Any]) -> Any:
        devices = self.strategy.extended.worker_devices  # NATIVE
        if self._local == 1:
            # The strategy hands one replica's results back as plain values: a state made
            # here as a one-part PerReplica would differ in kind from the one a step returns,
            # and the compiled step would be traced a second time at step 2.
            with tf.device(devices[0]):
                return fn()

        made: List[Any] = []

        def value_fn(ctx):  # made on the replica's own device
            with tf.device(devices[ctx.replica_id_in_sync_group % self._local]):
                made.append(fn())
            return made[-1]

        values = self.strategy.experimental_distribute_values_from_function(value_fn)  # NATIVE
        return None if all(m is None for m in made) else values

    def local_rows(self, value: Any) -> Any:
        def rows(v):
            if isinstance(v, tf.distribute.DistributedValues):
                parts = self.strategy.experimental_local_results(v)  # NATIVE: replica order = row order
                return tf.concat(parts, axis=0) if len(parts) > 1 else parts[0]
            return v
        return tf.nest.map_structure(rows, value)

    def first(self, value: Any) -> Any:
        def pick(v):
            if isinstance(v, tf.distribute.DistributedValues):
                return self.strategy.experimental_local_results(v)[0]  # NATIVE
            return v
        return tf.nest.map_structure(pick, value)

    # --------------------------------------------------- process collectives
    def _gather_many(self, tensors: Sequence[Any]) -> List[tf.Tensor]:
        """Stacks tensors that have the same shape on every process: each [size, ...].

        One batched all-gather in one compiled function (eager collectives of
        the strategy would trace a new function per call).
        """
        ts = [tf.convert_to_tensor(t) for t in tensors]
        dtypes = [t.dtype for t in ts]
        # Collectives move only a few types; others travel cast (and come back exact).
        ts = [t if t.dtype in _COLLECTIVE_DTYPES else
              tf.cast(t, tf.float32 if t.dtype.is_floating else tf.int64) for t in ts]
        if self._gather_fn is None:
            strategy = self.strategy

            def replica_gather(values):
                ctx = tf.distribute.get_replica_context()  # NATIVE
                return ctx.all_gather([v[tf.newaxis] for v in values], axis=0)  # each [replicas, ...]

            def gather(values):
                out = strategy.run(replica_gather, args=(values,))  # NATIVE
                return [strategy.experimental_local_results(v)[0] for v in out]  # NATIVE

            self._gather_fn = tf.function(gather, reduce_retracing=True)
        gathered = self._gather_fn(ts)
        return [tf.cast(g[::self._local], d) for g, d in zip(gathered, dtypes)]  # one row per process

    def _gather_equal(self, tensor) -> tf.Tensor:
        """Stacks a tensor of the same shape on every process: [size, ...]."""
        return self._gather_many([tensor])[0]

    def _gather_ragged(self, tensor) -> List[tf.Tensor]:
        """Every process's tensor (first dimensions may differ), in rank order."""
        t = tf.convert_to_tensor(tensor)
        sizes = [int(n) for n in self._gather_equal(tf.shape(t, out_type=tf.int64)[:1]).numpy()[:, 0]]
        longest = max(sizes)
        padding = [[0, longest - sizes[self._rank]]] + [[0, 0]] * (t.shape.rank - 1)
        gathered = self._gather_equal(tf.pad(t, padding))  # [size, longest, ...]
        return [gathered[p, :n] for p, n in enumerate(sizes)]

    def barrier(self) -> None:
        if self._size > 1:
            self._gather_equal(tf.zeros([1])).numpy()

    def allreduce(self, tensor, op: str, name: Optional[str]):
        check_choice("allreduce op", op, REDUCE_OPS)
        if self._in_replica_context():  # over all replicas
            ctx = tf.distribute.get_replica_context()  # NATIVE
            tensor = _on_replica_device(tensor)
            if op in _REPLICA_REDUCE:
                return ctx.all_reduce(_REPLICA_REDUCE[op], tensor)  # NATIVE
            stacked = ctx.all_gather(tf.convert_to_tensor(tensor)[tf.newaxis], axis=0)  # NATIVE
            return _reduce_stacked(stacked, op)
        t = tf.convert_to_tensor(tensor)  # over processes
        if self._size == 1:
            return tf.identity(t)
        return _reduce_stacked(self._gather_equal(t), op)

    def allgather(self, tensor, name: Optional[str]):
        if self._in_replica_context():
            return tf.distribute.get_replica_context().all_gather(tensor, axis=0)  # NATIVE
        if self._size == 1:
            return tf.identity(tf.convert_to_tensor(tensor))
        return tf.concat(self._gather_ragged(tensor), axis=0)

    def broadcast(self, tensor, root: int, name: Optional[str]):
        if self._in_replica_context():
            t = tf.convert_to_tensor(tensor)
            stacked = tf.distribute.get_replica_context().all_gather(t[tf.newaxis], axis=0)  # NATIVE
            return stacked[root * self._local]  # the first replica of process `root`
        if self._size == 1:
            return tf.identity(tf.convert_to_tensor(tensor))
        return self._gather_equal(tensor)[root]

    def _gather_bytes(self, payload: bytes) -> List[bytes]:
        # Collectives carry no uint8: send int32 words, with the length up front.
        framed = len(payload).to_bytes(8, "little") + payload
        framed += b"\0" * (-len(framed) % 4)
        out = []
        for words in self._gather_ragged(np.frombuffer(framed, dtype=np.int32)):
            raw = words.numpy().tobytes()
            out.append(raw[8:8 + int.from_bytes(raw[:8], "little")])
        return out

    def broadcast_object(self, obj: Any, root: int) -> Any:
        if self._size == 1:
            return obj
        payload = pickle.dumps(obj) if self._rank == root else b""
        return pickle.loads(self._gather_bytes(payload)[root])

    def allgather_object(self, obj: Any) -> List[Any]:
        if self._size == 1:
            return [obj]
        return [pickle.loads(p) for p in self._gather_bytes(pickle.dumps(obj))]

    def broadcast_variables(self, variables: Sequence[tf.Variable], root: int) -> None:
        outside = [v.name for v in variables if not isinstance(v, tf.distribute.DistributedValues)]
        if outside:
            raise DistributedError(
                f"{len(outside)} variable(s) (first: {outside[0]!r}) were created outside "
                "dist.scope(); with the native backend (use_horovod=False) create the model, and "
                "any optimizer you pass to the Trainer, under `with dist.scope():`")
        # Reading in cross-replica context gives the first copy; assigning
        # writes every copy of this process.
        values = [v.read_value() for v in variables]
        if self._size > 1 and values:
            values = [stacked[root] for stacked in self._gather_many(values)]
        for v, value in zip(variables, values):
            v.assign(value)

    # ------------------------------------------------------------ gradients
    def _replica_average(self, grads: List[Any], dense_summed: bool = False) -> List[Any]:
        """The mean over every replica of ``grads`` (tensors and IndexedSlices), in replica context.

        With ``dense_summed`` the dense tensors come divided by the replica
        count already (fp16 compression) and are summed.

        Dense tensors go in one call of the strategy, which packs them into
        all-reduces of about ``pack_bytes`` each, issued in the order the
        backward pass produces them (the last layer's first): a pack starts
        while the rest of the backward pass still runs, as Horovod's fused
        all-reduces do. An ``IndexedSlices`` whose rows have the same static
        shape on every replica travels as one all-gather of its values with
        its indices bitcast alongside (the strategy's own path makes three
        collectives: lengths, values, indices); others take that path.
        """
        ctx = tf.distribute.get_replica_context()  # NATIVE
        grads = [_on_replica_device(g) for g in grads]
        out: List[Any] = [None] * len(grads)
        gathered = [i for i, g in enumerate(grads) if _packable_slices(g)]
        by_strategy = [i for i in range(len(grads)) if i not in gathered]  # dense, and other slices
        if by_strategy:
            options = tf.distribute.experimental.CommunicationOptions(  # NATIVE
                bytes_per_pack=self.pack_bytes)
            groups = [(tf.distribute.ReduceOp.MEAN, by_strategy)]  # NATIVE
            if dense_summed:
                dense = [i for i in by_strategy if not isinstance(grads[i], tf.IndexedSlices)]
                groups = [(tf.distribute.ReduceOp.SUM, dense),  # NATIVE
                          (tf.distribute.ReduceOp.MEAN, [i for i in by_strategy if i not in dense])]
            for op, members in groups:
                if members:
                    for i, r in zip(members, ctx.all_reduce(op, [grads[i] for i in members],  # NATIVE
                                                            options=options)):
                        out[i] = r
        n = self.num_replicas()
        for i in gathered:
            g = grads[i]
            rows = tf.concat([g.values, _indices_as(g.indices, g.values.dtype)], axis=1)
            every = ctx.all_gather(rows, axis=0)  # NATIVE: [n * rows, width + index words]
            width = g.values.shape[1]
            out[i] = tf.IndexedSlices(every[:, :width] / n,
                                      _indices_from(every[:, width:], g.indices.dtype), g.dense_shape)
        return out

    def average_gradients(self, grads, sparse_as_dense: bool, compression: str):
        check_choice("compression", compression, COMPRESSIONS)
        compressed = compression == "fp16"
        grads = list(grads)
        todo, casts = [], []
        for g in grads:
            if g is None:
                continue
            if isinstance(g, tf.IndexedSlices) and sparse_as_dense:
                g = tf.convert_to_tensor(g)
            cast_back = None
            if compressed and not isinstance(g, tf.IndexedSlices) and g.dtype.is_floating:
                # Divided by the replica count before the cast and summed on the wire: a
                # loss-scaled gradient summed over N replicas in float16 would overflow.
                cast_back = g.dtype
                g = tf.cast(g * tf.cast(1.0 / self.num_replicas(), g.dtype), tf.float16)
            todo.append(g)
            casts.append(cast_back)
        if self._in_replica_context():
            reduced = self._replica_average(todo, dense_summed=compressed)
        else:
            reduced = [self.allreduce(tf.convert_to_tensor(g), "average" if c is None else "sum", None)
                       for g, c in zip(todo, casts)]  # compressed ones come divided already
        reduced = [r if c is None else tf.cast(r, c) for r, c in zip(reduced, casts)]
        it = iter(reduced)
        return [None if g is None else next(it) for g in grads]

    # ------------------------------------------------------------ lifecycle
    def is_peer_failure(self, exc: BaseException) -> bool:
        return isinstance(exc, tf.errors.OpError) and _PEER_ABORTED in str(exc)  # NATIVE
