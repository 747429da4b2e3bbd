"""Collectives of lmkit.distributed, run at size 1 by pytest and at size 2 by mpirun.

Every assertion is written in terms of ``dist.size()``, so the same test
checks the single-process path and the distributed one
(``mpirun -np 2 python -m pytest tests/distributed/mpi``).
"""
import numpy as np
import pytest
import tensorflow as tf

from lmkit import distributed as dist

pytestmark = pytest.mark.horovod


@pytest.fixture(scope="module", autouse=True)
def _init():
    dist.init(backend="horovod")


def test_rank_and_size_are_consistent():
    assert 0 <= dist.rank() < dist.size()
    assert 0 <= dist.local_rank() < dist.local_size() <= dist.size()
    assert dist.is_chief() == (dist.rank() == 0)
    assert dist.backend_name() == "horovod"


def test_allreduce_of_rank():
    n = dist.size()
    r = tf.constant(float(dist.rank()))
    assert float(dist.allreduce(r, op="sum")) == n * (n - 1) / 2
    assert float(dist.allreduce(r, op="average")) == pytest.approx((n - 1) / 2)
    assert float(dist.allreduce(r, op="max")) == n - 1
    assert float(dist.allreduce(r, op="min")) == 0
    assert dist.allreduce_scalar(dist.rank() + 1, op="sum") == n * (n + 1) / 2


def test_allreduce_inside_tf_function():
    @tf.function
    def reduce(x):
        return dist.allreduce(x, op="sum", name="test.fn_sum")

    out = reduce(tf.fill([3], float(dist.rank() + 1)))
    np.testing.assert_allclose(out.numpy(), [dist.size() * (dist.size() + 1) / 2] * 3)


def test_broadcast_variables_from_rank_zero():
    a = tf.Variable(tf.fill([2, 3], float(dist.rank() + 10)))
    b = tf.Variable(dist.rank() * 7, dtype=tf.int64)
    dist.broadcast_variables([a, b], root=0)
    np.testing.assert_array_equal(a.numpy(), np.full([2, 3], 10.0))
    assert int(b.numpy()) == 0
    assert dist.broadcast_scalar(dist.rank() + 0.5) == 0.5


def test_objects():
    assert dist.allgather_object({"rank": dist.rank()}) == [{"rank": r} for r in range(dist.size())]
    assert dist.broadcast_object(("from", dist.rank())) == ("from", 0)
    gathered = dist.allgather(tf.constant([dist.rank()], tf.int32)).numpy()
    np.testing.assert_array_equal(gathered, np.arange(dist.size()))
    dist.barrier()


def test_run_on_chief_returns_chief_value_everywhere():
    assert dist.run_on_chief(lambda: ("chief says", dist.rank())) == ("chief says", 0)


def test_run_on_chief_raises_on_every_rank():
    def fail():
        raise ValueError("download failed at http://127.0.0.1:9/x")

    with pytest.raises(ValueError, match="download failed"):
        dist.run_on_chief(fail)


def _dense_and_sparse_grads(sparse_as_dense: bool):
    """Gradients whose per-rank value is known, so the average can be checked."""
    r = dist.rank()
    w = tf.Variable([1.0, 2.0, 3.0])
    emb = tf.Variable(tf.ones([4, 2]))
    ids = tf.constant([r % 4, 3])  # every rank touches row 3, rank r also row r
    with tf.GradientTape() as tape:
        loss = (r + 1.0) * tf.reduce_sum(w * w) + tf.reduce_sum(tf.gather(emb, ids)) * (r + 1.0)
    tape = dist.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
    gw, gemb = tape.gradient(loss, [w, emb])
    return gw, gemb


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_distributed_gradient_tape_averages_dense_and_sparse(sparse_as_dense):
    n = dist.size()
    gw, gemb = _dense_and_sparse_grads(sparse_as_dense)
    mean_scale = np.mean([r + 1.0 for r in range(n)])
    np.testing.assert_allclose(gw.numpy(), 2 * np.array([1.0, 2.0, 3.0]) * mean_scale, rtol=1e-6)
    if not sparse_as_dense:
        assert isinstance(gemb, tf.IndexedSlices)
    expected = np.zeros([4, 2])
    for r in range(n):
        expected[r % 4] += (r + 1.0) / n
        expected[3] += (r + 1.0) / n
    np.testing.assert_allclose(tf.convert_to_tensor(gemb).numpy(), expected, rtol=1e-6)


def test_average_gradients_matches_tape():
    n = dist.size()
    g = tf.constant([float(dist.rank())] * 2)
    (avg,) = dist.average_gradients([g])
    np.testing.assert_allclose(avg.numpy(), [(n - 1) / 2] * 2)


@pytest.mark.parametrize("compiled", [False, True])
def test_fp16_compression_averages_values_whose_sum_overflows_float16(compiled):
    # Rank r holds 30000 * (r + 1): the mean fits float16 (max 65504), the sum over
    # 2 ranks (90000) does not. fp16 compression divides by the rank count before the
    # cast, as a loss-scaled gradient (scale 2^15) needs on many ranks.
    n = dist.size()

    def average():
        g = tf.constant([30000.0 * (dist.rank() + 1), 1.5, -2.0])
        sparse = tf.IndexedSlices(tf.constant([[2.0, 4.0]]), tf.constant([dist.rank() % 4]), [4, 2])
        avg, avg_sparse, none = dist.average_gradients([g, sparse, None], compression="fp16")
        return avg, tf.convert_to_tensor(avg_sparse), none

    avg, avg_sparse, none = (tf.function(average) if compiled else average)()
    assert none is None and avg.dtype == tf.float32
    expected = np.float16([30000.0 * np.mean(np.arange(1, n + 1)), 1.5, -2.0])
    np.testing.assert_allclose(avg.numpy(), expected, rtol=2 ** -10)
    assert np.all(np.isfinite(avg.numpy()))
    dense = np.zeros([4, 2])
    for r in range(n):
        dense[r % 4] += np.array([2.0, 4.0]) / n
    np.testing.assert_allclose(tf.convert_to_tensor(avg_sparse).numpy(), dense, rtol=1e-6)


def test_distributed_gradient_tape_compresses_like_average_gradients():
    w = tf.Variable([1.0, 1.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * tf.constant([30000.0, 3.0]) * float(dist.rank() + 1))
    (gw,) = dist.DistributedGradientTape(tape, compression="fp16").gradient(loss, [w])
    mean = np.mean(np.arange(1, dist.size() + 1))
    np.testing.assert_allclose(gw.numpy(), [30000.0 * mean, 3.0 * mean], rtol=2 ** -10)


@pytest.mark.parametrize("case", ["shared", "own_cache", "no_files"])
def test_cached_text_reaches_every_rank_once_encoded(tmp_path_factory, case):
    """Rank 0 encodes into the cache; a rank without it encodes its own; one without the text receives it."""
    import os

    from lmkit.data.text import load_text_data
    from lmkit.data.tokenizers import ByteTokenizer
    from lmkit.train.run_data import cached_text_everywhere

    shared = dist.run_on_chief(lambda: str(tmp_path_factory.mktemp("shared")))  # one host: a shared folder
    text = os.path.join(shared, "train.txt")
    if dist.is_chief():
        with open(text, "w", encoding="utf-8") as f:
            f.write("".join(f"line {i} of the text\n" for i in range(200)))
    dist.barrier()
    root = os.path.join(shared, "cache")
    path = text
    if dist.rank() > 0 and case != "shared":
        root = os.path.join(shared, f"cache-rank{dist.rank()}")  # this "host" does not see rank 0's cache
        if case == "no_files":
            path = os.path.join(shared, "elsewhere", "train.txt")  # nor the text
    tokenizer = ByteTokenizer()
    lines = []
    streams = cached_text_everywhere(tokenizer, {"train": [path]}, root, lines.append)
    expected = load_text_data(tokenizer, text).train
    np.testing.assert_array_equal(streams["train"].ids, expected)
    assert all(dist.allgather_object(bool(np.array_equal(streams["train"].ids, expected))))
    own = os.path.isdir(root) and any(n.startswith("byte-") for n in os.listdir(root))
    assert own == (dist.rank() == 0 or case != "no_files")


@pytest.mark.parametrize("case", ["shared", "own_cache", "no_files"])
def test_cached_pairs_reach_every_rank_once_encoded(tmp_path_factory, case):
    """As the text above, for an encoder-decoder's pairs cached line by line: the pairs of an in-memory encoding."""
    import os

    from lmkit.data.paired import encode_pairs, read_pairs
    from lmkit.data.tokenizers import ByteTokenizer
    from lmkit.train.run_data import cached_pairs_everywhere

    shared = dist.run_on_chief(lambda: str(tmp_path_factory.mktemp("shared")))
    files = {side: os.path.join(shared, f"train.{side}") for side in ("src", "tgt")}
    if dist.is_chief():
        for side, path in files.items():
            with open(path, "w", encoding="utf-8") as f:
                f.write("".join(("" if i % 13 == 5 else f"{side} {i} " * (1 + i % 4)) + "\n" for i in range(120)))
    dist.barrier()
    root, splits = os.path.join(shared, "cache"), {"train": (files["src"], files["tgt"])}
    if dist.rank() > 0 and case != "shared":
        root = os.path.join(shared, f"cache-rank{dist.rank()}")
        if case == "no_files":
            splits = {"train": tuple(os.path.join(shared, "elsewhere", os.path.basename(p)) for p in splits["train"])}
    readable = all(os.path.isfile(p) for p in splits["train"])
    tokenizer = ByteTokenizer()
    limits = {"max_source_length": 30, "max_target_length": 30}
    pairs = cached_pairs_everywhere(splits, tokenizer, tokenizer, root, readable, limits, lambda line: None)["train"]
    want = encode_pairs(*read_pairs(files["src"], files["tgt"]), tokenizer.encode, tokenizer.encode, **limits)
    same = (pairs.report == want.report
            and [s.tolist() for s in pairs.source] == [s.tolist() for s in want.source]
            and [t.tolist() for t in pairs.target] == [t.tolist() for t in want.target])
    assert 0 < want.report.empty and 0 < want.report.too_long and same
    assert all(dist.allgather_object(bool(same)))
    own = os.path.isdir(root) and any(n.startswith("byte-") for n in os.listdir(root))
    assert own == (dist.rank() == 0 or case != "no_files")
