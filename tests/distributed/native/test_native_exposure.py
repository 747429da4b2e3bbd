"""What a native multi-worker job opens to the network, and what it tells the user about it.

Each worker of a ``MultiWorkerMirroredStrategy`` job starts TensorFlow's gRPC
server, which runs the operations anyone sends it, without authentication.
TensorFlow binds it to every interface whatever address ``TF_CONFIG`` gives
(checked here from ``/proc/net/tcp*``), so a job on one host warns, once,
and points to the replicas of one process, which need no server.
"""
import json
import os
import socket
import sys

import pytest

from lmkit.distributed import native_setup
from tests.helpers import ROOT, run

LOCAL_WARNING = "[lmkit] warning: every worker of this job runs on this host"
WILDCARDS = {"0.0.0.0", "::"}


def listening_addresses(port: int, proc_net: str = "/proc/net") -> set:
    """The local addresses of the TCP sockets listening on ``port`` (IPv4 and IPv6)."""
    found = set()
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        path = os.path.join(proc_net, name)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            next(f)  # the header
            for line in f:
                local, state = line.split()[1], line.split()[3]
                address, hexport = local.split(":")
                if state != "0A" or int(hexport, 16) != port:  # 0A: LISTEN
                    continue
                raw = bytes.fromhex(address)  # 32-bit words, each in host (little-endian) order
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                found.add(socket.inet_ntop(family, raw))
    return found


# Each worker reports where its own server listens, once the strategy has started it.
WORKER = f"""
import json, os, sys
sys.path.insert(0, {ROOT!r})
from lmkit import distributed as dist
dist.init(backend="native")
from tests.distributed.native.test_native_exposure import listening_addresses
me = json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"][dist.rank()]
line = "LISTENING %d %s\\n" % (dist.rank(), json.dumps(sorted(listening_addresses(int(me.rpartition(":")[2])))))
os.write(1, line.encode())  # one write: the two workers' lines never interleave (print writes in pieces)
dist.barrier()
"""


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads the listening sockets from /proc/net")
def test_a_job_on_one_host_warns_once_when_its_servers_listen_on_every_interface(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    res = run([sys.executable, "-m", "lmkit.launch", "--hosts", "127.0.0.1", "--num_workers", "2", "--",
               sys.executable, str(script)], timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    bound = {int(line.split()[1]): set(json.loads(line.split(None, 2)[2]))
             for line in res.stdout.splitlines() if line.startswith("LISTENING ")}
    assert sorted(bound) == [0, 1] and all(bound.values()), out[-4000:]
    if any(addresses & WILDCARDS for addresses in bound.values()):
        # TensorFlow 2.18 to 2.21: reachable from the network, whatever TF_CONFIG says.
        assert out.count(LOCAL_WARNING) == 1, out[-4000:]  # rank 0 alone
        assert "--num_gpus N without lmkit.launch" in out
    else:  # a TensorFlow that binds to the task's address: nothing to warn about
        assert all(addresses <= {"127.0.0.1", "::1"} for addresses in bound.values()), bound
        assert LOCAL_WARNING not in out, out[-4000:]


def test_the_warning_is_for_jobs_whose_every_worker_is_on_this_host():
    warn = native_setup.open_servers_warning
    own = socket.gethostname()
    assert warn(["127.0.0.1:4000", "localhost:4001"]).startswith(LOCAL_WARNING)
    assert "ports 4000, 4001" in warn(["127.0.0.1:4000", "localhost:4001"])
    assert warn(["[::1]:4000", f"{own}:4001"]) is not None
    assert warn(["127.0.0.1:4000", "other-host:4000"]) is None  # across hosts: docs/reliability.md
    assert warn(["127.0.0.1:4000"]) is None  # one worker: no cluster, no server


def test_listening_addresses_reads_ipv4_and_ipv6_rows(tmp_path):
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    (tmp_path / "tcp").write_text(header + "   0: 0100007F:1F90 00000000:0000 0A 0 0 0\n"
                                           "   1: 00000000:1F90 00000000:0000 01 0 0 0\n"  # not listening
                                           "   2: 00000000:1F91 00000000:0000 0A 0 0 0\n")  # another port
    (tmp_path / "tcp6").write_text(header + "   0: 00000000000000000000000000000000:1F90 "
                                            "00000000000000000000000000000000:0000 0A 0 0 0\n"
                                            "   1: 00000000000000000000000001000000:1F90 "
                                            "00000000000000000000000000000000:0000 0A 0 0 0\n")
    assert listening_addresses(0x1F90, str(tmp_path)) == {"127.0.0.1", "::", "::1"}
