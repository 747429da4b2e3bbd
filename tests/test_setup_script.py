"""scripts/setup.sh picks the CPU or the GPU set-up (LMKIT_SETUP_PLAN: prints, installs nothing)."""
import os
import subprocess

import pytest

from tests.helpers import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "setup.sh")


def _plan(tmp_path, mode="main", nvidia_smi=None, **env):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if nvidia_smi is not None:  # a fake nvidia-smi first on PATH
        fake = bin_dir / "nvidia-smi"
        fake.write_text(f"#!/bin/sh\n{nvidia_smi}\n")
        fake.chmod(0o755)
    environ = {k: v for k, v in os.environ.items() if k != "LMKIT_GPU"}
    environ.update(PATH=f"{bin_dir}:{environ['PATH']}", LMKIT_SETUP_PLAN="1", **env)
    return subprocess.run(["bash", SCRIPT, mode], capture_output=True, text=True, env=environ,
                          timeout=60)


def test_a_listed_gpu_gives_cuda_tensorflow_and_horovod_with_nccl(tmp_path):
    res = _plan(tmp_path, nvidia_smi="echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)'")
    assert res.returncode == 0, res.stderr
    assert "GPU set-up: GPU 0: NVIDIA H100" in res.stdout
    assert "plan: tensorflow[and-cuda]==2.18.1" in res.stdout
    assert "+ NCCL (HOROVOD_GPU_OPERATIONS=NCCL)" in res.stdout
    native = _plan(tmp_path, "native", nvidia_smi="echo 'GPU 0: NVIDIA H100 (UUID: GPU-1)'")
    assert "plan: tensorflow[and-cuda]==2.21.*" in native.stdout and "horovod" not in native.stdout


@pytest.mark.parametrize("nvidia_smi", [
    "echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver'; exit 9",
    "exit 0",  # a driver without devices
])
def test_no_listed_gpu_keeps_the_cpu_set_up(tmp_path, nvidia_smi):
    res = _plan(tmp_path, nvidia_smi=nvidia_smi)
    assert res.returncode == 0, res.stderr
    assert "CPU set-up" in res.stdout and "plan: tensorflow-cpu==2.18.1" in res.stdout
    assert "NCCL" not in res.stdout


def test_lmkit_gpu_overrides_the_detection(tmp_path):
    forced_cpu = _plan(tmp_path, nvidia_smi="echo 'GPU 0: NVIDIA A100'", LMKIT_GPU="0")
    assert "plan: tensorflow-cpu==2.18.1" in forced_cpu.stdout
    forced_gpu = _plan(tmp_path, LMKIT_GPU="1")
    assert "plan: tensorflow[and-cuda]==2.18.1" in forced_gpu.stdout
    bad = _plan(tmp_path, LMKIT_GPU="yes")
    assert bad.returncode != 0 and "LMKIT_GPU='yes' is not 1, 0 or auto" in bad.stderr


def test_both_environments_are_planned_side_by_side(tmp_path):
    """make test: `setup.sh both` runs the main and the newest-TensorFlow set-up at once."""
    res = _plan(tmp_path, "both", nvidia_smi="exit 0")
    assert res.returncode == 0, res.stderr
    assert "plan: tensorflow-cpu==2.18.1" in res.stdout and "plan: tensorflow-cpu==2.21.*" in res.stdout
    assert "plan: horovod==0.28.1" in res.stdout
    bad = _plan(tmp_path, "everything")
    assert bad.returncode == 2 and 'unknown mode "everything": main, native or both' in bad.stderr


def test_the_newest_tensorflow_environment_runs_on_a_second_python(tmp_path):
    """CI runs the suite on two Pythons: the native environment takes LMKIT_NATIVE_PYTHON (default 3.10)."""
    import glob
    import sys

    other = [p for p in glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[02]*/bin/python3.1[02]"))
             if not p.endswith(f"python{sys.version_info[0]}.{sys.version_info[1]}")]
    if not other:
        pytest.skip("no second Python 3.10/3.12 on this machine (pyenv)")
    version = subprocess.run([other[0], "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    res = _plan(tmp_path, "native", nvidia_smi="exit 0", LMKIT_NATIVE_PYTHON=other[0])
    assert res.returncode == 0, res.stderr
    assert f"plan: Python {version} ({other[0]})" in res.stdout
    main = _plan(tmp_path, "main", nvidia_smi="exit 0", LMKIT_NATIVE_PYTHON=other[0])
    assert f"plan: Python {version}" not in main.stdout  # the main environment keeps its own
    bad = _plan(tmp_path, "native", nvidia_smi="exit 0", LMKIT_NATIVE_PYTHON=sys.executable + "-missing")
    assert bad.returncode != 0
