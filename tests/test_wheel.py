"""The built wheel, installed like a user would: a fresh venv, the newest TensorFlow, no Horovod.

``pip wheel`` builds ``lmkit-<version>-py3-none-any.whl`` from the checkout;
a new virtual environment gets it with the newest ``tensorflow-cpu`` (pip's
cache keeps that to a local copy); then, from an empty folder, the installed
``lmkit`` command prints its version, trains a few steps on a generated
corpus on 2 workers with the native backend, and generates.
"""
import json
import os
import subprocess
import sys
import zipfile

import pytest

from tests.cli.test_cli_text import write_corpus
from tests.helpers import ROOT, run

pytestmark = pytest.mark.wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("dist")
    res = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
               "-w", str(out), ROOT], timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    (name,) = [n for n in os.listdir(out) if n.endswith(".whl")]
    return str(out / name)


def test_the_wheel_holds_the_package_and_its_configs_only(wheel):
    from lmkit import __version__
    assert os.path.basename(wheel) == f"lmkit-{__version__}-py3-none-any.whl"
    names = zipfile.ZipFile(wheel).namelist()
    assert "lmkit/cli/train.py" in names and "lmkit/configs/config_small.py" in names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "examples/", "scripts/"))]
    entry = [n for n in names if n.endswith("entry_points.txt")]
    assert entry and "lmkit = lmkit.cli:main" in zipfile.ZipFile(wheel).read(entry[0]).decode()


def test_fresh_venv_with_the_newest_tensorflow_trains_and_generates(wheel, tmp_path):
    # A user's shell: no checkout on PYTHONPATH (pip would take it for an installed lmkit).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM", "PMI", "HOROVOD_"))}
    env.pop("PYTHONPATH", None)
    env.update(TF_CPP_MIN_LOG_LEVEL="2", LMKIT_INTRA_OP_THREADS="1")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=env)
    py, lmkit = str(venv / "bin" / "python"), str(venv / "bin" / "lmkit")
    res = run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{wheel}[cpu]"],
              timeout=900, env=env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    check = run([py, "-m", "pip", "check"], timeout=120, env=env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "horovod" not in run([py, "-m", "pip", "list"], timeout=120, env=env).stdout.lower()
    empty = tmp_path / "empty"
    empty.mkdir()
    version = run([lmkit, "--version"], timeout=60, env=env, cwd=str(empty))
    assert version.returncode == 0 and version.stdout.startswith("lmkit "), version.stderr
    files = write_corpus(str(tmp_path / "corpus"), lines=120)
    train = run([py, "-m", "lmkit.launch", "--hosts", "127.0.0.1", "--num_workers", "2", "--", lmkit,
                 "train", "--config", "config_small", "--backend", "native", "--train_file", files["train"],
                 "--tokenizer", "char", "--model_dir", "model", "--max_steps", "3",
                 "--set", "hidden_size=16", "--set", "batch_size=4", "--set", "num_steps=8"],
                timeout=600, env=env, cwd=str(empty))
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-4000:]
    results = json.loads((empty / "model" / "results.json").read_text())
    assert results["world_size"] == 2 and results["global_step"] == 3
    gen = run([lmkit, "generate", "--model_dir", "model", "--prompt", "the old", "--max_length", "20",
               "--seed", "0"], timeout=300, env=env, cwd=str(empty))
    assert gen.returncode == 0, gen.stderr[-3000:]
    assert gen.stdout.startswith("the old")  # one sample: its text alone
