"""Exercises lmkit.distributed's replica seams with the native backend; prints JSON.

Run by tests/distributed/native/test_native_collectives.py as
``python replica_collectives.py N`` (N replicas on logical CPU devices).
Every value is computed through ``lmkit.distributed`` only, eagerly and inside
``tf.function``; the test compares them with NumPy.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main() -> None:
    replicas = int(sys.argv[1])
    from lmkit import distributed as dist
    dist.init(backend="native", num_gpus=replicas)
    import numpy as np
    import tensorflow as tf

    out = {"backend": dist.backend_name(), "size": dist.size(), "rank": dist.rank(),
           "num_replicas": dist.num_replicas(), "local_replicas": dist.local_replicas()}
    rows = 2 * replicas
    x = tf.reshape(tf.range(rows * 3, dtype=tf.float32), [rows, 3])  # this process's rows

    def collectives(x):
        # x: this replica's rows [2, 3]
        return {"gathered": dist.allgather(x),
                "sum": dist.allreduce(tf.reduce_sum(x), op="sum"),
                "average": dist.allreduce(tf.reduce_sum(x), op="average"),
                "min": dist.allreduce(x[0, 0], op="min"),
                "max": dist.allreduce(x[0, 0], op="max"),
                "from_root": dist.broadcast(x[0], root=0)}

    for mode, fn in (("eager", lambda x: dist.run(collectives, (x,))),
                     ("compiled", tf.function(lambda x: dist.run(collectives, (x,))))):
        res = dist.first(fn(x))
        out[mode] = {k: np.asarray(v).tolist() for k, v in res.items()}

    # A per-replica state carried from one run to the next stays with its replica.
    @tf.function
    def accumulate(x, state):
        return dist.run(lambda x, s: s + x, (x, state))

    state = dist.per_replica(lambda: tf.zeros([2, 3]))
    state = accumulate(x, state)
    state = accumulate(2.0 * x, state)
    out["carried_first"] = np.asarray(dist.first(state)).tolist()
    out["carried_traces"] = accumulate.experimental_get_tracing_count()  # the made and the returned state agree
    out["per_replica_none"] = dist.per_replica(lambda: None) is None

    # Averaged gradients: replica r has weight r + 1 on its loss; ids differ per replica.
    with dist.scope():
        w = tf.Variable([1.0, 2.0, 3.0])
        emb = tf.Variable(tf.ones([4, 2]))
    ids = tf.reshape(tf.range(rows) % 4, [rows, 1])  # [rows, 1]

    def grads(ids, sparse_as_dense):
        scale = tf.cast(ids[0, 0] // 2 + 1, tf.float32)  # replica r holds ids 2r, 2r+1 -> r + 1
        with tf.GradientTape() as tape:
            loss = scale * (tf.reduce_sum(w * w) + tf.reduce_sum(tf.gather(emb, ids[:, 0])))
        tape = dist.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
        gw, gemb = tape.gradient(loss, [w, emb])
        return gw, tf.convert_to_tensor(gemb), isinstance(gemb, tf.IndexedSlices)

    for sparse_as_dense in (False, True):
        step = tf.function(lambda ids: dist.run(grads, (ids, sparse_as_dense)))
        gw, gemb, sparse = dist.first(step(ids))
        out[f"grads_dense={sparse_as_dense}"] = {"w": gw.numpy().tolist(), "emb": gemb.numpy().tolist(),
                                                 "sparse": bool(sparse)}

    # fp16 compression: replica r holds 30000 * (r + 1); the sum over replicas
    # overflows float16, the mean does not.
    def compressed(ids):
        r = tf.cast(ids[0, 0] // 2, tf.float32)
        dense = tf.stack([30000.0 * (r + 1.0), 1.5])
        rows = tf.IndexedSlices(tf.ones([1, 2]) * (r + 1.0), ids[0], [4, 2])
        avg, avg_rows = dist.average_gradients([dense, rows], compression="fp16")
        return avg, tf.convert_to_tensor(avg_rows)

    avg, avg_rows = dist.first(tf.function(lambda ids: dist.run(compressed, (ids,)))(ids))
    out["fp16_average"] = {"dense": avg.numpy().tolist(), "rows": avg_rows.numpy().tolist(),
                           "dtype": avg.dtype.name}

    # Process-level collectives (one process here) and the start-up broadcast.
    out["objects"] = [dist.allgather_object({"r": dist.rank()}), dist.broadcast_object("hi"),
                      dist.run_on_chief(lambda: 41 + 1)]
    dist.barrier()
    with dist.scope():
        v = tf.Variable([5.0, 6.0])
    dist.broadcast_variables([v, w, emb])
    out["after_broadcast"] = v.numpy().tolist()
    try:
        dist.broadcast_variables([tf.Variable(1.0, name="outside")])
        out["outside_scope_error"] = None
    except dist.DistributedError as exc:
        out["outside_scope_error"] = str(exc)
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
