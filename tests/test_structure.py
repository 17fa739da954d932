"""The package's shape: modules import each other in one direction only."""

from __future__ import annotations

import ast
import os

import mpi_magic

ROOT = os.path.dirname(mpi_magic.__file__)


def _module_name(path: str) -> str:
    relative = os.path.relpath(path, os.path.dirname(ROOT))[:-len(".py")].split(os.sep)
    return ".".join(relative[:-1] if relative[-1] == "__init__" else relative)


def _run_time_imports(path: str) -> set[str]:
    """The package's modules that ``path`` imports when it is imported (not in functions,
    not under ``if TYPE_CHECKING``), with the packages that importing them loads first."""
    name = _module_name(path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(nodes) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")
                base = base[:len(base) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                found.add(target)
                found.update(f"{target}.{alias.name}" for alias in node.names)

    with open(path, encoding="utf-8") as f:
        visit(ast.parse(f.read()).body)
    modules = set()
    for target in found:
        parts = target.split(".")
        modules.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {m for m in modules if m.startswith("mpi_magic") and m != name and m in _MODULES}


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
