"""Warm starts for the Python commands that tests run: a process that has imported TensorFlow forks one
child per command.

TensorFlow's import is about 3 of the 4-5 CPU-seconds of a short ``lmkit generate``, and the suite
runs hundreds of such commands on 2 cores. :func:`tests.helpers.run` hands a command of the form
``[sys.executable, "-m", MODULE, ...]`` or ``[sys.executable, SCRIPT.py, ...]`` to this module's
server (one per pytest process, started on first use), which forks. For all a test can see the child
is a process of its own, started as the command says:

* its own pid, and its own session when asked (``start_new_session``): the test kills its group;
* the command's environment (``os.environ``, so ``getenv`` too), working directory, ``sys.argv``,
  ``sys.path`` (``PYTHONPATH``, then the module's or script's folder, as Python puts it);
* the test's pipes as stdin, stdout and stderr;
* Python's way out: ``SystemExit``'s status, a traceback and 1 for an exception, non-daemon
  threads joined, atexit handlers run, output flushed; a signal's death reads as ``-signum``.

What differs is that TensorFlow's modules (and NumPy's) are already imported. So a command runs cold,
as a real subprocess, whenever its environment differs from the server's in a variable that these
imports read (``TF_*``, ``XLA_FLAGS``, thread and allocator settings, ``PYTHON*`` other than
``PYTHONPATH``), and always under ``LMKIT_TEST_WARM=0``. Launchers (``mpirun``, ``horovodrun``)
and other interpreters are never routed here: those tests start every process cold.
``LMKIT_TEST_WARM_LOG=FILE`` appends a line per routable command to FILE: warm, or cold.

Ranks under ``mpirun`` start warm too. :func:`rank_env` adds to a launcher's environment the server's
socket and ``tests/warm_site`` (on ``PYTHONPATH``), whose ``sitecustomize`` calls :func:`become_rank`
in every Python the launcher starts. In an Open MPI rank whose command is routable, that process (the
*stand-in*: the launcher's child, with the launcher's pipes, group and pid) has the server fork the
command with its environment, directory and pipes, passes on every signal it gets to the command's
group, and ends as the command ended (its status, or death by the same signal). Should the stand-in
die of SIGKILL, the server kills the command. A rank whose namespaces (another simulated host) or
import-time variables differ from the server's runs cold, as does any other Python the launcher starts.

The server is single-threaded (it forks from the one thread it has): it polls its socket and reaps
its children, reports each child's pid when it starts and its status when it ends, and leaves,
killing what it started, when the test process that started it is gone.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence

# Environment variables whose value at import time can change what the imported modules do.
IMPORT_TIME_PREFIXES = ("TF_", "XLA_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "ONEDNN_", "DNNL_", "CUDA_",
                        "LD_", "MALLOC_", "JEMALLOC_", "PYTHON", "KERAS_")
DISABLE_ENV = "LMKIT_TEST_WARM"
_HEADER = struct.Struct("!I")


# ... less those read later: the path of modules to import, and the cluster of tf.distribute's resolver.
RUN_TIME = ("PYTHONPATH", "TF_CONFIG")
SOCKET_ENV, PYTHON_ENV = "LMKIT_TEST_WARM_SOCKET", "LMKIT_TEST_WARM_PYTHON"
SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "warm_site")
# What a stand-in passes on to its command: what a launcher or a test sends to stop, pause or resume it.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGCONT, signal.SIGALRM)


# Folders the dynamic linker searches anyway: Open MPI puts its own (``/usr/lib``) on a rank's
# ``LD_LIBRARY_PATH``, which then finds the libraries it found without.
SYSTEM_LIB_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu")


def import_time_env(env: Dict[str, str]) -> Dict[str, str]:
    found = {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES) and k not in RUN_TIME}
    if "LD_LIBRARY_PATH" in found:
        own = [p for p in found.pop("LD_LIBRARY_PATH").split(os.pathsep) if p.rstrip("/") not in SYSTEM_LIB_DIRS]
        if own:
            found["LD_LIBRARY_PATH"] = os.pathsep.join(own)
    return found


def namespaces() -> Dict[str, str]:
    """This process's Linux namespaces (``/proc/self/ns``): a rank on another simulated host has others."""
    found = {}
    for name in ("net", "mnt", "pid", "ipc", "uts", "user", "cgroup"):
        try:
            found[name] = os.readlink(f"/proc/self/ns/{name}")
        except OSError:
            found[name] = ""
    return found


def routable(cmd: Sequence[str]) -> bool:
    """``[sys.executable, "-m", MODULE, ...]`` or ``[sys.executable, SCRIPT.py, ...]``: no interpreter flags."""
    if len(cmd) < 2 or cmd[0] != sys.executable:
        return False
    if cmd[1] == "-m":
        return len(cmd) >= 3 and not cmd[2].startswith("-")
    return cmd[1].endswith(".py") and os.path.isfile(cmd[1])


# --------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------
def _read_exact(conn: socket.socket, count: int, first: bytes = b"") -> bytes:
    data = bytearray(first)
    while len(data) < count:
        chunk = conn.recv(count - len(data))
        if not chunk:
            raise ConnectionError("the client left mid-request")
        data += chunk
    return bytes(data)


def _receive(conn: socket.socket) -> "tuple[dict, List[int]]":
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    data = _read_exact(conn, _HEADER.size, data)
    (length,) = _HEADER.unpack(data[:_HEADER.size])
    body = _read_exact(conn, length, data[_HEADER.size:])
    return json.loads(body.decode("utf-8")), list(fds)


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    sys.stderr.write(f"{code}\n")
    return 1


def _run_child(request: dict, fds: List[int], base_path: List[str]) -> None:
    """In the forked child: becomes the command, runs it, and leaves as Python would (never returns)."""
    code = 1
    try:
        if request["new_session"]:
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in set(fds):
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        argv = request["argv"]
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        import runpy
        if argv[0] == "-m":
            sys.path[:] = [os.getcwd(), *extra, *base_path]
            sys.argv = ["-m", *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(argv[0])
            sys.path[:] = [os.path.dirname(script), *extra, *base_path]
            sys.argv = list(argv)
            runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt:
        import traceback
        traceback.print_exc()
        code = 130
    except BaseException:  # noqa: BLE001 - what Python prints for an uncaught exception
        import traceback
        traceback.print_exc()
        code = 1
    finally:
        try:
            threading._shutdown()  # non-daemon threads, as at interpreter exit
        except BaseException:  # noqa: BLE001
            pass
        try:
            import atexit
            atexit._run_exitfuncs()
        except BaseException:  # noqa: BLE001
            pass
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001
                pass
        os._exit(code)


def serve(path: str) -> None:
    """Imports TensorFlow, then forks a child per request on the Unix socket ``path``."""
    import numpy  # noqa: F401
    import tensorflow  # noqa: F401
    parent = os.getppid()
    python_path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base_path = [p for p in sys.path[1:] if p not in python_path]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(64)
    os.rename(path + ".tmp", path)  # ready: clients connect only now
    own_env, own_namespaces = import_time_env(dict(os.environ)), namespaces()
    waiting: Dict[int, Optional[socket.socket]] = {}  # a command's pid: its client's connection
    try:
        while os.getppid() == parent:
            clients = {conn: pid for pid, conn in waiting.items() if conn is not None}
            ready, _, _ = select.select([listener, *clients], [], [], 0.05)
            for conn in ready:
                if conn is not listener:  # a client sends nothing after its request: it is gone
                    _client_gone(conn, clients[conn], waiting)
            if listener in ready:
                conn, _ = listener.accept()
                try:
                    request, fds = _receive(conn)
                except (OSError, ValueError, ConnectionError):
                    conn.close()
                    continue
                why_cold = _why_cold(request, own_env, own_namespaces)
                if why_cold:
                    _send(conn, {"cold": why_cold}, fds)
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for other in waiting.values():
                        if other is not None:
                            other.close()
                    conn.close()
                    _run_child(request, fds, base_path)
                _send(conn, {"pid": pid}, fds)
                waiting[pid] = conn
            _reap(waiting)
    finally:
        for pid in list(waiting):
            _kill_group(pid)
        listener.close()


def _send(conn: socket.socket, reply: dict, fds: Sequence[int] = ()) -> None:
    """Closes the server's copies of ``fds``, then sends ``reply`` (a client that left is not an error)."""
    for fd in fds:
        os.close(fd)
    try:
        conn.sendall(json.dumps(reply).encode() + b"\n")
    except OSError:
        pass


def _why_cold(request: dict, own_env: Dict[str, str], own_namespaces: Dict[str, str]) -> str:
    """Why a request must run cold (a setting read at import, another namespace), or ``""``."""
    if import_time_env(request["env"]) != own_env:
        return "an import-time variable differs"
    if request.get("namespaces", own_namespaces) != own_namespaces:
        return "the namespaces differ"
    return ""


def _client_gone(conn: socket.socket, pid: int, waiting: Dict[int, Optional[socket.socket]]) -> None:
    """The client of ``pid`` closed its connection (a stand-in killed by SIGKILL): so is the command."""
    try:
        data = conn.recv(1)
    except OSError:
        data = b""
    if data:
        return
    _kill_group(pid)
    conn.close()
    waiting[pid] = None


def _kill_group(pid: int, signum: int = signal.SIGKILL) -> None:
    """``signum`` to ``pid``'s process group (its session, when it made one), else to ``pid`` alone."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signum)
            return
        except OSError:
            continue


def _reap(waiting: Dict[int, Optional[socket.socket]]) -> None:
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid not in waiting:
            continue
        conn = waiting.pop(pid)
        if conn is None:
            continue
        _send(conn, {"status": os.waitstatus_to_exitcode(status)})
        conn.close()


# --------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------
class _Server:
    def __init__(self, env: Dict[str, str]):
        self.folder = tempfile.mkdtemp(prefix="lmkit-warm-")
        self.path = os.path.join(self.folder, "socket")
        self.env = dict(env)
        with open(os.path.join(self.folder, "server.log"), "wb") as log:  # TensorFlow's start-up lines
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.warm", self.path], env=env,
                                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         start_new_session=True)

    def wait_ready(self, timeout: float = 120.0) -> bool:
        """Whether the server is up; one that is not up within ``timeout`` is never waited for again."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if os.path.exists(self.path):
                return True
            time.sleep(0.05)
        self.close()
        return False

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_server: Optional[_Server] = None
_lock = threading.Lock()


def _running_server(server_env: Dict[str, str]) -> Optional[_Server]:
    """This process's server (started with ``server_env`` on first use), or None when it is not up."""
    global _server
    with _lock:
        if _server is None:
            import atexit
            _server = _Server(server_env)
            atexit.register(_server.close)
        server = _server
    if not server.wait_ready() or server.proc.poll() is not None:
        return None
    return server


def _get_server(env: Dict[str, str], server_env: Dict[str, str]) -> Optional[_Server]:
    server = _running_server(server_env)
    if server is None or import_time_env(env) != import_time_env(server.env):
        return None
    return server


class WarmProcess:
    """A command forked by the server; :meth:`communicate` as :class:`subprocess.Popen`'s, text mode."""

    def __init__(self, conn: socket.socket, pid: int, pipes: "tuple", input: Optional[str], buffer: bytes):
        self.conn, self.pid, self.returncode, self._buffer = conn, pid, None, buffer
        self._stdin, self._stdout, self._stderr = pipes
        self._input = input

    def communicate(self, timeout: Optional[float] = None) -> "tuple[str, str]":
        out: List[bytes] = []
        err: List[bytes] = []
        readers = [threading.Thread(target=_drain, args=(self._stdout, out), daemon=True),
                   threading.Thread(target=_drain, args=(self._stderr, err), daemon=True)]
        for reader in readers:
            reader.start()
        if self._stdin is not None:
            writer = threading.Thread(target=_feed, args=(self._stdin, self._input or ""), daemon=True)
            writer.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        status = self._wait_status(deadline)
        if status is None:
            raise subprocess.TimeoutExpired(["(warm)"], timeout or 0.0)
        for reader in readers:  # the command's children may still hold its output open
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if any(reader.is_alive() for reader in readers):  # as Popen.communicate: no end of output in time
            raise subprocess.TimeoutExpired(["(warm)"], timeout or 0.0)
        self.returncode = status
        return b"".join(out).decode("utf-8", "replace"), b"".join(err).decode("utf-8", "replace")

    def _wait_status(self, deadline: Optional[float]) -> Optional[int]:
        line, _ = _read_line(self.conn, self._buffer, deadline)
        if line is None:
            return None
        self.conn.close()
        return int(json.loads(line)["status"])

    def kill(self) -> None:
        _kill_group(self.pid)


def _read_line(conn: socket.socket, buffer: bytes, deadline: Optional[float] = None) -> "tuple":
    """``(the server's next JSON line, what came after it)``; ``(None, buffer)`` past ``deadline``.

    Raises:
      ConnectionError: the server closed the connection first.
    """
    while b"\n" not in buffer:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return None, buffer
        ready, _, _ = select.select([conn], [], [], left)
        if not ready:
            return None, buffer
        chunk = conn.recv(4096)
        if not chunk:
            raise ConnectionError("the warm-start server closed the connection")
        buffer += chunk
    line, rest = buffer.split(b"\n", 1)
    return line, rest


def _drain(fd: int, sink: List[bytes]) -> None:
    with open(fd, "rb", buffering=0, closefd=True) as f:
        while True:
            chunk = f.read(1 << 16)
            if not chunk:
                return
            sink.append(chunk)


def _feed(fd: int, text: str) -> None:
    with open(fd, "wb", closefd=True) as f:
        try:
            f.write(text.encode("utf-8"))
        except BrokenPipeError:
            pass


def start(cmd: Sequence[str], env: Dict[str, str], cwd: str, input: Optional[str],
          server_env: Dict[str, str]) -> Optional[WarmProcess]:
    """Starts ``cmd`` as a fork of the warm server (started with ``server_env`` on first use), or returns
    None: run it cold."""
    if os.environ.get(DISABLE_ENV, "1") == "0" or env.get(DISABLE_ENV, "1") == "0" or not routable(cmd):
        return None
    server = _get_server(env, server_env)
    if os.environ.get("LMKIT_TEST_WARM_LOG"):
        with open(os.environ["LMKIT_TEST_WARM_LOG"], "a", encoding="utf-8") as f:
            why = "warm" if server else "cold (the server is not up, or an import-time variable differs)"
            f.write(f"{why}: {' '.join(cmd[:4])}\n")
    if server is None:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(server.path)
    except OSError:
        conn.close()
        return None
    stdin_r, stdin_w = os.pipe() if input is not None else (os.open(os.devnull, os.O_RDONLY), None)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        pid, rest = _request(conn, {"argv": list(cmd[1:]), "env": dict(env), "cwd": os.path.abspath(cwd),
                                    "new_session": True}, [stdin_r, out_w, err_w])
    finally:
        for fd in (stdin_r, out_w, err_w):
            os.close(fd)
    if pid is None:
        conn.close()
        for fd in (stdin_w, out_r, err_r):
            if fd is not None:
                os.close(fd)
        return None
    return WarmProcess(conn, pid, (stdin_w, out_r, err_r), input, rest)


def _request(conn: socket.socket, request: dict, fds: List[int]) -> "tuple[Optional[int], bytes]":
    """Sends ``request`` with ``fds`` (the command's stdin, stdout, stderr): ``(the command's pid, what the
    server sent after it)``, or ``(None, b"")`` when it is to run cold."""
    body = json.dumps(request).encode("utf-8")
    message = _HEADER.pack(len(body)) + body
    try:
        sent = socket.send_fds(conn, [message], fds)
        conn.sendall(message[sent:])
        line, rest = _read_line(conn, b"")
        reply = json.loads(line)
        return (int(reply["pid"]), rest) if "pid" in reply else (None, b"")
    except (OSError, ValueError, ConnectionError):
        return None, b""


# --------------------------------------------------------------------------
# Ranks under a launcher: the stand-in
# --------------------------------------------------------------------------
def rank_env(env: Dict[str, str], server_env: Dict[str, str]) -> Dict[str, str]:
    """``env`` for a command whose Open MPI ranks (under ``mpirun``, started by the command or by one of
    its children) are to start warm (module docstring). The ranks themselves check ``LMKIT_TEST_WARM``.
    An environment without ``PYTHONPATH`` (a user's shell, as ``tests/test_wheel.py`` sets up) stays as it is."""
    if os.environ.get(DISABLE_ENV, "1") == "0" or "PYTHONPATH" not in env:
        return env
    server = _running_server(server_env)
    if server is None:
        return env
    env = dict(env)
    env[SOCKET_ENV], env[PYTHON_ENV] = server.path, sys.executable
    env["PYTHONPATH"] = os.pathsep.join([SITE, *[p for p in env["PYTHONPATH"].split(os.pathsep) if p]])
    return env


def become_rank() -> None:
    """In a Python that a launcher started (``tests/warm_site/sitecustomize.py``): when it is an Open MPI
    rank that can start warm, has the server fork its command, stands in for it until it ends, and
    leaves as it did (never returns). Returns at once otherwise: the rank runs cold."""
    path = os.environ.get(SOCKET_ENV)
    if (not path or "OMPI_COMM_WORLD_RANK" not in os.environ or os.environ.get(DISABLE_ENV, "1") == "0"
            or os.environ.get(PYTHON_ENV) != sys.executable):
        return
    cmd = [sys.executable, *sys.orig_argv[1:]]
    if not routable(cmd):
        return
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        conn.close()
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)  # until they can be passed on
    pid, rest = _request(conn, {"argv": cmd[1:], "env": dict(os.environ), "cwd": os.getcwd(),
                                "new_session": True, "namespaces": namespaces()}, [0, 1, 2])
    if os.environ.get("LMKIT_TEST_WARM_LOG"):
        with open(os.environ["LMKIT_TEST_WARM_LOG"], "a", encoding="utf-8") as f:
            f.write(f"{'warm' if pid else 'cold'} rank: {' '.join(cmd[:4])}\n")
    if pid is None:
        conn.close()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
        return
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, _frame: _kill_group(pid, signum))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    try:
        line, _ = _read_line(conn, rest)
        status = int(json.loads(line)["status"])
    except (OSError, ValueError, ConnectionError):
        _kill_group(pid)
        status = 1
    if status < 0:  # died of a signal: so does the stand-in
        if -status != signal.SIGKILL:
            signal.signal(-status, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [-status])
        os.kill(os.getpid(), -status)
        status = 128 - status
    os._exit(status)


if __name__ == "__main__":
    serve(sys.argv[1])
