"""How the cell's lines are numbered in tracebacks and syntax errors: as the user sees the
cell, where the ``%%mpirun_remote`` line is line 1 and the code starts on line 2."""

from __future__ import annotations

import _ast  # the ast module's node classes alone: its helpers would cost every rank milliseconds
import linecache

FILENAME = "<mpirun_remote cell>"
MAGIC_LINES = 1  # the %%mpirun_remote line above the code


def numbered(source: str) -> str:
    """The code with the magic line's place kept, so line numbers count as in the notebook."""
    return "\n" * MAGIC_LINES + source


def parse(source: str) -> _ast.Module:
    """The cell's syntax tree, as ``ast.parse`` gives it, numbered as the notebook shows the cell."""
    return compile(numbered(source), FILENAME, "exec", flags=_ast.PyCF_ONLY_AST)  # type: ignore[return-value]


def remember(source: str) -> None:
    """Let tracebacks quote the cell's lines."""
    text = numbered(source)
    linecache.cache[FILENAME] = (len(text), None, text.splitlines(True), FILENAME)
