"""Setting the native backend up (lmkit.distributed.native_setup): TF_CONFIG, the collectives' implementation."""
import json

import pytest
import tensorflow as tf

from lmkit import distributed as dist
from lmkit.distributed import native_setup


def test_tf_config_gives_rank_and_size(monkeypatch):
    cluster = {"chief": ["a:1"], "worker": ["b:1", "c:1"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}}))
    assert native_setup.tf_config_cluster() == (2, 3)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}}))
    assert native_setup.tf_config_cluster() == (0, 3)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1"]}, "task": {}}))
    assert native_setup.tf_config_cluster() is None  # one worker: a single-host job
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(dist.DistributedError, match="TF_CONFIG is not valid"):
        native_setup.tf_config_cluster()
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "ps", "index": 0}}))
    with pytest.raises(dist.DistributedError, match="task type 'ps'"):
        native_setup.tf_config_cluster()


def test_workers_all_reduce_with_nccl_between_gpus_and_the_ring_on_cpus():
    impl = tf.distribute.experimental.CommunicationImplementation
    assert native_setup.communication_options(gpus=True).implementation == impl.NCCL
    assert native_setup.communication_options(gpus=False).implementation == impl.RING
