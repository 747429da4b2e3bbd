"""tests/warm.py: a command started warm by helpers.run behaves as the same command started cold."""
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import warm
from tests.helpers import run, subprocess_env

PROBE = r"""
import json, os, sys, threading, atexit
late = threading.Thread(target=lambda: (__import__("time").sleep(0.2), print("thread done", flush=True)))
late.start()
atexit.register(lambda: print("atexit ran", flush=True))
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "stdin": sys.stdin.read(),
                  "env": os.environ.get("WARM_PROBE"), "getenv": os.getenv("WARM_PROBE"),
                  "session_leader": os.getsid(0) == os.getpid(), "user_path": os.environ["PYTHONPATH"],
                  "tf_loaded": "tensorflow" in sys.modules, "main": __name__}))
sys.stderr.write("to stderr\n")
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(PROBE)
    return str(path)


def _both(cmd, **kwargs):
    """``(warm, cold)`` results of the same command."""
    warm_res = run(cmd, timeout=120, **kwargs)
    env = dict(kwargs.pop("env", None) or subprocess_env())
    env[warm.DISABLE_ENV] = "0"
    cold_res = run(cmd, timeout=120, env=env, **kwargs)
    return warm_res, cold_res


def test_a_script_sees_what_a_cold_start_sees(script, tmp_path):
    import json
    user_path = str(tmp_path) + os.pathsep + subprocess_env()["PYTHONPATH"]
    env = subprocess_env({"WARM_PROBE": "yes", "PYTHONPATH": user_path})
    hot, cold = _both([sys.executable, script, "3"], env=env, cwd=str(tmp_path), input="some input")
    assert warm.routable([sys.executable, script, "3"])
    for res in (hot, cold):
        assert res.returncode == 3, res.stderr
        lines = res.stdout.splitlines()
        assert lines[1:] == ["thread done", "atexit ran"]  # threads joined, then atexit, as Python exits
        assert res.stderr == "to stderr\n"
    seen_hot, seen_cold = json.loads(hot.stdout.splitlines()[0]), json.loads(cold.stdout.splitlines()[0])
    assert seen_hot.pop("tf_loaded") and not seen_cold.pop("tf_loaded")  # the one difference, and it was warm
    assert seen_hot == seen_cold
    assert seen_hot["argv"] == [script, "3"] and seen_hot["stdin"] == "some input"
    assert seen_hot["env"] == seen_hot["getenv"] == "yes" and seen_hot["session_leader"]
    assert seen_hot["path0"] == str(tmp_path) and seen_hot["main"] == "__main__"


def test_a_module_gets_the_working_directory_first_on_its_path(tmp_path):
    (tmp_path / "probe_module.py").write_text(PROBE)
    hot, cold = _both([sys.executable, "-m", "probe_module", "0"], cwd=str(tmp_path))
    assert hot.returncode == cold.returncode == 0, hot.stderr + cold.stderr
    assert hot.stdout.replace('"tf_loaded": true', "") == cold.stdout.replace('"tf_loaded": false', "")


def test_exceptions_exits_and_signals_give_python_s_status(tmp_path):
    cases = {"raise ValueError('boom')": 1, "raise SystemExit('bye')": 1, "raise SystemExit": 0,
             "import os, signal; os.kill(os.getpid(), signal.SIGTERM)": -15, "import sys; sys.exit(300)": 300 & 0xFF}
    for number, (code, status) in enumerate(cases.items()):
        path = tmp_path / f"case{number}.py"
        path.write_text(code + "\n")
        hot, cold = _both([sys.executable, str(path)])
        assert hot.returncode == cold.returncode == status, code
        assert ("ValueError: boom" in hot.stderr) == ("ValueError: boom" in cold.stderr), code
        assert ("bye" in hot.stderr) == ("bye" in cold.stderr), code


def test_a_timeout_kills_the_command_and_its_children(tmp_path):
    marker = tmp_path / "child.pid"
    path = tmp_path / "sleeper.py"
    path.write_text(f"import subprocess, sys, time\n"
                    f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1200)'])\n"
                    f"open({str(marker)!r}, 'w').write(str(child.pid))\ntime.sleep(600)\n")
    # No clock here: had run() waited for the command's own end instead of killing it, its child
    # (sleeping twice as long) would still be alive below.
    with pytest.raises(subprocess.TimeoutExpired):
        run([sys.executable, str(path)], timeout=5)
    child = int(marker.read_text())
    deadline = time.monotonic() + 60  # SIGKILL is immediate; the wait is only for the reaping
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{child}/stat") as f:  # a zombie until its parent (the server) reaps it
            if f.read().split(")")[-1].split()[0] == "Z":
                break
        time.sleep(0.1)
    else:
        raise AssertionError("the command's child outlived the timeout")


def test_other_interpreters_launchers_and_import_time_settings_start_cold(script):
    assert not warm.routable(["mpirun", "-np", "2", sys.executable, script])
    assert not warm.routable([sys.executable, "-X", "importtime", script])
    assert not warm.routable(["/usr/bin/python3", script])
    assert warm.routable([sys.executable, "-m", "lmkit", "train"])
    # A TensorFlow setting read at import differs from the server's: a real subprocess runs it.
    res = run([sys.executable, script, "0"], timeout=120, env=subprocess_env({"TF_ENABLE_ONEDNN_OPTS": "0"}))
    assert res.returncode == 0 and '"tf_loaded": false' in res.stdout


# --------------------------------------------------------------------------
# Ranks under mpirun: a stand-in forwards to a fork of the server
# --------------------------------------------------------------------------
RANK_PROBE = r"""
import json, os, signal, sys, time
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
got = []
signal.signal(signal.SIGUSR1, lambda *_: got.append("USR1"))
print(json.dumps({"rank": rank, "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
                  "probe": os.getenv("WARM_PROBE"), "tf_loaded": "tensorflow" in sys.modules,
                  "main": __name__, "pid": os.getpid()}), flush=True)
if sys.argv[1] == "wait":  # until a signal comes, then as many seconds as the test allows
    while not got:
        time.sleep(0.05)
    print(f"rank {rank} got {got[0]}", flush=True)
    sys.exit(5)
sys.exit(int(sys.argv[1]) if rank == 1 else 0)
"""


@pytest.fixture
def rank_script(tmp_path):
    path = tmp_path / "rank_probe.py"
    path.write_text(RANK_PROBE)
    return str(path)


def _ranks_seen(output):
    """The ranks' JSON lines, by rank. Unbuffered (``PYTHONUNBUFFERED``), a rank writes its line and the
    newline apart, and mpirun may put the other rank's line between them: each object is found alone."""
    import json
    import re
    seen = [json.loads(found) for found in re.findall(r"\{[^{}]*\}", output)]
    return sorted(seen, key=lambda s: s["rank"])


def test_mpirun_ranks_start_warm_and_see_what_cold_ranks_see(rank_script, tmp_path):
    from tests.helpers import mpirun_cmd
    cmd = mpirun_cmd(2, [rank_script, "3"], env_keys=("WARM_PROBE",))
    hot, cold = _both(cmd, env=subprocess_env({"WARM_PROBE": "yes"}), cwd=str(tmp_path))
    assert hot.returncode == cold.returncode == 3, hot.stderr[-2000:] + cold.stderr[-2000:]
    seen_hot, seen_cold = _ranks_seen(hot.stdout), _ranks_seen(cold.stdout)
    assert [s.pop("tf_loaded") for s in seen_hot] == [True, True]  # both ranks started warm
    assert [s.pop("tf_loaded") for s in seen_cold] == [False, False]
    for s in seen_hot + seen_cold:
        s.pop("pid")
    assert seen_hot == seen_cold
    assert seen_hot[1]["argv"] == [rank_script, "3"] and seen_hot[1]["probe"] == "yes"
    assert seen_hot[1]["cwd"] == str(tmp_path) and seen_hot[1]["main"] == "__main__"


@pytest.mark.parametrize("warm_ranks", [True, False], ids=["warm", "cold"])
def test_mpirun_passes_a_signal_on_to_warm_ranks_as_to_cold_ones(rank_script, warm_ranks):
    """mpirun forwards SIGUSR1 to its ranks (how lmkit's wrapper asks them to stop): through a stand-in."""
    from tests.distributed.reliability.support import mpirun, run_streamed
    started, ready = [], []

    def on_line(line):
        if "{" in line:
            ready.extend(_ranks_seen(line))
            if len(ready) == 2:
                os.kill(started[0].pid, signal.SIGUSR1)

    env = {} if warm_ranks else {warm.DISABLE_ENV: "0"}
    out = run_streamed(mpirun([rank_script, "wait"]), timeout=120, env=env, on_line=on_line,
                       on_start=started.append)
    assert out.count("rank 0 got USR1") == out.count("rank 1 got USR1") == 1, out.explain()
    assert out.returncode == 5, out.explain()
    assert [s["tf_loaded"] for s in _ranks_seen(out.output)] == [warm_ranks, warm_ranks]


def _children(pid):
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().split(")")[-1].split()[1]) == pid:
                        found.append(int(name))
            except (OSError, ValueError):
                continue
    return found


def _dead(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def test_a_stand_in_killed_by_sigkill_takes_its_command_with_it(rank_script):
    """As a rank killed by SIGKILL: the stand-in cannot pass SIGKILL on, so the server kills the command."""
    from tests.distributed.reliability.support import mpirun, run_streamed
    started, commands, killed = [], [], []

    def on_line(line):
        if "{" in line:
            commands.extend(seen["pid"] for seen in _ranks_seen(line))
            if len(commands) == 2:
                stand_ins = [p for p in _children(started[0].pid) if p not in commands]
                assert len(stand_ins) == 2, stand_ins
                for pid in stand_ins:
                    os.kill(pid, signal.SIGKILL)
                killed.extend(stand_ins)

    out = run_streamed(mpirun([rank_script, "wait"]), timeout=120, on_line=on_line, on_start=started.append)
    assert killed and out.returncode != 0, out.explain()
    assert "got USR1" not in out.output
    deadline = time.monotonic() + 60  # the server polls every 50 ms; the wait is only for the reaping
    while not all(_dead(pid) for pid in commands) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_dead(pid) for pid in commands), "a warm rank outlived its stand-in"


def test_ranks_of_another_host_or_other_settings_start_cold(monkeypatch):
    user_shell = {"HOME": "/root"}  # no PYTHONPATH (tests/test_wheel.py): nothing is added to it
    assert warm.rank_env(user_shell, subprocess_env()) == {"HOME": "/root"}
    own = warm.namespaces()
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", "LD_LIBRARY_PATH": "/usr/lib:/usr/lib/"}
    assert warm.import_time_env(env) == {"TF_CPP_MIN_LOG_LEVEL": "2"}  # Open MPI's own folder: as without
    own_env = warm.import_time_env(env)
    assert warm._why_cold({"env": env, "namespaces": own}, own_env, own) == ""
    other_host = dict(own, net="net:[4026532999]")  # a rank in another network namespace (tests/distributed/netns)
    assert "namespaces" in warm._why_cold({"env": env, "namespaces": other_host}, own_env, own)
    for change in ({"LD_LIBRARY_PATH": "/opt/lib"}, {"TF_ENABLE_ONEDNN_OPTS": "0"}):
        assert "variable" in warm._why_cold({"env": dict(env, **change), "namespaces": own}, own_env, own)
    assert warm._why_cold({"env": dict(env, TF_CONFIG="{}"), "namespaces": own}, own_env, own) == ""
