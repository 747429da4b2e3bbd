"""lmkit.distributed's package functions: the backend registry, what importing it loads, and the work-once
collectives (agree, rank0_first, read_or_receive) seen from each rank of a faked two-rank job."""
import sys

import pytest

from lmkit import distributed as dist
from lmkit.core.errors import PreemptedError, UsageError
from lmkit.core.preemption import PreemptionSignal
from tests.helpers import run


def test_every_backend_is_registered_and_implements_the_interface():
    assert set(dist.BACKENDS) == {"horovod", "native", "local"}
    for name in dist.BACKENDS:
        cls = dist.backend_class(name)
        assert issubclass(cls, dist.Backend) and cls.name == name
        assert not getattr(cls, "__abstractmethods__", None), (name, cls.__abstractmethods__)
    with pytest.raises(ValueError, match="unknown backend 'horovd'; did you mean 'horovod'"):
        dist.backend_class("horovd")


def test_importing_dist_loads_neither_tensorflow_nor_horovod():
    code = ("import sys, lmkit.distributed, lmkit.distributed.env, lmkit.distributed.launch; "
            "print(sorted(m for m in ('tensorflow', 'horovod') if m in sys.modules))")
    res = run([sys.executable, "-c", code], timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


class TwoRanks:
    """This process as ``rank`` of a job of two: ``peers`` are what the other rank gives to the gathers, one
    after the other, and ``sent`` what rank 0 broadcasts (on rank 0, its own payload)."""

    def __init__(self, monkeypatch, rank: int, peers=(), sent=None) -> None:
        self.calls = []
        peers = list(peers)

        def allgather(obj):
            peer = peers.pop(0)
            return [obj, peer] if rank == 0 else [peer, obj]

        monkeypatch.setattr(dist, "rank", lambda: rank)
        monkeypatch.setattr(dist, "size", lambda: 2)
        monkeypatch.setattr(dist, "allgather_object", allgather)
        monkeypatch.setattr(dist, "broadcast_object", lambda obj, root=0: obj if rank == 0 else sent)

    def read(self, value):
        def fn():
            self.calls.append(value)
            return value
        return fn


def test_rank0_first_runs_on_rank_0_only_and_every_rank_gets_its_result(monkeypatch):
    chief = TwoRanks(monkeypatch, 0)
    assert dist.rank0_first(chief.read("downloaded")) == "downloaded" and chief.calls == ["downloaded"]
    other = TwoRanks(monkeypatch, 1, sent=("downloaded", None))
    assert dist.rank0_first(other.read("mine")) == "downloaded" and other.calls == []
    with pytest.raises(ValueError, match="bad archive"):  # rank 0's error, raised on rank 1
        TwoRanks(monkeypatch, 1, sent=(None, ValueError("bad archive")))
        dist.rank0_first(lambda: None)


def test_a_signal_on_rank_0_inside_rank0_first_stops_every_rank(monkeypatch):
    TwoRanks(monkeypatch, 0)

    def signalled():
        raise PreemptionSignal("stopped by SIGTERM while downloading")

    with pytest.raises(PreemptedError, match="while downloading"):  # an Exception: sent to the other ranks
        dist.rank0_first(signalled)


def test_agree_raises_any_ranks_usage_error_on_every_rank(monkeypatch):
    TwoRanks(monkeypatch, 0, peers=[None])
    assert dist.agree(lambda: 3) == 3
    TwoRanks(monkeypatch, 1, peers=[("usage", "rank 0 cannot read train.txt")])
    with pytest.raises(UsageError, match="^rank 0 cannot read train.txt$"):
        dist.agree(lambda: 3)


def test_read_or_receive_reads_everywhere_when_every_rank_can_else_takes_rank_0s(monkeypatch):
    both = TwoRanks(monkeypatch, 1, peers=[True, None])  # the peer can read, then reads without an error
    assert dist.read_or_receive(True, both.read("read here")) == "read here" and both.calls == ["read here"]
    lacking = TwoRanks(monkeypatch, 1, peers=[True], sent=("rank 0's", None))
    assert dist.read_or_receive(False, lacking.read("never")) == "rank 0's" and lacking.calls == []
    chief = TwoRanks(monkeypatch, 0, peers=[False])  # the other rank lacks the files: rank 0 reads and sends
    assert dist.read_or_receive(True, chief.read("sent")) == "sent" and chief.calls == ["sent"]
