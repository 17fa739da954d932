"""The package's shape: its parts import each other in one direction only, every name says one
thing, and what ranks import at start-up stays light."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import mpi_magic

ROOT = os.path.dirname(mpi_magic.__file__)


def _module_name(path: str) -> str:
    relative = os.path.relpath(path, os.path.dirname(ROOT))[:-len(".py")].split(os.sep)
    return ".".join(relative[:-1] if relative[-1] == "__init__" else relative)


def _package_of(path: str) -> str:
    name = _module_name(path)
    return name if path.endswith("__init__.py") else name.rpartition(".")[0]


def _from_target(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from ... import`` names, resolved from ``package``."""
    base = package.split(".")
    base = base[:len(base) - node.level + 1] if node.level else []
    return ".".join(base + ([node.module] if node.module else []))


def _run_time_imports(path: str) -> set[str]:
    """The package's modules that ``path`` imports when it runs, whether on import or in a function
    (not under ``if TYPE_CHECKING``: names for the type checker only), with the packages that
    importing them loads first."""
    name, package = _module_name(path), _package_of(path)
    found: set[str] = set()

    def visit(nodes) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                target = _from_target(node, package)
                found.add(target)
                found.update(f"{target}.{alias.name}" for alias in node.names)
            else:
                visit(ast.iter_child_nodes(node))

    with open(path, encoding="utf-8") as f:
        visit(ast.parse(f.read()).body)
    modules = set()
    for target in found:
        parts = target.split(".")
        modules.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    own_packages = {name.rsplit(".", i)[0] for i in range(1, name.count(".") + 1)}  # (loaded before it, always)
    return {m for m in modules if m.startswith("mpi_magic") and m != name and m in _MODULES} - own_packages


_MODULES = {_module_name(os.path.join(folder, f)): os.path.join(folder, f)
            for folder, _, files in os.walk(ROOT) for f in files if f.endswith(".py")}


def test_no_module_imports_itself_back():
    graph = {name: _run_time_imports(path) - {"mpi_magic"} for name, path in _MODULES.items()}
    cycles = []

    def walk(name: str, trail: list[str], done: set[str]) -> None:
        for other in sorted(graph[name]):
            if other in trail:
                cycles.append(trail[trail.index(other):] + [other])
            elif other not in done:
                walk(other, trail + [other], done)
        done.add(name)

    done: set[str] = set()
    for name in sorted(graph):
        if name not in done:
            walk(name, [name], done)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


# What each part of the package may import (besides itself and the package's light __init__):
# only parts below it. shared/ is read by the ranks, the notebook and the backends alike.
MAY_IMPORT = {
    "errors": set(),
    "shared": {"errors"},
    "options": {"errors", "shared"},
    "runtime": {"errors", "shared"},
    "view": {"errors", "shared"},
    "backends": {"errors", "shared", "options"},
    "testing": {"errors", "shared", "options", "runtime", "backends"},  # (the scripted backend plays the rank side)
    "notebook": {"errors", "shared", "options", "backends", "view"},
    "magic": {"errors", "shared", "options", "backends", "view", "notebook"},
    "submit": {"errors", "shared", "options", "backends", "view", "notebook"},
}


def _part(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def _every_import(path: str) -> set[str]:
    """The package's modules that ``path`` imports anywhere: at import time, in a function, or
    for the type checker; a dependency is one wherever it is written."""
    name, package = _module_name(path), _package_of(path)
    found = set()
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(node, package)
            found.update(f"{target}.{alias.name}" if f"{target}.{alias.name}" in _MODULES else target
                         for alias in node.names)
    return {m for m in found if m.startswith("mpi_magic.") and m != name}


def test_every_part_of_the_package_has_its_place_in_the_order():
    parts = {_part(name) for name in _MODULES} - {""}
    assert parts == set(MAY_IMPORT), f"parts without a row in MAY_IMPORT, or rows without a part: {parts ^ set(MAY_IMPORT)}"


def test_imports_only_run_down():
    upward = []
    for name, path in sorted(_MODULES.items()):
        part = _part(name)
        if not part:
            continue  # the package's __init__ names its public homes
        for target in sorted(_every_import(path)):
            other = _part(target)
            if other != part and other not in MAY_IMPORT[part]:
                upward.append(f"{name} imports {target}")
    assert not upward, "imports against the order of MAY_IMPORT:\n" + "\n".join(upward)


def test_shared_needs_only_the_standard_library():
    """Every rank imports shared/ at start-up: nothing beyond the standard library may come with it."""
    shared = sorted(name for name in _MODULES if _part(name) == "shared")
    code = ("import sys\nbefore = set(sys.modules)\n" + "".join(f"import {name}\n" for name in shared) +
            "print(sorted({m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names)"
            " - {'mpi_magic'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "[]", f"shared/ pulls in {out.strip()}"


def _one_role_in_each_backend(modules: list[str]) -> bool:
    """The same role in sibling backend folders has the same name (``backends/<name>/declaration.py``)."""
    folders = [m.rpartition(".")[0] for m in modules]
    return all(f.count(".") == 2 and f.startswith("mpi_magic.backends.") for f in folders) and \
        len(set(folders)) == len(folders)


def test_at_most_ten_modules_at_the_top_and_every_name_once():
    top = [name for name in _MODULES if name.count(".") == 1 and not os.path.isdir(os.path.join(ROOT, _part(name)))]
    assert len(top) <= 10, top
    leaves: dict[str, list[str]] = {}
    classes: dict[str, list[str]] = {}
    for name, path in _MODULES.items():
        if not path.endswith("__init__.py"):
            leaves.setdefault(name.rpartition(".")[2], []).append(name)
        with open(path, encoding="utf-8") as f:
            for node in ast.parse(f.read()).body:
                if isinstance(node, ast.ClassDef):
                    classes.setdefault(node.name, []).append(name)
    assert {k: v for k, v in leaves.items() if len(v) > 1 and not _one_role_in_each_backend(v)} == {}, \
        "modules of one name"
    assert {k: v for k, v in classes.items() if len(v) > 1} == {}, "classes of one name"


def test_every_mpi_magic_variable_is_named_in_envvars_alone():
    """A variable spelled in two places drifts apart; each side imports it from shared/envvars.py."""
    spelled = []
    for name, path in sorted(_MODULES.items()):
        if name == "mpi_magic.shared.envvars":
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for match in re.finditer(r"(?:^|['\"])(MPI_MAGIC_[A-Z0-9_]+)(?:$|['\"])", node.value):
                    spelled.append(f"{name}:{node.lineno} {match.group(1)}")
            elif isinstance(node, ast.keyword) and node.arg and node.arg.startswith("MPI_MAGIC_"):
                spelled.append(f"{name}:{node.value.lineno} {node.arg}")
    assert not spelled, "spell these as mpi_magic.shared.envvars constants:\n" + "\n".join(spelled)


def _code_strings(path: str):
    """(line, text) of every string in the module's code, docstrings left out (they may explain a backend)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


# Where a backend may be named: every backend's folder, the registry, the test doubles and emulators of
# particular backends, the default backend's name (options.DEFAULT_BACKEND), what a rank reads of
# the SageMaker instance it runs on (rankinfo: where its checkpoints go), and the package's public
# names, which say where each is defined (a backend's own kind of BackendSetupError among them).
_MAY_NAME_A_BACKEND = ("mpi_magic.backends.registry", "mpi_magic.testing", "mpi_magic.shared.rankinfo")
_PUBLIC_HOMES = "mpi_magic"  # (the package's __init__: it names every public name's module)


def test_no_backend_or_option_of_ones_own_is_spelled_outside_its_folder_and_the_registry():
    """A backend's name (as a word), or a flag of its own options, in a string of the code elsewhere."""
    from mpi_magic.backends import registry

    folders = tuple(f"mpi_magic.backends.{backend.name}" for backend in registry.declared())
    spelled = []
    for name, path in sorted(_MODULES.items()):
        if name == _PUBLIC_HOMES or name.startswith(_MAY_NAME_A_BACKEND) or \
                any(name == f or name.startswith(f + ".") for f in folders):
            continue
        for backend in registry.declared():
            flags = [rf"(?<![\w-]){re.escape(flag)}(?![\w-])" for option in backend.options for flag in option.flags]
            # (``local`` is a word of its own: only the name alone counts)
            named = re.compile("|".join(flags + ([] if backend.one_host else [rf"\b{re.escape(backend.name)}\b"])),
                               re.IGNORECASE) if flags or not backend.one_host else None
            for line, text in _code_strings(path):
                if (text == backend.name or (named and named.search(text))) and \
                        (name, text) != ("mpi_magic.options", registry.DEFAULT_BACKEND):
                    spelled.append(f"{name}:{line} {text[:80]!r}")
    assert not spelled, "declare these in the backend's folder (declaration.py) instead:\n" + "\n".join(spelled)
