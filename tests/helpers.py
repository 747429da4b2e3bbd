"""Helpers for tests that launch lmkit scripts as subprocesses."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def have_horovod() -> bool:
    try:
        import horovod.tensorflow  # noqa: F401
        return True
    except Exception:
        return False


def subprocess_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    for key in list(env):  # never inherit a launcher's identity from an outer mpirun
        if key.startswith(("OMPI_COMM_WORLD", "PMIX_", "PMI_", "HOROVOD_")):
            del env[key]
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("LMKIT_INTRA_OP_THREADS", "1")
    if extra:
        env.update(extra)
    return env


def mpirun_cmd(np_: int, args: Sequence[str], env_keys: Sequence[str] = ()) -> List[str]:
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun not found: run `make setup`"
    cmd = [mpirun, "-np", str(np_), "--oversubscribe", "--bind-to", "none"]
    for key in ("PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL", "LMKIT_INTRA_OP_THREADS", *env_keys):
        cmd += ["-x", key]
    return cmd + [sys.executable, *args]


def run(cmd: Sequence[str], timeout: float, env: Optional[Dict[str, str]] = None,
        cwd: str = ROOT, input: Optional[str] = None) -> subprocess.CompletedProcess:
    """Runs ``cmd`` with a hard timeout; a hang kills the whole process group.

    Raises:
      subprocess.TimeoutExpired: the command (and its children) ran longer
        than ``timeout`` seconds; they have been killed.
    """
    proc = subprocess.Popen(list(cmd), cwd=cwd, env=env or subprocess_env(), text=True,
                            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)
