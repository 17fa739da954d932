"""The cell's value, found where the notebook's parse says it starts and computed by the ranks'
runtime without a syntax tree, is what IPython would show; tracebacks point where IPython's do."""

from __future__ import annotations

import re
import traceback

import pytest
from IPython.utils.capture import capture_output

from mpi_magic.shared import cell
from mpi_magic.notebook.capture import analyze
from mpi_magic.runtime.rank import new_namespace, run_source

CELLS = [
    "x = 1; x + 1",
    "y = 2\n(y *\n 3)",
    "a, b = 1, 'two'\na, b",
    "é = 'ünï'; len(é)  # a comment after the value",
    "z = 5\nz if z > 3 else -z",
    "def f():\n    return 'f'\n\n\nf()\n",
    "import asyncio\nawait asyncio.sleep(0, result=7)",
    "values = [1, 2]; *values, 3",
    "x = 1\nx;",
    "x = 1",
    "",
]


@pytest.mark.parametrize("source", CELLS)
def test_the_ranks_compute_the_value_ipython_shows(ip, source):
    with capture_output() as shown:
        ip.run_cell(source, store_history=True)  # IPython reads a trailing ';' from its history
    value = run_source(source, new_namespace(), _value_at(source))
    assert re.findall(r"^Out\[\d+\]: (.*)$", shown.stdout, re.MULTILINE) == ([] if value is None else [repr(value)])


# each cell, and the line of its `/ w` as the notebook numbers it (the %%mpirun_remote line is 1)
@pytest.mark.parametrize(("source", "line"), [("é = 1\nw = 0; é / w", 3), ("w = 0\n(1 +\n 1 / w)", 4), ("w = 0\n1 / w", 3)])
def test_a_failing_value_is_shown_where_python_shows_it_in_the_whole_cell(source, line):
    with pytest.raises(ZeroDivisionError) as caught:
        run_source(source, new_namespace(), _value_at(source))
    with pytest.raises(ZeroDivisionError) as whole:  # the cell compiled at once, as Python numbers it
        exec(compile(cell.numbered(source), cell.FILENAME, "exec"), {})  # noqa: S102
    # from the cell's frame on: the line as the notebook numbers it, quoted, and marked under the failing part
    assert _cell_frames(caught.value) == _cell_frames(whole.value)
    assert _cell_frames(caught.value)[0].startswith(f'  File "{cell.FILENAME}", line {line},')


def _cell_frames(exc: BaseException) -> list[str]:
    lines = "".join(traceback.format_exception(exc)).splitlines()
    return lines[next(i for i, line in enumerate(lines) if cell.FILENAME in line):]


def _value_at(source: str) -> list[int] | None:
    """As the payload carries it: JSON turns the position into a list."""
    position = analyze(source).value_at
    return None if position is None else list(position)
