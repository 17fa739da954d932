"""A failed rank's traceback with its frames' locals, for ``%mpirun_debug``.

Only a rank whose cell raised writes one, into its results (``rank-N.debug``), and reports its
SHA-256 with the failure. Each local is kept as a value where it pickles within ``VALUE_LIMIT``
bytes (all of them within ``TOTAL_LIMIT``, in ``TIME_LIMIT`` seconds), and always as its repr (at
most ``REPR_LIMIT`` characters); a module as its name. Each value is pickled on its own, so one
that does not load in the notebook costs only itself. The notebook's side
(``notebook/debugger.py``) rebuilds real frames from it for IPython's debugger.
"""

from __future__ import annotations

import os
import pickle
import reprlib
import time
import types

FORMAT = 1
VALUE_LIMIT = 1 << 20  # pickled bytes of one local brought back as a value; larger ones come as their repr
TOTAL_LIMIT = 32 << 20  # pickled bytes of all locals together; past it, reprs only
REPR_LIMIT = 2000  # characters of a repr
SOURCE_LIMIT = 400  # lines of a library function's source brought along, for ``ll`` in the notebook
FRAMES_LIMIT = 60  # innermost frames kept
TIME_LIMIT = 5.0  # seconds spent on values; those left come as "not captured"

VALUE, MODULE, REPR = "value", "module", "repr"


def _short_repr() -> reprlib.Repr:
    """Reprs that stop early: a list of ten million items shows its first few, quickly."""
    short = reprlib.Repr()
    short.maxlevel, short.maxstring, short.maxother = 4, REPR_LIMIT, REPR_LIMIT
    short.maxlist = short.maxtuple = short.maxset = short.maxfrozenset = short.maxdeque = short.maxdict = 50
    return short


_SHORT = _short_repr()


class _TooLarge(Exception):
    pass


class _Bounded:
    """A file that refuses to grow past ``limit`` bytes, so a huge value stops pickling early."""

    def __init__(self, limit: int):
        self.parts: list[bytes] = []
        self.size, self.limit = 0, limit

    def write(self, data) -> int:
        self.size += len(data)
        if self.size > self.limit:
            raise _TooLarge
        self.parts.append(bytes(data))
        return len(data)


def capture(exc: BaseException, cell_file: str) -> dict:
    """The record of how ``exc`` ended the cell: its frames from the cell's first one on
    (innermost last), each with its locals, and the exception's type and message."""
    tb = exc.__traceback__
    first = tb
    while first is not None and first.tb_frame.f_code.co_filename != cell_file:
        first = first.tb_next
    tb = first or tb
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    budget = {"bytes": TOTAL_LIMIT, "until": time.monotonic() + TIME_LIMIT}
    frames = [_frame(tb, cell_file, budget) for tb in entries[-FRAMES_LIMIT:]]
    return {"format": FORMAT, "error_type": _safe(lambda: type(exc).__name__, "BaseException"),
            "message": _safe(lambda: str(exc), "")[:REPR_LIMIT], "frames": frames,
            "left_out": max(0, len(entries) - FRAMES_LIMIT)}


def write(path: str, record: dict) -> str:
    """Write the record; its SHA-256, which the rank reports with its failure so that the
    notebook unpickles only the file this rank wrote."""
    from hashlib import sha256  # only on failure

    data = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    partial = f"{path}.part"
    with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
        f.write(data)
    os.replace(partial, path)
    return sha256(data).hexdigest()


def read(path: str, digest: str) -> dict:
    """The record at ``path``, refused (``ValueError``) unless its SHA-256 is ``digest``."""
    from hashlib import sha256

    with open(path, "rb") as f:
        data = f.read()
    if sha256(data).hexdigest() != digest:
        raise ValueError("it is not the file the rank wrote (its checksum differs), so it is not loaded")
    record = pickle.loads(data)  # noqa: S301 - checked against the digest the rank reported
    if record.get("format") != FORMAT:
        raise ValueError("it was written by another version of mpi_magic")
    return record


def _frame(tb: types.TracebackType, cell_file: str, budget: dict) -> dict:
    frame, code = tb.tb_frame, tb.tb_frame.f_code
    in_cell = code.co_filename == cell_file
    return {"filename": code.co_filename, "name": code.co_name, "lineno": tb.tb_lineno,
            "firstlineno": code.co_firstlineno, "in_cell": in_cell,
            "source": None if in_cell else _source(code),
            "locals": {name: _value(value, budget) for name, value in list(frame.f_locals.items())
                       if not (name.startswith("__") and name.endswith("__")) and name != "get_ipython"}}


def _source(code: types.CodeType) -> tuple[int, list[str]] | None:
    """(first line, lines) of the function, for a notebook where its file may not exist."""
    try:
        import linecache

        lines = linecache.getlines(code.co_filename)
    except Exception:  # noqa: BLE001 - the source is a convenience
        return None
    if not lines:
        return None
    start = max(code.co_firstlineno, 1)
    return start, lines[start - 1:start - 1 + SOURCE_LIMIT]


def _value(value, budget: dict) -> tuple[str, object, str]:
    """(kind, what comes back, repr): the value pickled (``VALUE``), a module's name (``MODULE``),
    or nothing but the repr (``REPR``), which comes in every case for a value that does not load."""
    kind = _safe(lambda: type(value).__name__, "object")
    if time.monotonic() > budget["until"]:
        return REPR, None, f"<{kind}: not brought back, the time for locals ran out>"
    text = _safe(lambda: _SHORT.repr(value), f"<{kind} whose repr failed>")
    text = text if len(text) <= REPR_LIMIT else text[:REPR_LIMIT] + "..."
    if isinstance(value, types.ModuleType):
        return MODULE, value.__name__, text
    nbytes = getattr(value, "nbytes", None)
    limit = min(VALUE_LIMIT, budget["bytes"])
    if isinstance(nbytes, int) and nbytes > limit:  # an array: known too large without pickling it
        return REPR, None, text
    data = _pickled(value, limit)
    if data is None:
        return REPR, None, text
    budget["bytes"] -= len(data)
    return VALUE, data, text


def _pickled(value, limit: int) -> bytes | None:
    """Plain pickle where it can, cloudpickle where it must (functions the cell defined); None
    when neither can within ``limit`` bytes."""
    picklers = [pickle.Pickler]
    try:
        import cloudpickle

        picklers.append(cloudpickle.CloudPickler)
    except ImportError:
        pass
    for pickler in picklers:
        out = _Bounded(limit)
        try:
            pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
        except _TooLarge:
            return None
        except Exception:  # noqa: BLE001 - this value comes as its repr
            continue
        return b"".join(out.parts)
    return None


def _safe(describe, fallback: str) -> str:
    try:
        text = describe()
        return text if isinstance(text, str) else fallback
    except BaseException:  # noqa: BLE001 - the cell's objects may misbehave
        return fallback
