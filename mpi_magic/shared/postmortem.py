"""A failed rank's traceback with its frames' locals, for ``%mpirun_debug``.

Only a rank whose cell raised writes one, into its results (``rank-N.debug``), and reports its
SHA-256 with the failure. Each local is kept as a value where it pickles within ``VALUE_LIMIT``
bytes (all of them within ``TOTAL_LIMIT``), and always as its repr (at most ``REPR_LIMIT``
characters); a module as its name. Each value is pickled on its own, so one that does not load in
the notebook costs only itself; each is given ``LOCAL_TIME_LIMIT`` seconds, so one whose repr or
pickle never ends costs only itself too, and all of them ``TIME_LIMIT``. The notebook's side
(``notebook/debugger.py``) rebuilds real frames from it for IPython's debugger.
"""

from __future__ import annotations

import os
import pickle
import reprlib
import threading
import time
import types

FORMAT = 1
VALUE_LIMIT = 1 << 20  # pickled bytes of one local brought back as a value; larger ones come as their repr
TOTAL_LIMIT = 32 << 20  # pickled bytes of all locals together; past it, reprs only
REPR_LIMIT = 2000  # characters of a repr
SOURCE_LIMIT = 400  # lines of a library function's source brought along, for ``ll`` in the notebook
FRAMES_LIMIT = 60  # innermost frames kept
LOCAL_TIME_LIMIT = 1.0  # seconds for one local's repr and pickle; past them it is "unavailable"
TIME_LIMIT = 5.0  # seconds for all the locals; those not reached by then come as their type

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


class _TookTooLong(BaseException):
    """Raised into a repr or pickle that ran past its time; not an ``Exception``, so that the
    cell's ``except Exception`` and the pickler's fallback do not carry on with it."""


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
    frames = [_frame(tb, cell_file) for tb in entries[-FRAMES_LIMIT:]]
    _keep_locals(frames)
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


def _frame(tb: types.TracebackType, cell_file: str) -> dict:
    """The frame, its locals still the objects themselves (``_keep_locals`` makes them entries)."""
    frame, code = tb.tb_frame, tb.tb_frame.f_code
    return {"filename": code.co_filename, "name": code.co_name, "lineno": tb.tb_lineno,
            "firstlineno": code.co_firstlineno, "in_cell": code.co_filename == cell_file,
            "source": _source(code),
            "locals": {name: value for name, value in list(frame.f_locals.items())
                       if not (name.startswith("__") and name.endswith("__")) and name != "get_ipython"}}


def _keep_locals(frames: list[dict]) -> None:
    """Every frame's locals as their entries (``_value``), worked out one after another on a thread
    of their own while this one keeps the time, so that whatever a local's repr or pickle does,
    this returns within ``TIME_LIMIT``: one that runs past ``LOCAL_TIME_LIMIT`` is stopped (or,
    where it will not stop, left behind) and comes as unavailable, and the next go on on a fresh
    thread; one whose code raises comes at once as unavailable with what it raised; those not
    reached in ``TIME_LIMIT`` come as their type."""
    todo = [(frame["locals"], name, value) for frame in frames for name, value in frame["locals"].items()]
    budget = {"bytes": TOTAL_LIMIT}
    until = time.monotonic() + TIME_LIMIT
    slow: set[int] = set()  # ids of values that took too long: another frame holding one does not wait again
    start = 0
    while start < len(todo):
        start = _Worker(todo, start, budget, slow, until).watch()


class _Worker:
    """The thread working out the locals of ``todo`` from ``start`` on, and the watch kept on it."""

    def __init__(self, todo: list[tuple[dict, str, object]], start: int, budget: dict, slow: set[int],
                 until: float):
        self.todo, self.start, self.budget, self.slow, self.until = todo, start, budget, slow, until
        self.changed = threading.Condition()
        self.index, self.since = start, 0.0  # the local being worked out, and since when
        self.working = False  # in that local's repr or pickle
        self.shown: str | None = None  # its repr, once that is done
        self.abandoned = False

    def watch(self) -> int:
        """Wait while the locals are worked out; the index of the first one left for a fresh
        thread (``len(todo)``: none)."""
        thread = threading.Thread(target=self._work, name="mpi_magic post-mortem", daemon=True)
        if time.monotonic() < self.until:
            thread.start()
        with self.changed:
            while self.index < len(self.todo):
                now = time.monotonic()
                local_until = self.since + LOCAL_TIME_LIMIT if self.working else self.until
                if now < min(local_until, self.until):
                    self.changed.wait(min(local_until, self.until) - now)
                    continue
                self.abandoned = True  # the thread stores nothing more
                if self.working and thread.is_alive():  # still in this local's code: it cannot leave without this lock
                    _stop(thread)
                place, name, value = self.todo[self.index]
                if self.working and local_until < self.until:
                    self.slow.add(id(value))
                    place[name] = _unavailable(value, self.shown, _took_too_long())
                    return self.index + 1
                for place, name, value in self.todo[self.index:]:
                    place[name] = _unavailable(value, None, "not brought back, the time for locals ran out")
                break
        return len(self.todo)

    def _work(self) -> None:
        try:
            for index in range(self.start, len(self.todo)):
                place, name, value = self.todo[index]
                with self.changed:
                    if self.abandoned or time.monotonic() >= self.until:
                        self.changed.notify()
                        return
                    self.index, self.since, self.shown, self.working = index, time.monotonic(), None, True
                    self.changed.notify()  # the watch may be waiting on the total limit: this local has its own
                entry: tuple[str, object, str]
                try:
                    if id(value) in self.slow:
                        entry = _unavailable(value, None, _took_too_long())
                    else:
                        self.shown = _shown(value)
                        entry = _value(value, self.shown, self.budget)
                except _TookTooLong:
                    raise
                except BaseException as error:  # noqa: BLE001 - its code raised (a lazy proxy's __getattr__)
                    entry = _unavailable(value, self.shown, _raised(error))
                with self.changed:
                    if self.abandoned:
                        return
                    place[name] = entry
                    self.index, self.working = index + 1, False
                    self.changed.notify()
        except BaseException:  # noqa: BLE001 - stopped for taking too long; the watch has said so
            pass


def _stop(thread: threading.Thread) -> None:
    """Raise ``_TookTooLong`` in ``thread`` at its next Python instruction: a repr looping in Python
    ends there, unless it catches that and goes on (it is left behind, looping); one waiting in C
    (a sleep) ends when its wait does, left behind meanwhile."""
    try:
        import ctypes
    except ImportError:  # a Python built without it: the thread is only left behind
        return
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident or 0), ctypes.py_object(_TookTooLong))


def _took_too_long() -> str:
    return f"unavailable: took longer than {LOCAL_TIME_LIMIT:g} s"


def _raised(error: BaseException) -> str:
    message = _safe(lambda: str(error), "")
    return f"unavailable: it raised {_type_name(error)}" + (f": {message[:REPR_LIMIT]}" if message else "")


def _unavailable(value, shown: str | None, why: str) -> tuple[str, None, str]:
    """The entry of a local whose value is not brought back for ``why``: its repr where that was
    done (``shown``), else its type's name."""
    return REPR, None, f"<{_type_name(value)}: {why}>" if shown is None else f"{shown} (its value {why})"


def _type_name(value) -> str:
    """The name of ``value``'s type, read without running any of its code (a metaclass may define
    ``__name__``)."""
    return type.__dict__["__name__"].__get__(type(value))


def _source(code: types.CodeType) -> tuple[int, list[str]] | None:
    """(first line, lines) of the function, for a notebook where its file may not exist, or that did
    not run its cell (a job attached from another kernel)."""
    try:
        import linecache

        lines = linecache.getlines(code.co_filename)
    except Exception:  # noqa: BLE001 - the source is a convenience
        return None
    if not lines:
        return None
    start = max(code.co_firstlineno, 1)
    return start, lines[start - 1:start - 1 + SOURCE_LIMIT]


def _shown(value) -> str:
    """``value``'s repr, short."""
    text = _safe(lambda: _SHORT.repr(value), f"<{_type_name(value)} whose repr failed>")
    return text if len(text) <= REPR_LIMIT else text[:REPR_LIMIT] + "..."


def _value(value, text: str, budget: dict) -> tuple[str, object, str]:
    """(kind, what comes back, repr): the value pickled (``VALUE``), a module's name (``MODULE``),
    or nothing but the repr (``REPR``), which comes in every case for a value that does not load."""
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
    """Plain pickle where it can, cloudpickle where it must (functions the cell defined, their code
    keeping the name and lines of the notebook's cell it came from); None when neither can within
    ``limit`` bytes."""
    picklers: list[type[pickle.Pickler]] = [pickle.Pickler]
    try:
        from . import notebook_cells

        picklers.append(notebook_cells.pickler())
    except ImportError:  # no cloudpickle
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
    except _TookTooLong:
        raise
    except BaseException:  # noqa: BLE001 - the cell's objects may misbehave
        return fallback
