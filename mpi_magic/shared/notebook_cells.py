"""Code from the notebook's own cells, carried to the ranks and back as the notebook reads it.

cloudpickle names the code of every function it pickles by value ``<dynamic-code>``, so a
function, method, lambda or closure defined in a cell would arrive with no file, no source line
and no cell. Pickled here, each of its code objects (nested ones too, which is what reaches
closures, methods and lambdas alike) keeps the file name it was compiled under (``cell``: the
one IPython gave its cell) and carries the cell's name as IPython's tracebacks give it ("Cell
In[3]") and the cell's text. This is done while pickling because after unpickling nothing tells
which code came from which cell. It is done both ways: the notebook pickles the values a cell
reads so (``capture``), and a rank the values it sends back and a failed cell's locals, so a
function a cell defined and brought back reads as its cell's when it is sent again.

Unpickled, the cell's text goes where tracebacks read lines (``linecache``) and its name where
tracebacks, warnings and the roll-call's stacks say where they are (``cell.name_cell``); as the
code keeps its file name, ``%mpirun_debug`` reads its frames as ``%debug`` does. A rank imports
this module only for a cell that carries such code, that sends back what only cloudpickle can
pickle, or that fails.
"""

from __future__ import annotations

import functools
import linecache
import re
import types

from . import cell

TYPE_CHECKING = False  # typing is not imported on the ranks: it costs each one milliseconds
if TYPE_CHECKING:
    import pickle
    from typing import Callable

_TRACEBACK_FRAME = re.compile(r'^(\s*)File "(.*)", line (\d+)', re.MULTILINE)
_STAND_IN = "<dynamic-code>"  # the file name of the code pickled inside the wrapper (cloudpickle's own)


class Cells:
    """For one pickler: the notebook's cells its code objects come from (``name_of`` names them), each
    looked up once, so that a cell's text is pickled once however many of its functions go."""

    def __init__(self, name_of: Callable[[str], str | None] = cell.name_of):
        self._name_of = name_of
        self._found: dict[str, tuple[str, str] | None] = {}  # file name -> (its cell's name, its text)

    def reduction(self, obj: object) -> tuple | None:
        """What ``reducer_override`` returns for ``obj`` where it is code from one of the notebook's cells
        (``reduce_code``); None for anything else."""
        if not isinstance(obj, types.CodeType):
            return None
        filename = obj.co_filename
        if filename not in self._found:
            name = self._name_of(filename)
            self._found[filename] = None if name is None else (name, "".join(linecache.getlines(filename)))
        found = self._found[filename]
        return None if found is None else reduce_code(obj, *found)


@functools.cache
def pickler() -> type[pickle.Pickler]:
    """cloudpickle's Pickler, each code object from the notebook's cells this process knows pickled with
    its cell (``Cells``)."""
    import cloudpickle

    class CellsPickler(cloudpickle.Pickler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._cells = Cells()

        def reducer_override(self, obj):
            return self._cells.reduction(obj) or super().reducer_override(obj)

    return CellsPickler


def reduce_code(code: types.CodeType, cell_name: str, cell_text: str) -> tuple:
    """How a code object of the notebook's cell ``cell_name`` (whose text is ``cell_text``) is
    pickled: rebuilt by ``rebuild`` under its own file name. The code inside is a copy under
    another name, so the pickler reduces it as any code (its nested code objects as this)."""
    cell.name_cell(code.co_filename, cell_name)
    return rebuild, (code.replace(co_filename=_STAND_IN), code.co_filename, cell_name, cell_text)


def rebuild(code: types.CodeType, filename: str, cell_name: str, cell_text: str) -> types.CodeType:
    """The code as the notebook compiled it (unpickling calls this), its cell's lines and name remembered."""
    if filename not in linecache.cache:
        cell.keep_lines(linecache, filename, cell_text)
    cell.name_cell(filename, cell_name)
    return code.replace(co_filename=filename)


def renamed(traceback_text: str) -> str:
    """A traceback with each frame of a notebook cell read as IPython reads it: ``Cell In[3], line 4, in
    step`` where Python writes ``File "<ipython-input-3-...>", line 4, in step``."""
    def rename(frame: re.Match) -> str:
        name = cell.name_of(frame.group(2))
        return frame.group(0) if name is None else f"{frame.group(1)}{name}, line {frame.group(3)}"

    return _TRACEBACK_FRAME.sub(rename, traceback_text)
