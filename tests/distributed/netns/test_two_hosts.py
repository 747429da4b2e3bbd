"""Two workers on two simulated hosts (network namespaces joined by a shaped veth link).

``scripts/two_hosts.py`` builds the hosts; each backend then trains the probe
model with one worker per host, over the link only (TCP for Open MPI, gRPC
for TensorFlow), and both workers must end with the same variables, bit for
bit, as on one host. Needs root (CI runs as root); every run has a timeout,
and the hosts are removed afterwards even when the run fails.
"""
import importlib.util
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.distributed.native.runs import IDS, PROBE, Run
from tests.helpers import ROOT, have_horovod, subprocess_env

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")

SCRIPT = os.path.join(ROOT, "scripts", "two_hosts.py")
NAME = "lmkittest"  # its own namespaces: a developer's `two_hosts.py up` stays untouched
SUBNET = "10.214.0"
STEPS = 12


@pytest.fixture(autouse=True, scope="module")
def _hosts_to_ourselves():
    """One suite at a time builds the simulated hosts (``make test`` runs two suites side by side,
    and the hosts have fixed names and addresses): an exclusive lock for this module's tests."""
    import fcntl
    with open(os.path.join("/tmp", "lmkit-two-hosts-tests.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _harness():
    spec = importlib.util.spec_from_file_location("two_hosts", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _run_across(tmp_path, backend: str, rate: str, *extra: str) -> Run:
    prefix = str(tmp_path / backend)
    probe = [sys.executable, PROBE, "--out", prefix, "--backend", backend, "--ids", str(IDS),
             "--steps", str(STEPS), *extra]
    cmd = [sys.executable, SCRIPT, "run", "--name", NAME, "--subnet", SUBNET, "--rate", rate,
           "--backend", backend, "--timeout", "240", "--", *probe]
    proc = subprocess.run(cmd, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}"
    assert not os.path.exists(f"/var/run/netns/{NAME}-h1"), "the hosts were not removed"
    return Run(prefix, 2)


def _assert_identical_workers_on_two_hosts(run: Run, backend: str) -> None:
    assert [m["rank"] for m in run.meta] == [0, 1]
    assert all(m["size"] == 2 and m["backend"] == backend and m["steps"] == STEPS for m in run.meta)
    # Each worker ran on its own "host": its own host name, alone on it.
    assert [m["host"] for m in run.meta] == [f"{NAME}-h1", f"{NAME}-h2"]
    assert [m["local_size"] for m in run.meta] == [1, 1]
    np.testing.assert_array_equal(run.rank[0]["losses"], run.rank[1]["losses"])
    arrays = run.arrays(0)
    assert len(arrays) > 2
    for k, v in arrays.items():
        np.testing.assert_array_equal(v, run.rank[1][k], err_msg=k)
    # Training happened: the variables moved and the loss fell.
    assert not np.array_equal(run.rank[0]["var0"], run.rank[0]["init0"])
    assert run.losses[-1] < run.losses[0]


@pytest.mark.horovod
def test_horovod_workers_on_two_hosts_end_identical(tmp_path):
    assert have_horovod()
    run = _run_across(tmp_path, "horovod", "1gbit", "--seed_by_rank")
    _assert_identical_workers_on_two_hosts(run, "horovod")


def test_native_workers_on_two_hosts_end_identical(tmp_path):
    run = _run_across(tmp_path, "native", "1gbit", "--seed_by_rank")
    _assert_identical_workers_on_two_hosts(run, "native")
    assert all(m["replicas"] == 2 for m in run.meta)


def test_the_link_is_shaped_and_the_hosts_are_removed():
    harness = _harness()
    try:
        state = harness.up(NAME, SUBNET, rate="1gbit")
        assert state.addresses == [f"{SUBNET}.1", f"{SUBNET}.2"]
        assert os.path.exists(f"/var/run/netns/{NAME}-h2")
        # Each end's link has the token bucket at the rate asked for ...
        for host in state.hosts:
            qdisc = subprocess.run(["tc", "-n", host.namespace, "qdisc", "show", "dev", host.link],
                                   capture_output=True, text=True, timeout=30).stdout
            assert "tbf" in qdisc and "rate 1Gbit" in qdisc, qdisc
        # ... and the link carries data no faster than it. The measurement (Python sockets on the
        # hosts' cores) only has an upper bound: load from other jobs slows it, never speeds it up
        # (it measured 0.48 Gbit/s with both test suites running beside it).
        link = harness.check(NAME, megabytes=16)
        assert 0 < link["throughput_gbit_per_s"] < 1.1, link
        # The agent runs commands on the host it is given, as ssh would.
        out = subprocess.run([state.agent, f"{SUBNET}.2", "hostname; ip -o -4 addr show"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split()[0] == f"{NAME}-h2" and f"{SUBNET}.2/24" in out.stdout
        assert f"{SUBNET}.1/24" not in out.stdout
    finally:
        harness.down(NAME)
    assert not os.path.exists(f"/var/run/netns/{NAME}-h1")
    assert not os.path.exists(state.agent)


def test_an_interrupted_run_removes_the_hosts(tmp_path):
    # SIGINT while the job runs: the job is stopped and the namespaces are gone.
    proc = subprocess.Popen([sys.executable, SCRIPT, "run", "--name", NAME, "--subnet", SUBNET,
                             "--backend", "native", "--", "sleep", "600"], cwd=ROOT, env=subprocess_env(),
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(f"/var/run/netns/{NAME}-h2") and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert os.path.exists(f"/var/run/netns/{NAME}-h2")
        time.sleep(1.0)  # the job (sleep, through the agent) is running
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            _harness().down(NAME)
    assert not os.path.exists(f"/var/run/netns/{NAME}-h1")
    assert "interrupted" in proc.stderr.read()


def test_bad_shaping_and_bad_backend_are_one_clear_error():
    for args, words in ((["--rate", "fast"], "--rate 'fast' is not a tc rate"),
                        (["--backend", "gloo"], "invalid choice")):
        cmd = [sys.executable, SCRIPT, "run", "--name", NAME, "--subnet", SUBNET,
               *(args if "--backend" in args else ["--backend", "native", *args]), "--", "true"]
        proc = subprocess.run(cmd, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert not os.path.exists(f"/var/run/netns/{NAME}-h1")


def test_without_root_the_harness_says_so():
    # As another user (nobody), `up` refuses with a message naming root. The harness needs only the
    # standard library: the system's Python runs it, which nobody can (a pyenv Python under /root,
    # as the newest-TensorFlow environment's may be, cannot even load its libpython there).
    python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           python, SCRIPT, "up", "--name", NAME],
                          cwd="/", env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "need root" in proc.stderr and "Traceback" not in proc.stderr
