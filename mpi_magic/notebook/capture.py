"""Which notebook names a cell needs, and packing exactly those for the ranks.

A name is taken from the notebook when the cell may read it before defining it (``x += 1``
reads ``x``; ``x = 1; print(x)`` does not). Names the cell never reads are left alone, even
when they could not be pickled. Every taken name is pickled here, before anything starts,
so a value that cannot travel is reported with its type, the reason and what to do.
"""

from __future__ import annotations

import ast
import functools
import io
import pickle
import socket
import symtable
import sys
import threading
import tokenize
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, cast

import cloudpickle

from ..shared import cell, notebook_cells, payload
from ..errors import CaptureError

# Names IPython puts in every namespace; the ranks have their own (or no use for them).
_SHELL_NAMES = frozenset(
    {"In", "Out", "get_ipython", "exit", "quit", "_ih", "_oh", "_dh", "__builtins__", "__builtin__",
     "__name__", "__doc__", "__spec__", "__loader__", "__package__"}
)
LARGE_VALUE_BYTES = 16 * 2**20


@dataclass
class CellCode:
    """A cell's Python source and what it reads and assigns at the top level."""

    source: str
    reads: set[str]
    assigns: list[str]
    value_at: tuple[int, int] | None  # where the final expression whose value the cell shows starts (cell.value_position)
    filename: str = cell.FILENAME  # what the cell's code is compiled under, here and on the ranks


def analyze(source: str, filename: str = cell.FILENAME) -> CellCode:
    """Parse ``source`` (already transformed from IPython syntax) into a ``CellCode``, to be compiled
    as ``filename``.

    Raises ``SyntaxError`` as Python would, so the cell fails before anything starts.
    """
    tree = cell.parse(source, filename)
    compile(tree, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)  # `break` outside a loop...
    reads: set[str] = set()
    late: set[str] = set()
    _scan(tree.body, set(), reads, late)
    reads |= late  # a function may run before the cell defines what it reads
    value_at = None if _ends_with_semicolon(source) else cell.value_position(source, tree)
    return CellCode(source, reads, _assigned(source), value_at, filename)


def _ends_with_semicolon(source: str) -> bool:
    """True when the last token that is not a comment is ';' (IPython then shows no output)."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
              if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER,
                                tokenize.INDENT, tokenize.DEDENT)]
    return bool(tokens) and tokens[-1].string == ";"


def _assigned(source: str) -> list[str]:
    """Names the cell binds in the notebook namespace, in order of first appearance."""
    table = symtable.symtable(source, "<cell>", "exec")
    names = [s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()]
    seen = set(names)
    stack = list(table.get_children())
    while stack:  # `global x` inside a function body assigns the notebook's x
        child = stack.pop()
        stack.extend(child.get_children())
        for s in child.get_symbols():
            if s.is_declared_global() and s.is_assigned() and s.get_name() not in seen:
                seen.add(s.get_name())
                names.append(s.get_name())
    return names


def _reads_now(node: ast.AST) -> set[str]:
    """Module-level names ``node`` reads, including inside its lambdas and comprehensions."""
    table = symtable.symtable(ast.unparse(node), "<cell>", "exec")
    names = {s.get_name() for s in table.get_symbols() if s.is_referenced()}
    return names | _reads_later(table)


def _reads_later(table: symtable.SymbolTable) -> set[str]:
    """Module-level names read inside nested scopes (function bodies run later)."""
    names: set[str] = set()
    stack = list(table.get_children())
    while stack:
        child = stack.pop()
        stack.extend(child.get_children())
        # `global n; n += 1` reads n, though symtable records only the store
        names |= {s.get_name() for s in child.get_symbols()
                  if s.is_global() and (s.is_referenced() or s.is_declared_global() and s.is_assigned())}
    return names


def _targets(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _walrus_targets(node: ast.AST) -> set[str]:
    return {n.target.id for n in ast.walk(node) if isinstance(n, ast.NamedExpr)}


def _captures(pattern: ast.AST) -> set[str]:
    """Names a match pattern binds."""
    names = set()
    for n in ast.walk(pattern):
        if isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name:
            names.add(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            names.add(n.rest)
    return names


def _scan(body: list[ast.stmt], defined: set[str], reads: set[str], late: set[str]) -> None:
    """Walk statements in order: collect reads not preceded by a definite definition."""
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            table = symtable.symtable(ast.unparse(stmt), "<cell>", "exec")
            reads |= {s.get_name() for s in table.get_symbols() if s.is_referenced()} - defined
            if isinstance(stmt, ast.ClassDef):  # a class body runs now
                reads |= _reads_later(table) - defined
            else:
                late |= _reads_later(table) - defined
            defined.add(stmt.name)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in stmt.names if a.name != "*"}
        elif isinstance(stmt, ast.Delete):
            reads |= _reads_now(stmt) - defined
            deleted = {t.id for t in stmt.targets if isinstance(t, ast.Name)}
            reads |= deleted - defined  # `del a` needs an `a` to delete
            defined -= deleted
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            reads |= _reads_now(stmt) - defined
            defined |= _walrus_targets(stmt)
            if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
                reads |= {stmt.target.id} - defined  # symtable counts `x += 1` as a store only
            if not isinstance(stmt, ast.AnnAssign) or stmt.value is not None:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                defined |= {t.id for t in targets if isinstance(t, ast.Name)}
                defined |= {n.id for t in targets if isinstance(t, (ast.Tuple, ast.List)) for n in ast.walk(t)
                            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            reads |= _reads_now(stmt.iter) - defined
            _scan(stmt.body, defined | _targets(stmt.target), reads, late)
            _scan(stmt.orelse, set(defined), reads, late)
        elif isinstance(stmt, ast.While):
            reads |= _reads_now(stmt.test) - defined
            defined |= _walrus_targets(stmt.test)
            _scan(stmt.body, set(defined), reads, late)
            _scan(stmt.orelse, set(defined), reads, late)
        elif isinstance(stmt, ast.If):
            reads |= _reads_now(stmt.test) - defined
            defined |= _walrus_targets(stmt.test)
            then, otherwise = set(defined), set(defined)
            _scan(stmt.body, then, reads, late)
            _scan(stmt.orelse, otherwise, reads, late)
            defined |= then & otherwise
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                reads |= _reads_now(item.context_expr) - defined
                if item.optional_vars is not None:
                    defined |= _targets(item.optional_vars)
            _scan(stmt.body, defined, reads, late)
        elif isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            block = cast(ast.Try, stmt)  # try/except* (3.11+) has the same fields
            _scan(block.body, set(defined), reads, late)
            for handler in block.handlers:
                if handler.type is not None:
                    reads |= _reads_now(handler.type) - defined
                _scan(handler.body, defined | ({handler.name} if handler.name else set()), reads, late)
            _scan(block.orelse, set(defined), reads, late)
            _scan(block.finalbody, set(defined), reads, late)
        elif isinstance(stmt, ast.Match):
            reads |= _reads_now(stmt.subject) - defined
            for case in stmt.cases:
                for node in ast.walk(case.pattern):  # `case Color.RED` and `case Point(...)` read names
                    if isinstance(node, ast.MatchValue):
                        reads |= _reads_now(node.value) - defined
                    elif isinstance(node, ast.MatchClass):
                        reads |= _reads_now(node.cls) - defined
                inner = defined | _captures(case.pattern)
                if case.guard is not None:
                    reads |= _reads_now(case.guard) - inner
                _scan(case.body, inner, reads, late)
        else:
            reads |= _reads_now(stmt) - defined
            defined |= _walrus_targets(stmt)


@dataclass
class Captured:
    """The packed names, ready for a payload, and what the user should hear about them."""

    packed: list[payload.Packed] = field(default_factory=list)
    kinds: dict[str, str] = field(default_factory=dict)
    kept: list[str] = field(default_factory=list)  # read by the cell, but the ranks hold them already

    def large_values(self, threshold: int = LARGE_VALUE_BYTES) -> list[tuple[str, str, int]]:
        return [(p.name, self.kinds[p.name], p.size) for p in self.packed if p.size >= threshold]


def capture(code: CellCode, namespace: Mapping[str, Any],
            held: Callable[[str, Any], bool] = lambda name, value: False,
            cell_names: CellNames = lambda filename: None) -> Captured:
    """Pack every name ``code`` reads from ``namespace`` (except those ``held(name, value)``
    says the ranks have); raise ``CaptureError`` listing those that cannot travel. Code from
    the notebook's cells (``cell_names``) keeps its cell's name and lines (``notebook_cells``)."""
    captured = Captured()
    pickler = functools.partial(_Pickler, cell_names=cell_names)
    problems = []
    for name in sorted(code.reads):
        if name in _SHELL_NAMES or name not in namespace:
            continue  # builtins, or a NameError the ranks will raise as Python would
        value = namespace[name]
        if held(name, value):
            captured.kept.append(name)
            continue
        captured.kinds[name] = type(value).__name__
        try:
            captured.packed.append(_pack(name, value, pickler))
        except _CannotTravel as exc:
            problems.append(f"{name} ({_type_name(value)}) cannot be sent to the ranks: {exc}")
    if problems:
        raise CaptureError(problems[0] if len(problems) == 1 else "\n".join(["cannot start:"] + problems))
    return captured


class _CannotTravel(Exception):
    """Why a value cannot travel (completing "x cannot be sent to the ranks: ...") and the fix."""

    def __init__(self, reason: str, fix: str):
        super().__init__(f"{reason}; {fix}")
        self.reason, self.fix = reason, fix


_OS_FILES = (io.FileIO, io.BufferedReader, io.BufferedWriter, io.BufferedRandom, io.TextIOWrapper)
_FILE_FIX = "pass the file's path instead and open it inside the cell"


def _is_file(value: Any) -> bool:
    """A file of this process. The notebook's stdout and stderr are not: cloudpickle sends them
    as the rank's own, which is what a function printing to them means."""
    return isinstance(value, _OS_FILES) and value is not sys.stdout and value is not sys.stderr


def _file_reason(file: Any) -> str:
    return f"{'a closed' if file.closed else 'an open'} file of this process ({getattr(file, 'name', '?')!r})"


class _FileFound(pickle.PicklingError):
    def __init__(self, file: Any):
        super().__init__(_file_reason(file))
        self.file = file


CellNames = Callable[[str], str | None]  # a code file name -> the notebook's name of its cell ("Cell In[3]"), if one


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, refusing every file wherever it is: cloudpickle would send a copy of what is
    left to read of a file opened for reading, and refuse one opened for writing. Code compiled
    from one of the notebook's cells (``cell_names``) travels with that cell's name and text."""

    def __init__(self, file, *args, cell_names: CellNames = lambda filename: None, **kwargs):
        super().__init__(file, *args, **kwargs)
        self._cells = notebook_cells.Cells(cell_names)

    def reducer_override(self, obj):
        if _is_file(obj):
            raise _FileFound(obj)
        return self._cells.reduction(obj) or super().reducer_override(obj)


def _pack(name: str, value: Any, pickler: Callable[..., pickle.Pickler] = _Pickler) -> payload.Packed:
    try:
        return payload.pack(name, value, pickler)
    except Exception as exc:  # noqa: BLE001 - every pickling failure is reported the same way
        culprit = _culprit(value) if isinstance(value, types.FunctionType) else None
        if culprit is not None:
            raise culprit from None
        if isinstance(exc, _FileFound):
            raise _CannotTravel(f"it {'is' if exc.file is value else 'holds'} {exc}", _FILE_FIX) from None
        reason = " ".join(f"{type(exc).__name__}: {exc}".split()).rstrip(".")
        raise _CannotTravel(reason, _hint(name, value)) from None


def _culprit(function: types.FunctionType) -> _CannotTravel | None:
    """'it uses log, an open file ...' for the global or closure value that fails."""
    import inspect

    try:
        used = inspect.getclosurevars(function)
    except (TypeError, ValueError):
        return None
    for name, value in {**used.nonlocals, **used.globals}.items():
        if _is_file(value):
            return _CannotTravel(f"it uses {name}, {_file_reason(value)}", _FILE_FIX)
        try:
            _pack(name, value)
        except _CannotTravel as exc:
            return _CannotTravel(f"it uses {name} ({_type_name(value)}), which cannot be sent: {exc.reason}", exc.fix)
    return None


def _type_name(value: Any) -> str:
    cls = type(value)
    return cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _hint(name: str, value: Any) -> str:
    if isinstance(value, (types.GeneratorType, types.AsyncGeneratorType)):
        return f"turn it into a list first ({name} = list({name})) or create the generator inside the cell"
    if isinstance(value, socket.socket) or "connect" in type(value).__name__.lower():
        return "open the connection inside the cell instead, on each rank"
    if isinstance(value, (type(threading.Lock()), type(threading.RLock()))) or "lock" in type(value).__name__.lower():
        return "create the lock inside the cell instead, since a lock cannot be shared between processes"
    return "create it inside the cell instead, or stop the cell from reading it"
