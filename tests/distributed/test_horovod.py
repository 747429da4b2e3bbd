"""The Horovod backend (lmkit.distributed.horovod): the TensorFlow it supports, NCCL on GPUs, a plain process of
size one, and jobs started by mpirun and horovodrun --gloo."""
import os
import sys

import pytest

from lmkit import distributed as dist
from lmkit.distributed import horovod as hvd_backend
from tests.helpers import mpirun_cmd, run, subprocess_env


# ------------------------------------------------------------------- errors
def test_horovod_backend_names_the_supported_tensorflow(monkeypatch):
    monkeypatch.setattr(hvd_backend.tf, "__version__", "2.21.0")
    with pytest.raises(dist.DistributedError, match=r"TensorFlow 2\.18\.x \(found TensorFlow 2\.21\.0\)"
                                                    r".*use_horovod=False"):
        hvd_backend.import_horovod()


class _FakeHorovod:
    def __init__(self, size: int, nccl: bool) -> None:
        self._size, self._nccl = size, nccl

    def size(self) -> int:
        return self._size

    def nccl_built(self) -> bool:
        return self._nccl


@pytest.mark.parametrize("device, size, nccl, warns", [
    ("GPU", 2, False, True),
    ("GPU", 2, True, False),
    ("CPU", 2, False, False),  # CPU jobs average on the host anyway
    ("GPU", 1, False, False),  # nothing to average
])
def test_horovod_without_nccl_on_gpus_warns(device, size, nccl, warns):
    from lmkit.distributed.horovod import nccl_warning

    message = nccl_warning(_FakeHorovod(size, nccl), device)
    assert (message is not None) is warns
    if warns:
        assert "without NCCL" in message and "HOROVOD_GPU_OPERATIONS=NCCL" in message


_FIELDS = ("(b, dist.rank(), dist.size(), dist.local_size(), dist.threads().intra_op, "
           "tf.config.threading.get_intra_op_parallelism_threads(), dist.threads().inter_op, "
           "tf.config.threading.get_inter_op_parallelism_threads())")


PROBE = f"from lmkit import distributed as dist; b = dist.init(); import tensorflow as tf; print(*{_FIELDS})"


# The same, into $PROBE_DIR/rank<r>.txt: mpirun's forwarding of two ranks' stdout may split
# and interleave their lines under load (seen once in CI).
PROBE_TO_FILE = ("import os; from lmkit import distributed as dist; b = dist.init(); import tensorflow as tf; "
                 f"open(os.path.join(os.environ['PROBE_DIR'], 'rank%d.txt' % dist.rank()), 'w')"
                 f".write(' '.join(map(str, {_FIELDS})))")


@pytest.mark.horovod
def test_plain_python_process_runs_horovod_at_size_one():
    env = subprocess_env({"LMKIT_INTRA_OP_THREADS": "", "LMKIT_INTER_OP_THREADS": ""})
    res = run([sys.executable, "-c", PROBE], timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    backend, rank, size, local_size, intra, tf_intra, inter, tf_inter = res.stdout.split()
    assert (backend, rank, size, local_size) == ("horovod", "0", "1", "1")
    assert int(intra) == int(tf_intra) >= 1
    assert int(inter) == int(tf_inter) == min(int(intra), 4)


@pytest.mark.horovod
@pytest.mark.mpi
def test_mpirun_two_ranks_split_threads(tmp_path):
    env = subprocess_env({"LMKIT_INTRA_OP_THREADS": "", "LMKIT_INTER_OP_THREADS": "",
                          "PROBE_DIR": str(tmp_path)})
    res = run(mpirun_cmd(2, ["-c", PROBE_TO_FILE], env_keys=["PROBE_DIR"]), timeout=180, env=env)
    assert res.returncode == 0, res.stderr
    lines = [(tmp_path / f"rank{r}.txt").read_text().strip() for r in range(2)]
    for rank, line in enumerate(lines):
        backend, r, size, local_size, intra, tf_intra, inter, tf_inter = line.split()
        assert (backend, r, size, local_size) == ("horovod", str(rank), "2", "2")
        assert int(intra) == max(1, (os.cpu_count() or 1) // 2) == int(tf_intra)
        assert int(inter) == min(int(intra), 4) == int(tf_inter)


@pytest.mark.horovod
@pytest.mark.mpi
def test_horovodrun_gloo_runs_the_collectives_suite():
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    res = run([horovodrun, "--gloo", "-np", "2", "-H", "localhost:2", sys.executable, "-m", "pytest",
               "-q", "-p", "no:cacheprovider", "--timeout", "60", "-x",
               "tests/distributed/mpi/test_collectives.py"], timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.count("passed") >= 2, res.stdout[-2000:]
