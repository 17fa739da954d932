"""The cell's value, found where the notebook's parse says it starts and computed by the ranks'
runtime without a syntax tree, is what IPython would show; tracebacks point where IPython's do."""

from __future__ import annotations

import re
import subprocess
import sys
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
    value = run_source(source, _compiled(source), new_namespace())
    assert re.findall(r"^Out\[\d+\]: (.*)$", shown.stdout, re.MULTILINE) == ([] if value is None else [repr(value)])


# each cell, and the line of its `/ w` as the notebook numbers it (the %%mpirun_remote line is 1)
@pytest.mark.parametrize(("source", "line"), [("é = 1\nw = 0; é / w", 3), ("w = 0\n(1 +\n 1 / w)", 4), ("w = 0\n1 / w", 3)])
def test_a_failing_value_is_shown_where_python_shows_it_in_the_whole_cell(source, line):
    with pytest.raises(ZeroDivisionError) as caught:
        run_source(source, _compiled(source), new_namespace())
    with pytest.raises(ZeroDivisionError) as whole:  # the cell compiled at once, as Python numbers it
        exec(compile(cell.numbered(source), cell.FILENAME, "exec"), {})  # noqa: S102
    # from the cell's frame on: the line as the notebook numbers it, quoted, and marked under the failing part
    assert _cell_frames(caught.value) == _cell_frames(whole.value)
    assert _cell_frames(caught.value)[0].startswith(f'  File "{cell.FILENAME}", line {line},')


def _cell_frames(exc: BaseException) -> list[str]:
    lines = "".join(traceback.format_exception(exc)).splitlines()
    return lines[next(i for i, line in enumerate(lines) if cell.FILENAME in line):]


def _compiled(source: str) -> str:
    """The cell as the notebook sends it to the ranks."""
    return cell.compiled(source, analyze(source).value_at)


def test_a_rank_runs_the_code_the_notebook_compiled_and_compiles_nothing():
    """CPython's compile() first readies every type of the ast module, milliseconds each rank would
    spend before its cell: the notebook compiles the cell, and the ranks run the code it sent."""
    script = ("import sys\n"
              "from mpi_magic.shared import cell\n"
              "from mpi_magic.notebook.capture import analyze\n"
              "from mpi_magic.runtime.rank import new_namespace, run_source\n"
              "source = 'x = 6\\nx * 7'\n"
              "code = cell.compiled(source, analyze(source).value_at)\n"
              "compiled = []\n"
              "sys.addaudithook(lambda event, args: compiled.append(args[1]) if event == 'compile' else None)\n"
              "print(run_source(source, code, new_namespace()), compiled)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60).stdout
    assert out == "42 []\n"
