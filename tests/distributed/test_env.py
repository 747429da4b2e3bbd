"""What the environment says (lmkit.distributed.env): threads per rank, the launchers' variables, and which
GPUs each process takes, driven with fake device lists (CI has no GPU).

``choose_gpus`` decides, ``pin_gpus`` applies it through ``tf.config`` and
checks what TensorFlow then sees; both backends use them.
"""
import os

import pytest

from lmkit import distributed as dist
from lmkit.core.errors import UsageError
from lmkit.distributed import env as dist_env
from lmkit.distributed.base import DistributedError
from lmkit.distributed.env import choose_gpus, gpus_pinned, pin_gpus


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


def test_launcher_rank_reads_each_launchers_variable(monkeypatch):
    for key in dist_env.LAUNCHER_RANK_ENV + dist_env.LAUNCHER_SIZE_ENV:
        monkeypatch.delenv(key, raising=False)
    assert dist_env.launcher_rank() == 0 and not dist_env.launched_by_mpi_or_horovodrun()
    monkeypatch.setenv("HOROVOD_RANK", "3")
    assert dist_env.launcher_rank() == 3 and dist_env.launched_by_mpi_or_horovodrun()
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")  # Open MPI's variable is read first
    assert dist_env.launcher_rank() == 1


class _Device:
    def __init__(self, index):
        self.name = f"/physical_device:GPU:{index}"
        self.device_type = "GPU"


class FakeConfig:
    """The parts of ``tf.config`` that pin_gpus uses, over ``n`` fake GPUs."""

    def __init__(self, n, started_with=None):
        self.gpus = [_Device(i) for i in range(n)]
        self.visible = list(self.gpus) if started_with is None else [self.gpus[i] for i in started_with]
        self.started = started_with is not None  # the runtime is up: settings cannot change
        self.growth = []
        config = self

        class Experimental:
            @staticmethod
            def set_memory_growth(device, value):
                if config.started:
                    raise RuntimeError("Physical devices cannot be modified after being initialized")
                config.growth.append((device.name, value))

        self.experimental = Experimental()

    def list_physical_devices(self, kind):
        return list(self.gpus) if kind == "GPU" else []

    def set_visible_devices(self, devices, kind):
        assert kind == "GPU"
        if self.started:
            raise RuntimeError("Visible devices cannot be modified after being initialized")
        self.visible = list(devices)

    def get_visible_devices(self, kind):
        return list(self.visible)


@pytest.mark.parametrize("local_rank, local_size, visible, per, pinned, want", [
    (0, 1, 0, 1, False, []),  # a CPU host
    (3, 8, 8, 1, False, [3]),  # mpirun -np 8 on an 8-GPU host: every rank sees all 8
    (1, 2, 8, 4, False, [4, 5, 6, 7]),  # 2 native workers with 4 GPUs each
    (0, 1, 8, 8, False, list(range(8))),  # one native process, every GPU
    (5, 8, 1, 1, True, [0]),  # Slurm --gpus-per-task=1: each rank sees its own one
    (1, 2, 4, 4, True, [0, 1, 2, 3]),  # 4 GPUs per task under Slurm
])
def test_choose_gpus(local_rank, local_size, visible, per, pinned, want):
    assert choose_gpus(local_rank, local_size, visible, per, pinned) == want


@pytest.mark.parametrize("local_size, visible, per, pinned, match", [
    (8, 4, 1, False, "8 process.* need 8 GPUs, but this process sees 4; start at most 4"),
    (8, 4, 1, True, "need 8 GPUs, but this process sees 4"),
    (2, 1, 1, False, "all of them see the same ones .*share GPUs"),
    (2, 6, 4, False, "need 8 GPUs, but this process sees 6; start at most 1"),
])
def test_more_processes_than_gpus_is_one_clear_error(local_size, visible, per, pinned, match):
    with pytest.raises(UsageError, match=match):
        choose_gpus(1, local_size, visible, per, pinned)


def test_pinned_means_a_scheduler_set_the_visible_devices():
    assert gpus_pinned({"CUDA_VISIBLE_DEVICES": "3"}) and gpus_pinned({"ROCR_VISIBLE_DEVICES": "0,1"})
    assert not gpus_pinned({}) and not gpus_pinned({"CUDA_VISIBLE_DEVICES": ""})


def test_pin_gpus_makes_only_its_own_visible_with_memory_growth():
    config = FakeConfig(4)
    chosen = pin_gpus(2, 4, tf_config=config, environ={})
    assert [d.name for d in chosen] == ["/physical_device:GPU:2"]
    assert [d.name for d in config.visible] == ["/physical_device:GPU:2"]
    assert sorted(config.growth) == sorted((d.name, True) for d in config.gpus)


def test_pin_gpus_under_slurm_takes_the_one_it_sees():
    config = FakeConfig(1)
    chosen = pin_gpus(6, 8, tf_config=config, environ={"CUDA_VISIBLE_DEVICES": "6"})
    assert [d.name for d in chosen] == ["/physical_device:GPU:0"]


def test_a_runtime_started_with_other_gpus_is_an_error_not_silence():
    # TensorFlow already runs and sees all 4 GPUs; local rank 1 of 4 wants GPU 1 alone.
    with pytest.raises(DistributedError, match=r"local rank 1 of 4 should use GPU\(s\) \['/physical_device:GPU:1'\]"
                                                r".*sees \['/physical_device:GPU:0'"):
        pin_gpus(1, 4, tf_config=FakeConfig(4, started_with=[0, 1, 2, 3]), environ={})


def test_a_runtime_started_with_the_right_gpu_is_fine():
    chosen = pin_gpus(1, 4, tf_config=FakeConfig(4, started_with=[1]), environ={})
    assert [d.name for d in chosen] == ["/physical_device:GPU:1"]


def test_no_gpus_changes_nothing():
    config = FakeConfig(0)
    assert pin_gpus(0, 2, tf_config=config, environ={}) == [] and config.growth == []
