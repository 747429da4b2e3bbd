"""lmkit.distributed without a launcher, and launchers started from the test."""
import os
import sys

import pytest

from lmkit import distributed as dist
from lmkit.distributed import env as dist_env
from lmkit.distributed.local import LocalBackend
from tests.helpers import mpirun_cmd, run, subprocess_env

_FIELDS = ("(b, dist.rank(), dist.size(), dist.local_size(), dist.threads().intra_op, "
           "tf.config.threading.get_intra_op_parallelism_threads(), dist.threads().inter_op, "
           "tf.config.threading.get_inter_op_parallelism_threads())")
PROBE = f"from lmkit import distributed as dist; b = dist.init(); import tensorflow as tf; print(*{_FIELDS})"
# The same, into $PROBE_DIR/rank<r>.txt: mpirun's forwarding of two ranks' stdout may split
# and interleave their lines under load (seen once in CI).
PROBE_TO_FILE = ("import os; from lmkit import distributed as dist; b = dist.init(); import tensorflow as tf; "
                 f"open(os.path.join(os.environ['PROBE_DIR'], 'rank%d.txt' % dist.rank()), 'w')"
                 f".write(' '.join(map(str, {_FIELDS})))")


@pytest.fixture
def sixteen_cores(monkeypatch):
    """A host of 16 cores, this process bound to all of them, no thread overrides."""
    monkeypatch.delenv("LMKIT_INTRA_OP_THREADS", raising=False)
    monkeypatch.delenv("LMKIT_INTER_OP_THREADS", raising=False)
    monkeypatch.setattr(dist_env.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(dist_env, "cpu_count", lambda: 16)
    return monkeypatch


def test_thread_settings_split_cores_between_local_ranks(sixteen_cores):
    monkeypatch = sixteen_cores
    assert dist.thread_settings(1).intra_op == 16
    assert dist.thread_settings(4).intra_op == 4
    assert dist.thread_settings(32).intra_op == 1
    assert dist.thread_settings(4, intra_op=3).intra_op == 3
    monkeypatch.setenv("LMKIT_INTRA_OP_THREADS", "5")
    assert dist.thread_settings(4).intra_op == 5
    # A rank bound to 2 cores never gets more than 2 threads.
    monkeypatch.delenv("LMKIT_INTRA_OP_THREADS")
    monkeypatch.setattr(dist_env, "cpu_count", lambda: 2)
    assert dist.thread_settings(1).intra_op == 2


def test_inter_op_threads_follow_intra_op_threads(sixteen_cores):
    monkeypatch = sixteen_cores
    # A rank with one core runs one op at a time (a second inter-op thread cost 8-20%).
    assert dist.thread_settings(16).inter_op == 1
    assert dist.thread_settings(8).inter_op == 2
    assert dist.thread_settings(1).inter_op == 4
    # The native backend's in-process replicas need two.
    assert dist.thread_settings(16, min_inter_op=2).inter_op == 2
    assert dist.thread_settings(16, inter_op=3).inter_op == 3
    monkeypatch.setenv("LMKIT_INTER_OP_THREADS", "5")
    assert dist.thread_settings(16).inter_op == 5
    monkeypatch.setenv("LMKIT_INTER_OP_THREADS", "-1")
    with pytest.raises(ValueError, match="inter_op=-1"):
        dist.thread_settings(16)


def test_open_mpi_yields_while_waiting_unless_the_user_chose(monkeypatch):
    # Open MPI's busy polling took the core from a rank's own compute (docs/performance.md).
    monkeypatch.delenv(dist_env.MPI_YIELD_ENV, raising=False)
    dist_env.quiet_mpi_polling()
    assert os.environ[dist_env.MPI_YIELD_ENV] == "1"
    monkeypatch.setenv(dist_env.MPI_YIELD_ENV, "0")
    dist_env.quiet_mpi_polling()
    assert os.environ[dist_env.MPI_YIELD_ENV] == "0"


def test_local_backend_is_size_one():
    b = LocalBackend()
    assert (b.rank(), b.size(), b.local_rank(), b.local_size()) == (0, 1, 0, 1)
    assert b.allgather_object("x") == ["x"]
    assert b.is_peer_failure(RuntimeError("Horovod has been shut down")) is False


def test_launcher_rank_reads_each_launchers_variable(monkeypatch):
    for key in dist_env.LAUNCHER_RANK_ENV + dist_env.LAUNCHER_SIZE_ENV:
        monkeypatch.delenv(key, raising=False)
    assert dist_env.launcher_rank() == 0 and not dist_env.launched_by_mpi_or_horovodrun()
    monkeypatch.setenv("HOROVOD_RANK", "3")
    assert dist_env.launcher_rank() == 3 and dist_env.launched_by_mpi_or_horovodrun()
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")  # Open MPI's variable is read first
    assert dist_env.launcher_rank() == 1


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

