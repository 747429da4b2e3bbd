"""The native backend's pieces on one process (lmkit.distributed.native): errors, gradient averaging, replicas.

Nothing here starts a job; the backend object is built directly on one CPU
device, so the process-wide ``lmkit.distributed`` state of other tests is untouched.
The multi-process suites are in tests/distributed/native/.
"""
import numpy as np
import pytest
import tensorflow as tf

from lmkit import distributed as dist
from lmkit.distributed import native as native_backend


def test_native_refuses_mpirun_and_bad_num_gpus(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="num_gpus = -1 must be an integer >= 0"):
        native_backend.NativeBackend.create(num_gpus=-1)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    with pytest.raises(dist.DistributedError, match="started by mpirun"):
        native_backend.NativeBackend.create(num_gpus=0)


# ---------------------------------------------------- backend on one device
@pytest.fixture(scope="module")
def native():
    """A native backend object on one CPU replica (not installed as lmkit.distributed's backend)."""
    return native_backend.NativeBackend(tf.distribute.MirroredStrategy(["/cpu:0"]), rank=0, size=1,
                               local_rank=0, local_size=1)


def test_variables_made_outside_scope_are_refused(native):
    with native.scope():
        inside = tf.Variable(1.0)
    outside = tf.Variable(2.0, name="stray")
    native.broadcast_variables([inside], 0)
    with pytest.raises(dist.DistributedError, match=r"'stray:0'.*dist.scope\(\)"):
        native.broadcast_variables([inside, outside], 0)


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_replica_step_with_averaging_tape_updates_like_plain_sgd(native, sparse_as_dense):
    """One replica: the averaged gradient is the plain gradient, eagerly and compiled."""
    with native.scope():
        w = tf.Variable([1.0, 2.0, 3.0])
        emb = tf.Variable(tf.ones([4, 2]))
    ids = tf.constant([[1, 3], [3, 0]])

    def replica_step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * w) + tf.reduce_sum(tf.gather(emb, ids))
        gw, gemb = native.gradient_tape(tape, sparse_as_dense, "none").gradient(loss, [w, emb])
        w.assign_sub(0.5 * gw)
        emb.assign_sub(0.5 * tf.convert_to_tensor(gemb))
        return native.allreduce(loss, "sum", None), isinstance(gemb, tf.IndexedSlices)

    loss, was_sparse = native.first(native.run(replica_step, (ids,)))
    assert was_sparse is not sparse_as_dense
    assert float(loss) == pytest.approx(14.0 + 8.0)
    np.testing.assert_allclose(w.numpy(), [0.0, 0.0, 0.0])
    counts = np.bincount(ids.numpy().ravel(), minlength=4)[:, None]  # rows picked per id
    np.testing.assert_allclose(emb.numpy(), 1.0 - 0.5 * np.repeat(counts, 2, axis=1))
    # Compiled, as the trainer runs it: the next step starts from the updated variables.
    compiled = tf.function(lambda ids: native.first(native.run(replica_step, (ids,)))[0])
    emb_before = emb.numpy().copy()
    assert float(compiled(ids)) == pytest.approx(float(np.sum(emb_before[ids.numpy()])))
    np.testing.assert_allclose(emb.numpy(), emb_before - 0.5 * np.repeat(counts, 2, axis=1))


def test_fp16_compression_rounds_like_float16(native):
    grads = [tf.constant([1.0 + 2 ** -12, 3.0]), None]
    out = native.average_gradients(grads, False, "fp16")
    assert out[1] is None and out[0].dtype == tf.float32
    np.testing.assert_array_equal(out[0].numpy(), np.float16([1.0 + 2 ** -12, 3.0]).astype(np.float32))
    with pytest.raises(ValueError, match="compression 'zip'"):
        native.average_gradients(grads, False, "zip")


def test_a_state_made_per_replica_and_a_steps_state_are_traced_as_one(native):
    # One replica: per_replica's state and the state a compiled step returns must be of one
    # kind, or the trainer's step is traced again at step 2 (seconds of a loaded machine's CPU).
    step = tf.function(lambda x, s: native.run(lambda x, s: s + x, (x, s)), reduce_retracing=True)
    state = native.per_replica(lambda: tf.zeros([2, 3]))
    for _ in range(3):
        state = step(tf.ones([2, 3]), state)
    assert step.experimental_get_tracing_count() == 1
    np.testing.assert_array_equal(native.first(state), np.full([2, 3], 3.0))
    assert native.per_replica(lambda: None) is None


def test_a_collective_aborted_because_a_peer_left_is_a_bystanders_error(native):
    # What rank 0 got when worker 1 failed: it says so in one line instead of a traceback.
    aborted = tf.errors.UnavailableError(
        None, None, "Collective ops is aborted by: Socket closed\nAdditional GRPC error information from "
                    "remote target /job:worker/replica:0/task:1 while calling /tensorflow.WorkerService/RecvBuf")
    assert native.is_peer_failure(aborted)
    assert not native.is_peer_failure(tf.errors.ResourceExhaustedError(None, None, "OOM when allocating"))
    assert not native.is_peer_failure(RuntimeError("Collective ops is aborted by: not TensorFlow's error"))


@pytest.mark.parametrize("dtype, values", [
    (tf.int64, [0, 1, 9999, 2 ** 40 + 3, -5]),
    (tf.int32, [0, 7, 2 ** 31 - 1, -1]),
])
def test_sparse_indices_ride_with_the_values_exactly(dtype, values):
    # The native backend gathers an embedding gradient's indices bitcast next to its values.
    indices = tf.constant(values, dtype)
    words = native_backend._indices_as(indices, tf.float32)
    assert words.shape == (len(values), 2 if dtype == tf.int64 else 1)
    rows = tf.concat([tf.ones([len(values), 3]), words], axis=1)
    back = native_backend._indices_from(rows[:, 3:], dtype)
    assert back.dtype == dtype and back.numpy().tolist() == values


def test_only_static_float32_slices_take_the_one_gather_path():
    s = tf.IndexedSlices(tf.ones([4, 3]), tf.constant([0, 1, 2, 3]), tf.constant([10, 3]))
    assert native_backend._packable_slices(s)
    assert not native_backend._packable_slices(tf.ones([4, 3]))
    assert not native_backend._packable_slices(
        tf.IndexedSlices(tf.ones([4, 3], tf.float16), s.indices, s.dense_shape))
    spec = tf.TensorSpec([None, 3], tf.float32)

    @tf.function(input_signature=[spec])
    def unknown_rows(v):
        return tf.constant(native_backend._packable_slices(
            tf.IndexedSlices(v, tf.range(tf.shape(v)[0]), tf.constant([10, 3]))))

    assert not unknown_rows(tf.ones([4, 3])).numpy()


def test_a_bad_pack_size_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("LMKIT_PACK_BYTES", "4MB")
    with pytest.raises(Exception, match="LMKIT_PACK_BYTES='4MB' must be a number of bytes"):
        native_backend.NativeBackend.create()
