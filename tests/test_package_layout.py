"""The package's layout: no import hook and no 0.2 module names, no folder named like a build output, setup.py a
shim."""
import os
import subprocess
import sys

from tests.helpers import ROOT, subprocess_env

FINDERS_PROBE = """
import importlib, sys
before = list(sys.meta_path)
for name in MODULES:
    importlib.import_module(name)
print(sys.meta_path == before)
print(sorted({(f if isinstance(f, type) else type(f)).__module__ for f in sys.meta_path}))
"""


def _finders(modules, *python_flags, path_first=""):
    """``import`` of ``modules`` in a fresh Python: [whether sys.meta_path is unchanged, the finders' modules]."""
    code = f"import sys\nsys.path.insert(0, {path_first!r})\n" if path_first else ""
    code += f"MODULES = {list(modules)!r}\n" + FINDERS_PROBE
    out = subprocess.run([sys.executable, *python_flags, "-c", code], cwd=ROOT, env=subprocess_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.splitlines()


def test_importing_lmkit_puts_no_finder_on_the_import_system():
    """No import hook: ``import lmkit`` leaves ``sys.meta_path`` as it found it (issue 55, item 2)."""
    assert _finders(["lmkit", "lmkit.core.fileio", "lmkit.config", "lmkit.data", "lmkit.distributed"])[0] == "True"
    # Without site (no .pth files: an editable install's finder, setuptools' distutils hack), only Python's
    # own finders are there (lmkit and lmkit.core import nothing outside the standard library).
    assert _finders(["lmkit", "lmkit.core.fileio", "lmkit.core.registry"], "-I", "-S", path_first=ROOT) == \
        ["True", "['_frozen_importlib', '_frozen_importlib_external']"]


OLD_NAMES_PROBE = """
import importlib
for old in ("lmkit.modules", "lmkit.modules.llama", "lmkit.hf", "lmkit.generation", "lmkit.dist"):
    try:
        importlib.import_module(old)
        print(old, "imported")
    except ModuleNotFoundError as exc:
        print(old, type(exc).__name__, exc.name)
try:
    from lmkit import modules
    print("lmkit.modules attribute")
except ImportError as exc:
    print("from lmkit import modules:", type(exc).__name__)
"""


def test_0_2_module_names_are_gone_with_a_plain_module_not_found_error():
    """0.3 dropped the 0.2 names (CHANGELOG.md has the table of new homes): importing one is Python's own
    ModuleNotFoundError, no warning and no forwarding module."""
    out = subprocess.run([sys.executable, "-W", "error", "-c", OLD_NAMES_PROBE], cwd=ROOT, env=subprocess_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == [
        "lmkit.modules ModuleNotFoundError lmkit.modules",
        "lmkit.modules.llama ModuleNotFoundError lmkit.modules",
        "lmkit.hf ModuleNotFoundError lmkit.hf",
        "lmkit.generation ModuleNotFoundError lmkit.generation",
        "lmkit.dist ModuleNotFoundError lmkit.dist",
        "from lmkit import modules: ImportError",
    ]


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
