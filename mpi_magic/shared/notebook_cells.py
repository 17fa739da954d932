"""Code from the notebook's own cells, read on the ranks as the notebook reads it.

cloudpickle names the code of every function it pickles by value ``<dynamic-code>``, so a
function, method, lambda or closure defined in an earlier cell would run on a rank with no
file, no source line and no cell. Pickled for the ranks, each of its code objects (nested ones
too, which is what reaches closures, methods and lambdas alike) keeps the file name IPython
compiled its cell under (``<ipython-input-3-...>``, a kernel's ``/tmp/ipykernel_.../....py``) and
carries the cell's name as IPython's tracebacks give it ("Cell In[3]") and the cell's text. This
is done while pickling because after unpickling nothing tells which code came from which cell.

Unpickled (on a rank), the cell's text goes where tracebacks read lines (``linecache``) and its
name where the rank's tracebacks and warnings say where they are ("Cell In[3], line 4");
pickled (in the notebook), the name is learnt for the roll-call's stacks. As the code keeps the
notebook's file name, ``%mpirun_debug`` reads its frames as ``%debug`` does. A rank imports this
module only for a cell that carries such code, or that fails.
"""

from __future__ import annotations

import linecache
import re
import types

_NAMES: dict[str, str] = {}  # a cell's file name -> the cell's name, as IPython's tracebacks give it
_TRACEBACK_FRAME = re.compile(r'^(\s*)File "(.*)", line (\d+)', re.MULTILINE)
_STAND_IN = "<dynamic-code>"  # the file name of the code pickled inside the wrapper (cloudpickle's own)


def name_of(filename: str) -> str | None:
    """The notebook's name of the cell ``filename`` is ("Cell In[3]"); None for other code."""
    return _NAMES.get(filename)


def reduce_code(code: types.CodeType, cell_name: str, cell_text: str) -> tuple:
    """How a code object of the notebook's cell ``cell_name`` (whose text is ``cell_text``) is
    pickled: rebuilt by ``rebuild`` under its own file name. The code inside is a copy under
    another name, so the pickler reduces it as any code (its nested code objects as this)."""
    _NAMES[code.co_filename] = cell_name
    return rebuild, (code.replace(co_filename=_STAND_IN), code.co_filename, cell_name, cell_text)


def rebuild(code: types.CodeType, filename: str, cell_name: str, cell_text: str) -> types.CodeType:
    """The code as the notebook compiled it (unpickling calls this), its cell's lines and name remembered."""
    if filename not in _NAMES or filename not in linecache.cache:
        lines = cell_text.splitlines(True)
        linecache.cache[filename] = (len(cell_text), None, lines, filename)  # no mtime: never checked, never dropped
        _NAMES[filename] = cell_name
        _name_cells_in_warnings()
    return code.replace(co_filename=filename)


def renamed(traceback_text: str) -> str:
    """A traceback with each frame of a notebook cell read as IPython reads it: ``Cell In[3], line 4, in
    step`` where Python writes ``File "<ipython-input-3-...>", line 4, in step``."""
    def rename(frame: re.Match) -> str:
        name = _NAMES.get(frame.group(2))
        return frame.group(0) if name is None else f"{frame.group(1)}{name}, line {frame.group(3)}"

    return _TRACEBACK_FRAME.sub(rename, traceback_text) if _NAMES else traceback_text


def _name_cells_in_warnings() -> None:
    """A warning raised in a notebook cell's code says "Cell In[3]:4: UserWarning: ..." over the
    line's source, where Python would write the cell's file name."""
    import warnings

    if getattr(warnings.formatwarning, "__module__", None) == __name__:
        return
    formatwarning = warnings.formatwarning

    def named(message, category, filename, lineno, line=None):
        name = _NAMES.get(filename)
        if name is not None:
            line = linecache.getline(filename, lineno) if line is None else line
            filename = name
        return formatwarning(message, category, filename, lineno, line)

    warnings.formatwarning = named
