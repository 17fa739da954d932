"""How the cell's lines are numbered in tracebacks and syntax errors: as the user sees the
cell, where the ``%%mpirun_remote`` line is line 1 and the code starts on line 2; where the
cell's value (a final expression, shown as IPython shows it) starts; and what the code of the
notebook's cells is called, wherever it runs.

The notebook parses and compiles the cell; the ranks run the code it sent (``compiled``) and
never build a syntax tree, nor compile: CPython's compile() readies every type of the ast module
before it looks at its source, which would cost every rank milliseconds at start-up.

Each cell's code is compiled under a file name of its own: the one IPython gives the cell's code
(``<ipython-input-5-...>``; a kernel's ``/tmp/ipykernel_.../....py``), so that a function a
session's cell defined still reads as that cell's after later cells ran. Where that code runs,
the notebook's name for the cell ("Cell In[5]", ``name_cell``) is what tracebacks, warnings
(``name_cells_in_warnings``) and the roll-call call it."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ast
    from types import CodeType

FILENAME = "<mpirun_remote cell>"  # a cell's file name where no notebook names it (run outside IPython)
MAGIC_LINES = 1  # the %%mpirun_remote line above the code
_NAMES: dict[str, str] = {}  # the file name of a notebook cell's code -> the notebook's name of that cell
_UNGIVEN: dict[str, str] = {}  # a cell's file name -> its lines, not yet given to linecache (``give_lines``)


def numbered(source: str) -> str:
    """The code with the magic line's place kept, so line numbers count as in the notebook."""
    return "\n" * MAGIC_LINES + source


def parse(source: str, filename: str = FILENAME) -> ast.Module:
    """The cell's syntax tree, numbered as the notebook shows the cell (the notebook's side only)."""
    import ast

    return ast.parse(numbered(source), filename, "exec")


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


def compiled(source: str, value_at: tuple[int, int] | list[int] | None, filename: str = FILENAME) -> str:
    """The cell compiled as ``filename`` for the ranks, as text for the payload's header: its
    statements, and the final expression whose value the cell shows, which starts at ``value_at``
    (``split_value``; None: no value), each run as it comes by the ranks (``code_of``); top-level
    ``await`` compiles, as in a notebook (the notebook's side only)."""
    import ast
    import marshal

    if value_at is None:
        statements, expression = numbered(source), None
    else:
        statements, expression = split_value(source, (value_at[0], value_at[1]))
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    code = (compile(statements, filename, "exec", flags=flags, dont_inherit=True),
            None if expression is None else compile(expression, filename, "eval", flags=flags, dont_inherit=True))
    return marshal.dumps(code).hex()


def code_of(text: str) -> tuple[CodeType, CodeType | None]:
    """The statements and the value's expression that ``compiled`` made (where the payload has checked
    that the notebook's Python runs: code objects differ between Python versions)."""
    import marshal

    return marshal.loads(bytes.fromhex(text))


def remember(source: str, filename: str = FILENAME) -> None:
    """Keep the cell's lines for tracebacks and warnings to quote, once ``give_lines`` has put them
    where they read them."""
    _UNGIVEN[filename] = numbered(source)


def give_lines(linecache) -> None:
    """Put the lines of every cell remembered so far in ``linecache`` (that module: importing it costs
    a rank milliseconds, so the rank calls this once something has imported it)."""
    for filename, text in _UNGIVEN.items():
        keep_lines(linecache, filename, text)
    _UNGIVEN.clear()


def keep_lines(linecache, filename: str, text: str) -> None:
    """``text`` as the lines of ``filename`` where tracebacks, warnings and debuggers read them
    (``linecache``, that module); with no mtime, they are never checked against a file, nor dropped."""
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)


def name_cell(filename: str, name: str) -> None:
    """Call the code compiled as ``filename`` by the notebook's name of its cell ("Cell In[5]")."""
    _NAMES[filename] = name


def name_of(filename: str) -> str | None:
    """The notebook's name of the cell whose code is compiled as ``filename``; None for other code."""
    return _NAMES.get(filename)


def name_cells_in_warnings(warnings) -> None:
    """A warning raised in a notebook cell's code says "Cell In[3]:4: UserWarning: ..." over the
    line's source, where Python would write the cell's file name (``warnings``: that module)."""
    if getattr(warnings.formatwarning, "__module__", None) == __name__:
        return
    formatwarning = warnings.formatwarning

    def named(message, category, filename, lineno, line=None):
        name = _NAMES.get(filename)
        if name is not None:
            if line is None:
                import linecache

                line = linecache.getline(filename, lineno)
            filename = name
        return formatwarning(message, category, filename, lineno, line)

    warnings.formatwarning = named
