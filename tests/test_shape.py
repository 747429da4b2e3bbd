"""The shape of the code, checked: the layering of lmkit's packages, no import cycles, short files and functions,
few parameters, and tests that mirror the package file by file (read from the source with ``ast``: nothing is
imported)."""
from __future__ import annotations

import ast
import os
from typing import Dict, List, Set, Tuple

from tests.helpers import ROOT

#: A package may import (at module level or inside a function) the packages of its rank or lower. A higher
#: package is named only by a registry's "module:Class" string, which lmkit.core.registry imports on use.
RANKS = {"core": 0, "configs": 0, "config": 1, "distributed": 2, "data": 3, "layers": 4, "optim": 4,
         "hub": 5, "models": 6, "train": 7, "decoding": 8, "serve": 9, "cli": 9}
#: The entry points and the lazy public API may name anything.
ENTRY_POINTS = {"lmkit", "lmkit.__main__", "lmkit.launch"}
#: Test folders that are not a package of lmkit: backends' suites, the examples, benchmark helpers, scripts.
TEST_EXTRAS = {"bench", "examples", "scripts", "distributed/mpi", "distributed/native", "distributed/netns",
               "distributed/reliability"}
#: The longest function (its docstring included) and the longest file of lmkit/.
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 500
#: The most parameters a public function or constructor takes; a model's or a layer's constructor (a class of
#: lmkit/models or lmkit/layers) takes its architecture's settings and may take more.
MAX_PARAMETERS = 10
MODULE_CONSTRUCTOR_PACKAGES = ("models", "layers")
#: The modules of lmkit with no ``tests/<folder>/test_<module>.py`` of their own, and why.
NO_TEST_FILE = {
    "__main__.py": "`python -m lmkit`: two lines handing over to lmkit.cli (tests/cli/test_cli_units.py runs it)",
    "launch.py": "`python -m lmkit.launch`: hands over to lmkit.distributed.launch (tests/distributed/test_launch.py)",
    "core/errors.py": "exception classes, no logic",
    "data/errors.py": "exception classes, no logic",
    "distributed/base.py": "the backends' interface: tests/distributed/test_distributed.py checks every backend "
                           "implements it",
    "data/hf_form.py": "lmkit's own tokenizers as Hugging Face files: tests/hub/test_export.py (needs transformers)",
    **{f"data/formats/{name}.py": "one reader per format behind one interface: tests/data/test_formats.py runs "
                                  "the same records through every format"
       for name in ("arrow", "base", "compressed", "datasets_folder", "jsonl", "parquet", "plain")},
    "models/llama/blocks.py": "Llama's layer and decoder: tests/models/llama/test_model.py",
    "models/bart/model.py": "the transformer encoder-decoder: tests/models/test_seq2seq_models.py",
    "models/rnn/seq2seq.py": "the RNN encoder-decoder: tests/models/test_seq2seq_models.py",
}


def _modules() -> Dict[str, str]:
    found = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "lmkit")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                found[module[:-len(".__init__")] if module.endswith(".__init__") else module] = path
    return found


def _imports(path: str, known: Dict[str, str]) -> List[Tuple[str, bool]]:
    """``(module imported, at module level)`` for every ``lmkit`` import of the file."""
    out: List[Tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.ImportFrom) and not child.level and (child.module or "").startswith("lmkit"):
                for alias in child.names:
                    full = f"{child.module}.{alias.name}"
                    out.append((full if full in known else child.module, not inner))
            elif isinstance(child, ast.Import):
                out.extend((a.name, not inner) for a in child.names if a.name.startswith("lmkit"))
            visit(child, inner)

    visit(ast.parse(open(path, encoding="utf-8").read()), False)
    return out


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_package_imports_only_its_own_rank_or_lower():
    known = _modules()
    assert {_package(m) for m in known} - {""} <= set(RANKS) | {"__main__", "launch"}, "a package without a rank"
    upward = []
    for module, path in sorted(known.items()):
        if module in ENTRY_POINTS:
            continue
        for target, _ in _imports(path, known):
            # (the package itself, ``from lmkit import __version__``, imports nothing but lmkit.core)
            if _package(target) and _package(target) != _package(module) \
                    and RANKS.get(_package(target), 99) > RANKS[_package(module)]:
                upward.append(f"{module} -> {target}")
    assert upward == [], "\n".join(upward)


def test_no_import_cycles_even_through_imports_inside_functions():
    known = _modules()
    graph: Dict[str, Set[str]] = {m: {t for t, _ in _imports(p, known) if t in known and t != m}
                                  for m, p in known.items()}
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    cycles: List[List[str]] = []

    def strong(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            strong(module)
    assert cycles == []


def test_no_function_of_lmkit_runs_past_60_lines():
    long = []
    for module, path in sorted(_modules().items()):
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{module}.{node.name}: {lines} lines")
    assert long == [], "\n".join(long)


def test_no_file_of_lmkit_runs_past_500_lines():
    long = [f"{m}: {n} lines" for m, p in sorted(_modules().items())
            if (n := len(open(p, encoding="utf-8").read().splitlines())) > MAX_FILE_LINES]
    assert long == [], "\n".join(long)


def _parameters(node: ast.AST) -> int:
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    return len(names) - (1 if names and names[0] in ("self", "cls") else 0)


def test_public_functions_and_constructors_take_at_most_10_parameters():
    many = []
    for module, path in sorted(_modules().items()):
        tree = ast.parse(open(path, encoding="utf-8").read())
        for cls in [None, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))]:
            body = tree.body if cls is None else cls.body
            for node in body:
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                constructor = cls is not None and node.name == "__init__"
                if node.name.startswith("_") and not constructor:
                    continue
                if constructor and (cls.name.startswith("_") or _package(module) in MODULE_CONSTRUCTOR_PACKAGES):
                    continue
                if _parameters(node) > MAX_PARAMETERS:
                    many.append(f"{module}.{'' if cls is None else cls.name + '.'}{node.name}: "
                                f"{_parameters(node)} parameters")
    assert many == [], "\n".join(many)


def test_the_tests_mirror_the_package():
    """Every test folder is a package of lmkit (or one of the suites that are not), and every package of
    lmkit with code has its test folder or test file."""
    tests = os.path.join(ROOT, "tests")
    folders = {os.path.relpath(f, tests) for f, dirs, files in os.walk(tests)
               if any(n.startswith("test_") and n.endswith(".py") for n in files)} - {"."}
    strays = sorted(f for f in folders if f not in TEST_EXTRAS
                    and not os.path.isdir(os.path.join(ROOT, "lmkit", f)))
    assert strays == []
    packages = {os.path.relpath(f, os.path.join(ROOT, "lmkit")) for f, _, files in os.walk(os.path.join(ROOT, "lmkit"))
                if any(n.endswith(".py") and n != "__init__.py" for n in files)} - {".", "configs"}
    untested = sorted(p for p in packages if p not in folders
                      and not os.path.isfile(os.path.join(tests, os.path.dirname(p), f"test_{os.path.basename(p)}.py")))
    assert untested == []


def test_every_module_has_its_test_file_or_a_reason():
    """``lmkit/<folder>/<module>.py`` is tested in ``tests/<folder>/test_<module>.py``, or named in NO_TEST_FILE."""
    lmkit = os.path.join(ROOT, "lmkit")
    missing, needless = [], []
    for folder, _, files in os.walk(lmkit):
        rel = os.path.relpath(folder, lmkit)
        if rel.split(os.sep)[0] in ("configs", "__pycache__"):
            continue
        for name in sorted(n for n in files if n.endswith(".py") and n != "__init__.py"):
            module = os.path.normpath(os.path.join(rel, name))
            tested = os.path.isfile(os.path.join(ROOT, "tests", rel, f"test_{name}"))
            if not tested and module not in NO_TEST_FILE:
                missing.append(module)
            elif tested and module in NO_TEST_FILE:
                needless.append(module)
    assert missing == [], "modules without tests/<folder>/test_<module>.py:\n" + "\n".join(missing)
    assert needless == [], "NO_TEST_FILE names modules that have their test file:\n" + "\n".join(needless)
    assert all(os.path.isfile(os.path.join(lmkit, m)) for m in NO_TEST_FILE), "NO_TEST_FILE names a module gone"
