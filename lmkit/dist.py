"""The one place in lmkit that talks to the distributed runtime.

Everything else in lmkit (trainer, data loading, examples) calls the functions
of this module and never imports Horovod or names a ``tf.distribute``
strategy.  That keeps the distributed seams in one file and lets a second
backend stand beside Horovod (Horovod 0.28.1 is its last release and builds
only against TensorFlow up to 2.18).

Backends:

* ``"horovod"``: Horovod over MPI or Gloo, launched with ``mpirun``/``horovodrun``.
  Also works in a plain ``python script.py`` process (size 1, rank 0).
* ``"native"``: TensorFlow's own distribution, any TensorFlow version
  (config ``use_horovod = False``).  On one host, ``tf.distribute.MirroredStrategy``
  runs ``num_gpus`` data-parallel replicas in one process (on a CPU-only host,
  over that many logical CPU devices); across hosts,
  ``tf.distribute.MultiWorkerMirroredStrategy`` runs one process per worker,
  configured by ``TF_CONFIG`` (``python -m lmkit.launch`` writes it).
* ``"local"``: one process, no Horovod needed.  Chosen automatically when
  Horovod is not installed and the process was not started by a launcher.

Terms: a *process* (``rank()`` of ``size()``) does the host-side work (data,
logging, checkpoints on rank 0); a *replica* is one data-parallel copy of the
model (``num_replicas()`` in all, ``local_replicas()`` in this process).  With
Horovod every process is one replica; the native backend may hold several
replicas in one process.

Why the native backend uses the strategies' own replica model (``strategy.run``)
for both cases rather than raw collective ops per process: one code path
serves one host and many; the multi-worker strategy sets up the cluster,
health checks and collective keys that raw ops would make us re-implement;
and on a CPU-only host the same path is testable with logical devices.
Variables are created under :func:`scope` and keep the default
``VariableAggregation.NONE``: in replica context each replica then updates
its own copy, and since gradients are all-reduced before the update every
replica applies the same update -- Horovod's model, with no ``merge_call``
(which would be illegal inside the trainer's ``tf.cond``).  A checkpoint holds
one copy of each variable under the same name as with Horovod, so a run
started with one backend resumes with the other.

Typical use::

    from lmkit import dist
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

Lines that are specific to Horovod carry a ``# HVD`` comment, lines specific
to TensorFlow's distribution a ``# NATIVE`` comment.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterable, List, Optional, Sequence, Tuple, TypeVar

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

    # Replicas: with Horovod (and locally) every process is exactly one replica.
    def num_replicas(self) -> int:
        return self.size()

    def local_replicas(self) -> int:
        return 1

    def scope(self) -> ContextManager[Any]:
        return contextlib.nullcontext()

    def run(self, fn: Callable[..., Any], args: Sequence[Any]) -> Any:
        return fn(*args)

    def per_replica(self, fn: Callable[[], Any]) -> Any:
        return fn()

    def first(self, value: Any) -> Any:
        return value


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


_REPLICA_REDUCE = {"average": tf.distribute.ReduceOp.MEAN, "sum": tf.distribute.ReduceOp.SUM}  # NATIVE
_REDUCE_OPS = ("average", "sum", "min", "max")
_COLLECTIVE_DTYPES = (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)


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
    raise ValueError(f"allreduce op {op!r} is not one of {list(_REDUCE_OPS)}")


class _AveragingTape:
    """A gradient tape whose ``gradient()`` averages over the replicas (native backend)."""

    def __init__(self, tape: tf.GradientTape, backend: "_NativeBackend", sparse_as_dense: bool,
                 compression: str) -> None:
        self._tape = tape
        self._backend = backend
        self._sparse_as_dense = sparse_as_dense
        self._compression = compression

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients,
                                    unconnected_gradients=unconnected_gradients)
        flat = tf.nest.flatten(grads)
        averaged = self._backend.average_gradients(flat, self._sparse_as_dense, self._compression)
        return tf.nest.pack_sequence_as(grads, averaged)

    def __getattr__(self, name: str) -> Any:  # watch(), stop_recording(), ...
        return getattr(self._tape, name)


class _NativeBackend(_Backend):
    """TensorFlow's own distribution: a MirroredStrategy or MultiWorkerMirroredStrategy.

    Collectives inside :meth:`run` (replica context) go through the replica
    context; collectives outside it (start-up, objects, barriers) are process
    level and go through ``strategy.gather``, which every process of a
    multi-worker job must call in the same order -- the same rule as Horovod's.
    """

    name = "native"

    def __init__(self, strategy: tf.distribute.Strategy, rank: int, size: int,
                 local_rank: int, local_size: int) -> None:
        self.strategy = strategy
        self._rank = rank
        self._size = size
        self._local_rank = local_rank
        self._local_size = local_size
        self._local = len(strategy.extended.worker_devices)  # NATIVE
        self._gather_fn: Optional[Callable[..., Any]] = None

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
                if rows is not None and rows % local:
                    raise ValueError(f"a batch of {rows} rows cannot be split evenly over {local} "
                                     f"replicas; use a batch_size divisible by {local}")
                if rows is not None and static_index is not None:
                    per = rows // local
                    return value[static_index * per:(static_index + 1) * per]
                per = tf.shape(value)[0] // local
                return value[index * per:(index + 1) * per]

            return fn(*tf.nest.map_structure(cut, replica_args, split))

        return self.strategy.run(replica_fn, args=args)  # NATIVE

    def per_replica(self, fn: Callable[[], Any]) -> Any:
        devices = self.strategy.extended.worker_devices  # NATIVE

        made: List[Any] = []

        def value_fn(ctx):  # made on the replica's own device
            with tf.device(devices[ctx.replica_id_in_sync_group % self._local]):
                made.append(fn())
            return made[-1]

        values = self.strategy.experimental_distribute_values_from_function(value_fn)  # NATIVE
        return None if all(m is None for m in made) else values

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
        if op not in _REDUCE_OPS:
            raise ValueError(f"allreduce op {op!r} is not one of {list(_REDUCE_OPS)}")
        if self._in_replica_context():  # over all replicas
            ctx = tf.distribute.get_replica_context()  # NATIVE
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
    def gradient_tape(self, tape, sparse_as_dense: bool, compression: str):
        return _AveragingTape(tape, self, sparse_as_dense, compression)

    def average_gradients(self, grads, sparse_as_dense: bool, compression: str):
        if compression not in ("none", "fp16"):
            raise ValueError(f"compression {compression!r} is not one of ['fp16', 'none']")
        grads = list(grads)
        todo, casts = [], []
        for g in grads:
            if g is None:
                continue
            if isinstance(g, tf.IndexedSlices) and sparse_as_dense:
                g = tf.convert_to_tensor(g)
            cast_back = None
            if compression == "fp16" and not isinstance(g, tf.IndexedSlices) and g.dtype.is_floating \
                    and g.dtype != tf.float16:
                cast_back, g = g.dtype, tf.cast(g, tf.float16)  # fp16 on the wire, as with Horovod
            todo.append(g)
            casts.append(cast_back)
        if self._in_replica_context():
            # One batched call; IndexedSlices are all-gathered (rows of every replica, values / n).
            reduced = tf.distribute.get_replica_context().all_reduce(  # NATIVE
                tf.distribute.ReduceOp.MEAN, todo) if todo else []
        else:
            reduced = [self.allreduce(tf.convert_to_tensor(g), "average", None) for g in todo]
        reduced = [r if c is None else tf.cast(r, c) for r, c in zip(reduced, casts)]
        it = iter(reduced)
        return [None if g is None else next(it) for g in grads]


def _tf_config_cluster() -> Optional[Tuple[int, int]]:
    """(rank, size) of this worker from ``TF_CONFIG``; None without a multi-worker cluster.

    Raises:
      DistributedError: ``TF_CONFIG`` is not JSON or names another task type.
    """
    raw = os.environ.get("TF_CONFIG", "").strip()
    if not raw:
        return None
    try:
        cfg = json.loads(raw)
        cluster = cfg.get("cluster", {})
        chiefs = len(cluster.get("chief", []))
        size = chiefs + len(cluster.get("worker", []))
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


def _make_native(num_gpus: int, intra_op: Optional[int],
                 inter_op: Optional[int]) -> Tuple[_NativeBackend, ThreadSettings]:
    """Configures the devices, then builds the strategy (which starts TensorFlow's runtime)."""
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 0:
        raise ValueError(f"num_gpus = {num_gpus!r} must be an integer >= 0 "
                         "(0 = every GPU of the host, or one CPU replica)")
    cluster = _tf_config_cluster()
    if cluster is None and launched_by_mpi_or_horovodrun():
        raise DistributedError(
            "use_horovod=False (the native backend) was started by mpirun/horovodrun, which would "
            "run independent copies; start it with `python` on one host or with "
            "`python -m lmkit.launch` on several, or set use_horovod=True")
    local_rank = int(os.environ.get("LMKIT_LOCAL_RANK", "0") or 0)
    local_size = int(os.environ.get("LMKIT_LOCAL_SIZE", "1") or 1)
    threads = thread_settings(local_size, intra_op, inter_op, min_inter_op=2)
    gpus = tf.config.list_physical_devices("GPU")
    if cluster is not None and not gpus and num_gpus > 1:
        raise ValueError(f"num_gpus = {num_gpus}, but on a host without GPUs each worker of a "
                         "multi-worker job is one replica; start more workers instead "
                         "(python -m lmkit.launch --num_workers N)")
    try:
        if gpus:
            # Workers that share a host share out its GPUs by local rank.
            per = num_gpus or max(1, len(gpus) // local_size)
            mine = gpus[local_rank * per:(local_rank + 1) * per]
            if len(mine) < per:
                raise ValueError(f"num_gpus = {num_gpus} with {local_size} worker(s) on this host needs "
                                 f"{per * local_size} GPUs, but it has {len(gpus)}; lower num_gpus")
            for gpu in gpus:
                tf.config.experimental.set_memory_growth(gpu, True)
            tf.config.set_visible_devices(mine, "GPU")  # NATIVE
        elif cluster is None and num_gpus > 1:
            # A CPU-only host runs the replicas on logical CPU devices (tests, laptops).
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(  # NATIVE
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(num_gpus)])
        tf.config.threading.set_intra_op_parallelism_threads(threads.intra_op)
        tf.config.threading.set_inter_op_parallelism_threads(threads.inter_op)
    except RuntimeError:
        pass  # the runtime already started; checked below
    if cluster is None:
        if gpus:
            devices = [d.name for d in tf.config.list_logical_devices("GPU")]
        else:
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
            want = max(1, num_gpus)
            if len(devices) < want:
                raise DistributedError(
                    f"num_gpus = {num_gpus} replicas need {want} logical CPU devices, but TensorFlow "
                    f"already started with {len(devices)}; call dist.init() before any TensorFlow op")
            devices = devices[:want]
        strategy = tf.distribute.MirroredStrategy(devices=devices)  # NATIVE
        rank, size = 0, 1
    else:
        rank, size = cluster
        strategy = tf.distribute.MultiWorkerMirroredStrategy()  # NATIVE: reads TF_CONFIG
    return _NativeBackend(strategy, rank, size, local_rank, local_size), threads


_BACKEND: Optional[_Backend] = None
_THREADS: Optional[ThreadSettings] = None


def launched_by_mpi_or_horovodrun() -> bool:
    """True when a launcher (mpirun, horovodrun, srun) started this process."""
    return any(k in os.environ for k in _LAUNCHER_ENV)


def _import_horovod():
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


# Read by Open MPI when Horovod initialises it (MPI_Init inside hvd.init()).
MPI_YIELD_ENV = "OMPI_MCA_mpi_yield_when_idle"


def _quiet_mpi_polling() -> None:
    """Makes Open MPI yield the core while it waits, unless the user chose otherwise.

    Open MPI busy-polls inside a collective (and Horovod's background thread
    negotiates every cycle through MPI), yielding only when it sees a host
    oversubscribed. With one rank per core, as on a CPU host, the polling
    then takes the core from that rank's own compute threads: measured on 2
    cores with ``config_small``, the 2-rank step took 122-153 ms with the
    polling and 97-117 ms with yielding (``docs/performance.md``). GPU hosts lose
    nothing measurable (the wait is for NCCL or the network either way).
    Set ``OMPI_MCA_mpi_yield_when_idle=0`` to keep Open MPI's own choice.
    """
    os.environ.setdefault(MPI_YIELD_ENV, "1")


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def thread_settings(local_size: int, intra_op: Optional[int] = None,
                    inter_op: Optional[int] = None, min_inter_op: int = 1) -> ThreadSettings:
    """Threads for one rank when ``local_size`` ranks share this host.

    Each rank gets about ``cores / local_size`` intra-op threads so that the
    ranks of one host do not oversubscribe its cores, and ``min(intra, 4)``
    inter-op threads, at least ``min_inter_op`` (the native backend's
    in-process replicas need 2). A rank with one core gets one inter-op
    thread: a second one, idle most of the time, still took turns on that
    core, and a bound ``config_small`` rank was 8-20% slower with it
    (``docs/performance.md``). Overrides come from the arguments, then from
    ``LMKIT_INTRA_OP_THREADS`` / ``LMKIT_INTER_OP_THREADS``.
    """
    total = os.cpu_count() or 1
    bound = _cpu_count()  # mpirun may bind each rank to fewer cores
    default_intra = max(1, min(bound, total // max(1, local_size)))
    intra = intra_op or int(os.environ.get("LMKIT_INTRA_OP_THREADS", "0") or 0) or default_intra
    inter = inter_op or int(os.environ.get("LMKIT_INTER_OP_THREADS", "0") or 0) or max(min_inter_op, min(intra, 4))
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
         inter_op_threads: Optional[int] = None, num_gpus: int = 0) -> str:
    """Initialise the distributed runtime once; later calls return at once.

    Args:
      backend: ``"horovod"``, ``"native"``, ``"local"`` or ``None`` (the
        default: Horovod when it is importable or a launcher started us, else
        a single local process).  The environment variable ``LMKIT_BACKEND``
        overrides the default (``lmkit.launch`` sets it to ``native``).
      intra_op_threads: CPU threads per op; default cores / processes on this host.
      inter_op_threads: ops run in parallel; default min(intra, 4) (at least 2 for
        the native backend).
      num_gpus: native backend only: replicas in this process (0 = every GPU
        of the host, or one replica on the CPU).  On a host without GPUs,
        ``num_gpus > 1`` runs that many replicas on logical CPU devices.

    Returns:
      The name of the backend in use.

    Raises:
      DistributedError: Horovod was asked for (or a launcher started us) but
        cannot be imported; or the native backend cannot be set up as asked.
      ValueError: an unknown backend or a bad ``num_gpus``.
    """
    global _BACKEND, _THREADS
    if _BACKEND is not None:
        return _BACKEND.name
    backend = backend or os.environ.get("LMKIT_BACKEND") or None
    if backend not in (None, "horovod", "native", "local"):
        raise ValueError(f"backend {backend!r} is not one of 'horovod', 'native', 'local'")
    if backend == "native":
        _BACKEND, _THREADS = _make_native(num_gpus, intra_op_threads, inter_op_threads)
        return _BACKEND.name
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
        _quiet_mpi_polling()
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


def initialized() -> bool:
    """True once :func:`init` has run (and :func:`shutdown` has not)."""
    return _BACKEND is not None


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


def num_replicas() -> int:
    """Data-parallel replicas over the whole job (the global batch is split over them).

    Horovod: one per process (``size()``); native: processes x replicas per process.
    """
    return _backend().num_replicas()


def local_replicas() -> int:
    """Replicas that this process runs (1 with Horovod)."""
    return _backend().local_replicas()


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


def is_peer_failure(exc: BaseException) -> bool:
    """True when ``exc`` is a collective operation cancelled because another rank failed.

    The rank that sees it is a bystander: the rank that failed (or the
    launcher, for a killed one) reports the cause.
    """
    return "Horovod has been shut down" in str(exc)  # HVD: a peer raised, exited or stalled


def shutdown() -> None:
    """Shut the backend down (tests use this between backends)."""
    global _BACKEND, _THREADS
    if _BACKEND is not None and _BACKEND.name == "horovod":
        _BACKEND.hvd.shutdown()  # HVD
    _BACKEND = None
    _THREADS = None
