"""The package's layout: lmkit.distributed under its own name, the old lmkit.dist a shim, setup.py a shim."""
import os
import subprocess
import sys

from tests.helpers import ROOT, subprocess_env

PROBE = """
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import lmkit.dist as old
    import lmkit.dist.env as old_env
    from lmkit.dist.base import Backend as OldBackend
import lmkit.distributed as new, lmkit.distributed.env as new_env
from lmkit.distributed.base import Backend
print(old is new, old_env is new_env, OldBackend is Backend, new_env.__spec__.name)
print([(w.category.__name__, str(w.message)) for w in caught])
"""


def test_the_old_package_name_is_the_new_package_with_a_warning():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=subprocess_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    same, warned = out.stdout.strip().splitlines()
    assert same == "True True True lmkit.distributed.env"  # one module, one backend state
    assert warned.count("DeprecationWarning") == 1 and "import lmkit.distributed instead" in warned


def test_the_shim_holds_no_code_and_no_folder_is_named_like_a_build_output():
    assert os.listdir(os.path.join(ROOT, "lmkit", "dist")) in (["__init__.py"], ["__init__.py", "__pycache__"])
    for top in ("lmkit", "tests"):
        for folder, dirs, _ in os.walk(os.path.join(ROOT, top)):
            named = {"build", "dist"} & set(dirs)
            if folder == os.path.join(ROOT, "lmkit"):
                named -= {"dist"}  # the deprecation shim, for one release
            assert not named, (folder, named)


def test_setup_py_is_a_shim_over_pyproject():
    import lmkit
    out = subprocess.run([sys.executable, "setup.py", "--name", "--version"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == ["lmkit", lmkit.__version__]
