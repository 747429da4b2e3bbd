#!/usr/bin/env python
"""Two simulated hosts on this machine: network namespaces joined by a veth pair.

Each "host" is a network namespace with its own address, its own host name
(a UTS namespace per process started in it) and its own share of this
machine's cores; the only link between them is one veth pair, optionally
shaped with ``tc`` (a token bucket: ``--rate 1gbit``; ``--delay`` adds
latency where the kernel has ``sch_netem``). Jobs cross it exactly as they
would cross two machines: Open MPI over TCP (shared memory is off, since the
processes could still reach each other's memory), TensorFlow's gRPC for the
native backend.

Needs root (namespaces, links and qdiscs), ``ip`` and ``tc`` (iproute2),
``unshare`` and ``taskset`` (util-linux).

    python scripts/two_hosts.py up --rate 1gbit        # build, print the hosts and the agent
    python scripts/two_hosts.py run --rate 1gbit --backend horovod -- \\
        .venv/bin/python examples/lm_ptb_distributed.py --config config_small
    python scripts/two_hosts.py run --backend native -- \\
        .venv-tf-latest/bin/python examples/lm_ptb_distributed.py --use_horovod false
    python scripts/two_hosts.py check                  # ping time and TCP rate across the link
    python scripts/two_hosts.py down                   # remove everything (also after a crash)

``run`` builds the hosts, starts one worker on each (``mpirun -H
10.213.0.1:1,10.213.0.2:1`` run on the first host, or ``python -m
lmkit.launch --hosts 10.213.0.1,10.213.0.2`` whose workers it starts
through the agent), and removes the hosts when the job ends, fails, or is
interrupted (Ctrl-C, SIGTERM): processes left in the namespaces are killed.

The *agent* (``up`` prints its path) is Open MPI's ``plm_rsh_agent`` and
``lmkit.launch --rsh``: ``AGENT <address> <command>`` runs the command on
that simulated host, as ``ssh`` would on a real one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import List, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATE_DIR = "/run/lmkit-two-hosts"
DEFAULT_NAME = "lmkit"
DEFAULT_SUBNET = "10.213.0"
RATE = re.compile(r"^\d+(\.\d+)?(bit|kbit|mbit|gbit|tbit)$")
DELAY = re.compile(r"^\d+(\.\d+)?(us|ms|s)$")


class HarnessError(Exception):
    """A problem with one clear message (printed without a traceback, exit 2)."""


@dataclass(frozen=True)
class Host:
    """One simulated host."""

    namespace: str
    link: str  # its end of the veth pair
    address: str
    cpus: List[int]


@dataclass(frozen=True)
class Hosts:
    """The two hosts and how their link is shaped."""

    name: str
    hosts: List[Host]
    rate: Optional[str]
    delay: Optional[str]
    agent: str

    @property
    def addresses(self) -> List[str]:
        return [h.address for h in self.hosts]

    def host(self, address: str) -> Host:
        for h in self.hosts:
            if address in (h.address, h.namespace):
                return h
        raise HarnessError(f"{address!r} is not one of the simulated hosts {self.addresses}")


def _state_path(name: str) -> str:
    return os.path.join(STATE_DIR, f"{name}.json")


def _agent_path(name: str) -> str:
    return os.path.join(STATE_DIR, f"{name}-rsh")


def _namespaces(name: str) -> List[str]:
    return [f"{name}-h1", f"{name}-h2"]


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise HarnessError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()}")
    return proc


def require_root() -> None:
    """Raises HarnessError unless this process can build namespaces (root, iproute2, util-linux)."""
    if os.geteuid() != 0:
        raise HarnessError("two simulated hosts need root (network namespaces, veth links and tc "
                           "qdiscs): run this script as root, e.g. `sudo .venv/bin/python "
                           "scripts/two_hosts.py ...`")
    missing = [t for t in ("ip", "tc", "unshare", "taskset") if shutil.which(t) is None]
    if missing:
        raise HarnessError(f"{', '.join(missing)} not found: install iproute2 and util-linux "
                           "(apt-get install iproute2 util-linux)")


def _check_shape(rate: Optional[str], delay: Optional[str]) -> None:
    if rate and not RATE.match(rate):
        raise HarnessError(f"--rate {rate!r} is not a tc rate; e.g. 1gbit, 10gbit, 500mbit")
    if delay and not DELAY.match(delay):
        raise HarnessError(f"--delay {delay!r} is not a tc time; e.g. 200us, 1ms")


def _rate_bits(rate: str) -> float:
    number, unit = re.match(r"^([\d.]+)(\w+)$", rate).groups()
    return float(number) * {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}[unit]


def up(name: str = DEFAULT_NAME, subnet: str = DEFAULT_SUBNET, rate: Optional[str] = None,
       delay: Optional[str] = None) -> Hosts:
    """Builds the two hosts (after removing any left from an earlier run of ``name``)."""
    require_root()
    _check_shape(rate, delay)
    down(name)
    cpus = sorted(os.sched_getaffinity(0))
    half = max(1, len(cpus) // 2)
    shares = [cpus[:half], cpus[half:2 * half] or cpus[:half]]
    hosts = [Host(namespace=ns, link=f"{name}-v{i + 1}"[:15], address=f"{subnet}.{i + 1}", cpus=shares[i])
             for i, ns in enumerate(_namespaces(name))]
    os.makedirs(STATE_DIR, exist_ok=True)
    agent = _agent_path(name)
    state = Hosts(name=name, hosts=hosts, rate=rate, delay=delay, agent=agent)
    # The state goes first: `down` can then undo a half-built set.
    _write(_state_path(name), json.dumps(asdict(state), indent=2))
    _write(agent, "#!/bin/sh\n# Runs a command on a simulated host: AGENT <address> <command...>\n"
                  f"exec {shlex.quote(sys.executable)} {shlex.quote(os.path.abspath(__file__))} "
                  f"agent --name {shlex.quote(name)} \"$@\"\n", mode=0o755)
    a, b = hosts
    for h in hosts:
        _sh("ip", "netns", "add", h.namespace)
        _sh("ip", "-n", h.namespace, "link", "set", "lo", "up")
    _sh("ip", "link", "add", a.link, "netns", a.namespace, "type", "veth",
        "peer", "name", b.link, "netns", b.namespace)
    for h in hosts:
        _sh("ip", "-n", h.namespace, "addr", "add", f"{h.address}/24", "dev", h.link)
        _sh("ip", "-n", h.namespace, "link", "set", h.link, "up")
        if delay:  # netem delays, its rate option shapes
            cmd = ["tc", "-n", h.namespace, "qdisc", "add", "dev", h.link, "root", "netem", "delay", delay]
            proc = _sh(*cmd + (["rate", rate] if rate else []), check=False)
            if proc.returncode != 0:
                down(name)
                raise HarnessError(f"--delay needs the kernel's netem qdisc, which this machine lacks "
                                   f"({proc.stderr.strip()}); shape with --rate alone")
        elif rate:
            # A bucket of ~1 ms of traffic (at least 64 KiB): bursts stay far below a gradient.
            burst = max(64 * 1024, int(_rate_bits(rate) / 8 / 1000))
            _sh("tc", "-n", h.namespace, "qdisc", "add", "dev", h.link, "root", "tbf", "rate", rate,
                "burst", str(burst), "latency", "50ms")
    return state


def _write(path: str, text: str, mode: int = 0o644) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def load(name: str = DEFAULT_NAME) -> Hosts:
    """The hosts ``up`` built (raises HarnessError when there are none)."""
    try:
        with open(_state_path(name)) as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise HarnessError(f"no simulated hosts named {name!r}: run `scripts/two_hosts.py up` first") from None
    raw["hosts"] = [Host(**h) for h in raw["hosts"]]
    return Hosts(**raw)


def down(name: str = DEFAULT_NAME) -> None:
    """Kills every process in the hosts' namespaces and removes them (no error if absent)."""
    require_root()
    namespaces = _namespaces(name)
    for ns in namespaces:
        pids = _sh("ip", "netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    for ns in namespaces:
        _sh("ip", "netns", "del", ns, check=False)  # takes its end of the veth pair, and so both
    for path in (_state_path(name), _agent_path(name)):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def on_host(host: Host, command: str) -> List[str]:
    """argv that runs the shell ``command`` on ``host``: its namespace, host name and cores."""
    cpus = ",".join(map(str, host.cpus))
    inner = f"hostname {shlex.quote(host.namespace)} && exec taskset -c {cpus} sh -c {shlex.quote(command)}"
    return ["ip", "netns", "exec", host.namespace, "unshare", "--uts", "--", "sh", "-c", inner]


def agent(name: str, address: str, command: Sequence[str]) -> None:
    """The rsh agent: replaces this process with ``command`` run on the host at ``address``."""
    argv = on_host(load(name).host(address), " ".join(command))
    os.execvp(argv[0], argv)


def job_command(state: Hosts, backend: str, command: Sequence[str], mpirun_args: Sequence[str] = ()
                ) -> List[str]:
    """argv of a job with one worker on each host (run it in the root namespace)."""
    if backend == "native":
        return [sys.executable, "-m", "lmkit.launch", "--hosts", ",".join(state.addresses),
                "--num_workers", "2", "--rsh", state.agent, "--", *command]
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise HarnessError("mpirun not found: run `make setup` (Debian's Open MPI)")
    subnet = state.addresses[0].rsplit(".", 1)[0] + ".0/24"
    forwarded = sorted(k for k in os.environ if k.startswith(("LMKIT_", "HOROVOD_", "TF_CPP", "PYTHON")))
    mpi = [mpirun, "-H", ",".join(f"{a}:1" for a in state.addresses), "-np", "2",
           "--mca", "plm_rsh_agent", state.agent, "--mca", "plm_rsh_no_tree_spawn", "1",
           # Over the link only: shared memory would bypass it (both "hosts" share this memory).
           "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", subnet,
           "--mca", "oob_tcp_if_include", subnet, "--bind-to", "none", *mpirun_args]
    for key in forwarded:
        mpi += ["-x", key]
    # mpirun itself runs on the first host, as it would on a cluster's first node.
    return on_host(state.hosts[0], " ".join(shlex.quote(c) for c in [*mpi, *command]))


def run(backend: str, command: Sequence[str], *, name: str = DEFAULT_NAME, subnet: str = DEFAULT_SUBNET,
        rate: Optional[str] = None, delay: Optional[str] = None, timeout: Optional[float] = None,
        mpirun_args: Sequence[str] = ()) -> int:
    """Builds the hosts, runs one job across them, removes them; returns the job's exit status."""
    if backend not in ("horovod", "native"):
        raise HarnessError(f"--backend {backend!r} must be horovod or native")
    if not command:
        raise HarnessError("no command given; put the training command after --")
    state = up(name, subnet, rate, delay)
    proc: Optional[subprocess.Popen] = None
    previous = {}

    def stop(signum, frame):  # Ctrl-C or SIGTERM: end the job, then clean up below
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, stop)
    try:
        env = dict(os.environ)
        if os.geteuid() == 0:
            env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
        argv = job_command(state, backend, command, mpirun_args)
        print(f"[two_hosts] {' '.join(state.addresses)} ({state.rate or 'unshaped'}"
              f"{', delay ' + state.delay if state.delay else ''}): {' '.join(argv)}", file=sys.stderr, flush=True)
        proc = subprocess.Popen(argv, env=env, cwd=os.getcwd(), start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"[two_hosts] the job ran past --timeout {timeout:g} s; stopping it", file=sys.stderr)
            return 124
    except KeyboardInterrupt:
        print("[two_hosts] interrupted; stopping the job and removing the hosts", file=sys.stderr)
        return 130
    finally:
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        down(name)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def check(name: str = DEFAULT_NAME, megabytes: int = 64) -> dict:
    """Round-trip time and TCP throughput from host 1 to host 2 (the hosts must be up)."""
    state = load(name)
    a, b = state.hosts
    probe = os.path.abspath(__file__)
    port = 29999
    server = subprocess.Popen(on_host(b, f"{shlex.quote(sys.executable)} {probe} _sink {b.address} {port}"))
    try:
        time.sleep(1.0)
        out = subprocess.run(on_host(a, f"{shlex.quote(sys.executable)} {probe} _source {b.address} {port} "
                                        f"{megabytes}"), capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise HarnessError(f"the link check failed: {out.stderr.strip()}")
        return json.loads(out.stdout)
    finally:
        server.kill()
        server.wait()


def _sink(address: str, port: int) -> None:  # runs on host 2: echo one byte, then swallow bytes
    with socket.create_server((address, port)) as srv:
        while True:
            conn, _ = srv.accept()
            with conn:
                conn.sendall(conn.recv(1))
                while conn.recv(1 << 20):
                    pass


def _source(address: str, port: int, megabytes: int) -> None:  # runs on host 1
    rtts = []
    for _ in range(20):
        with socket.create_connection((address, port)) as c:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            start = time.perf_counter()
            c.sendall(b"x")
            c.recv(1)
            rtts.append(time.perf_counter() - start)
    payload = b"\0" * (1 << 20)
    with socket.create_connection((address, port)) as c:
        c.sendall(b"x")
        c.recv(1)
        start = time.perf_counter()
        for _ in range(megabytes):
            c.sendall(payload)
        c.shutdown(socket.SHUT_WR)
        c.recv(1)
        seconds = time.perf_counter() - start
    rtts.sort()
    print(json.dumps({"rtt_us_median": round(1e6 * rtts[len(rtts) // 2], 1),
                      "throughput_gbit_per_s": round(megabytes * 8 * 2 ** 20 / seconds / 1e9, 3),
                      "megabytes": megabytes}))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/two_hosts.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    sub = parser.add_subparsers(dest="what", required=True)

    def shape(p):
        p.add_argument("--name", default=DEFAULT_NAME, help="prefix of the namespaces and links")
        p.add_argument("--subnet", default=DEFAULT_SUBNET, help="the hosts are SUBNET.1 and SUBNET.2")
        p.add_argument("--rate", default=None, help="shape each direction of the link, e.g. 1gbit, 10gbit")
        p.add_argument("--delay", default=None, help="one-way latency, e.g. 200us (needs sch_netem)")

    shape(sub.add_parser("up", help="build the two hosts"))
    p = sub.add_parser("run", help="build the hosts, run one job across them, remove them")
    shape(p)
    p.add_argument("--backend", choices=("horovod", "native"), required=True)
    p.add_argument("--timeout", type=float, default=None, help="stop the job after this many seconds")
    p.add_argument("--mpirun_args", default="", help="more mpirun options (horovod), one string")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- followed by the training command")
    p = sub.add_parser("down", help="remove the hosts and kill what runs in them")
    p.add_argument("--name", default=DEFAULT_NAME)
    p = sub.add_parser("check", help="round-trip time and TCP rate across the link (hosts up)")
    p.add_argument("--name", default=DEFAULT_NAME)
    p = sub.add_parser("agent", help="(internal) the rsh agent: agent ADDRESS COMMAND...")
    p.add_argument("--name", default=DEFAULT_NAME)
    p.add_argument("address")
    p.add_argument("command", nargs=argparse.REMAINDER)
    for hidden in ("_sink", "_source"):
        p = sub.add_parser(hidden)
        p.add_argument("args", nargs="*")
    args = parser.parse_args(argv)
    try:
        if args.what == "up":
            state = up(args.name, args.subnet, args.rate, args.delay)
            print(json.dumps({"hosts": state.addresses, "agent": state.agent, "rate": state.rate,
                              "delay": state.delay}))
        elif args.what == "run":
            command = args.command[1:] if args.command[:1] == ["--"] else args.command
            return run(args.backend, command, name=args.name, subnet=args.subnet, rate=args.rate,
                       delay=args.delay, timeout=args.timeout, mpirun_args=shlex.split(args.mpirun_args))
        elif args.what == "down":
            down(args.name)
        elif args.what == "check":
            print(json.dumps(check(args.name)))
        elif args.what == "agent":
            agent(args.name, args.address, args.command)
        elif args.what == "_sink":
            _sink(args.args[0], int(args.args[1]))
        elif args.what == "_source":
            _source(args.args[0], int(args.args[1]), int(args.args[2]))
    except HarnessError as exc:
        print(f"two_hosts: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
