"""tests/warm.py: a command started warm by helpers.run behaves as the same command started cold."""
import os
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
