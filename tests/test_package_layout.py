"""The package's layout: old module names still import (with their new home named), setup.py a shim."""
import os
import subprocess
import sys

from tests.helpers import ROOT, subprocess_env

PROBE = """
import importlib, json, warnings
from lmkit.core.moved import MODULES
out = {}
for old, new in sorted(MODULES.items()):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    target = importlib.import_module(new)
    public = [n for n in getattr(target, "__all__", dir(target)) if not n.startswith("_")][:3]
    out[old] = [[str(w.message) for w in caught if w.category is DeprecationWarning],
                all(getattr(module, n) is getattr(target, n) for n in public)]
try:
    import lmkit.dist
    out["lmkit.dist"] = "imported"
except ImportError as exc:
    out["lmkit.dist"] = str(exc)
print(json.dumps(out))
"""


def test_old_module_names_still_import_and_name_their_new_home():
    """Code written for lmkit 0.2 (lmkit.modules.llama, lmkit.hf, ...) runs, warned once per old name."""
    import json

    from lmkit.core.moved import MODULES

    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=subprocess_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    for old, new in MODULES.items():
        warned, same = found[old]
        assert any(f"{old} is now {new}" in w for w in warned), (old, warned)
        assert same, old  # the very objects of the new module
    assert found["lmkit.dist"] == ("lmkit.dist was removed in lmkit 0.3; use lmkit.distributed "
                                   "(`from lmkit import distributed as dist`)")


NAMES_PROBE = """
import importlib, json, warnings
warnings.simplefilter("ignore", DeprecationWarning)
from lmkit.core.moved import GONE_NAMES, NAMES
out = {"names": [], "gone": {}}
for old, new in sorted(NAMES.items()):
    module, _, name = old.rpartition(".")
    target, _, attr = new.partition(":")
    if getattr(importlib.import_module(module), name) is not getattr(importlib.import_module(target), attr):
        out["names"].append(old)
for old, how in sorted(GONE_NAMES.items()):
    module, _, name = old.rpartition(".")
    try:
        exec(f"from {module} import {name}")
        out["gone"][old] = "imported"
    except ImportError as exc:
        out["gone"][old] = str(exc)
print(json.dumps(out))
"""


def test_names_that_left_their_module_resolve_and_removed_ones_say_what_to_write():
    import json

    from lmkit.core.moved import GONE_NAMES

    out = subprocess.run([sys.executable, "-c", NAMES_PROBE], cwd=ROOT, env=subprocess_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["names"] == []  # every old name is the very object of its new home
    for old, how in GONE_NAMES.items():
        assert found["gone"][old] == f"{old} was removed in lmkit 0.3; write {how}"


def test_no_folder_is_named_like_a_build_output():
    for top in ("lmkit", "tests"):
        for folder, dirs, _ in os.walk(os.path.join(ROOT, top)):
            assert not {"build", "dist"} & set(dirs), folder


def test_setup_py_is_a_shim_over_pyproject():
    import lmkit
    out = subprocess.run([sys.executable, "setup.py", "--name", "--version"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == ["lmkit", lmkit.__version__]
