"""How the cell's lines are numbered in tracebacks and syntax errors: as the user sees the
cell, where the ``%%mpirun_remote`` line is line 1 and the code starts on line 2; and where the
cell's value (a final expression, shown as IPython shows it) starts.

The notebook parses the cell; the ranks only compile it, from the position the notebook found,
and never build a syntax tree: that would cost every rank milliseconds at start-up."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ast

FILENAME = "<mpirun_remote cell>"
MAGIC_LINES = 1  # the %%mpirun_remote line above the code


def numbered(source: str) -> str:
    """The code with the magic line's place kept, so line numbers count as in the notebook."""
    return "\n" * MAGIC_LINES + source


def parse(source: str) -> ast.Module:
    """The cell's syntax tree, numbered as the notebook shows the cell (the notebook's side only)."""
    import ast

    return ast.parse(numbered(source), FILENAME, "exec")


def value_position(source: str, tree: ast.Module) -> tuple[int, int] | None:
    """(line, column) where the cell's final expression starts, as ``parse`` numbers the cell and
    counting characters; None when the cell does not end with an expression."""
    import ast

    last = tree.body[-1] if tree.body else None
    if not isinstance(last, ast.Expr):
        return None
    line = numbered(source).split("\n")[last.lineno - 1]
    return last.lineno, len(line.encode()[:last.col_offset].decode())  # the tree counts UTF-8 bytes


def split_value(source: str, position: tuple[int, int]) -> tuple[str, str]:
    """The cell's statements before its value, and the expression giving it, each numbered as the
    cell so that tracebacks name the right line and column.

    The expression is compiled alone in "eval" mode, which refuses leading spaces: one that starts
    after the first column is wrapped in parentheses whose opening one keeps its column.
    """
    text = numbered(source)
    line, column = position
    start = 0
    for _ in range(line - 1):
        start = text.index("\n", start) + 1
    start += column
    expression = text[start:] if not column else "(" + " " * (column - 1) + text[start:] + "\n)"
    return text[:start], "\n" * (line - 1) + expression


def remember(source: str) -> None:
    """Let tracebacks and warnings quote the cell's lines (linecache, where they read them, costs a
    rank milliseconds to import: the rank calls this once something has imported it)."""
    import linecache

    text = numbered(source)
    linecache.cache[FILENAME] = (len(text), None, text.splitlines(True), FILENAME)
