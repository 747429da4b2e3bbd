"""The local backend (lmkit.distributed.local): one process, no peers."""
from lmkit.distributed.local import LocalBackend


def test_local_backend_is_size_one():
    b = LocalBackend()
    assert (b.rank(), b.size(), b.local_rank(), b.local_size()) == (0, 1, 0, 1)
    assert b.allgather_object("x") == ["x"]
    assert b.is_peer_failure(RuntimeError("Horovod has been shut down")) is False
