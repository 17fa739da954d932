"""The event wire format, as the ranks write it and the notebook reads it.

A rank writes one line per event: the job's marker (``marker(token)``, with a random token
only the job's runtime knows), then a record with the rank, a per-rank sequence number and a
timestamp: a short comma-separated record for progress (``p`` then rank, seq, time, n, total,
bar, closed, desc; desc last, so it may hold commas), compact JSON with a schema version and
a kind for the rest.

This module is the ranks' whole view of events, so it stays as light as the standard library
allows: every rank imports it at start-up, before the cell runs. The notebook's event
classes and the decoder that checks what arrives live in ``events``, built on this.
"""

from __future__ import annotations

import os
import time
from _thread import allocate_lock  # threading's Lock, without importing threading on every rank

try:
    import _json  # json's C part: the json package costs every rank milliseconds (re, and its patterns compiled)
except ImportError:  # an interpreter without it: json's own is used
    _json = None  # type: ignore[assignment]

TYPE_CHECKING = False  # typing is not imported on the ranks: it costs start-up time
if TYPE_CHECKING:
    from collections.abc import Callable

MARKER_PREFIX = "@@mpi_magic:"
SCHEMA_VERSION = 2

# The kinds of event a rank sends
STARTED, FINISHED, PROGRESS, READY, CLOSING = "started", "finished", "progress", "ready", "closing"
STACKS = "stacks"  # where the rank is, when asked through mpirun (shared/stacks.py)
METRICS = "metrics"  # numbers a cell logs (``metrics``)
RESOURCES = "resources"  # what the rank uses now (runtime/resources.py), sent when it changed


def new_token() -> str:
    """A job's secret part of the marker: output that merely looks like an event lacks it."""
    import secrets  # the notebook's side only

    return secrets.token_hex(8)


def marker(token: str) -> str:
    return f"{MARKER_PREFIX}{token}@@"


def encode(kind: str, fields: dict, token: str) -> str:
    """One wire line (without newline) of an event of ``kind`` with ``fields``; empty fields are left out."""
    if kind == PROGRESS:
        total = fields.get("total")
        record = (fields["rank"], fields["seq"], _number_text(fields["time"]), _number_text(fields["n"]),
                  "" if total is None else _number_text(total), fields.get("bar", 0), int(fields.get("closed", False)),
                  _one_line(fields.get("desc", "")))
        return f"{marker(token)}p" + ",".join(map(str, record))
    body = {"v": SCHEMA_VERSION, "k": kind}
    for name, value in fields.items():
        if value not in ("", None, {}):
            body[name] = value
    return marker(token) + dumps(body)


# The JSON a rank writes and reads goes through json's own C encoder and scanner, as json's does.


def dumps(value) -> str:
    """What ``json.dumps(value, separators=(",", ":"))`` writes."""
    if _json is None:
        import json

        return json.dumps(value, separators=(",", ":"))
    encode = _json.make_encoder({}, _unwritable, _json.encode_basestring_ascii, None, ":", ",", False, False, True)
    return "".join(encode(value, 0))


def _unwritable(value):
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


class _Reading:
    """What json's C scanner asks of the decoder it serves (json.JSONDecoder's defaults)."""

    strict = True
    object_hook = object_pairs_hook = array_hook = None
    parse_float, parse_int = float, int
    parse_constant = {"-Infinity": -float("inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


def loads(text: str):
    """What ``json.loads(text)`` reads; ``ValueError`` for what it refuses."""
    if _json is None:
        import json

        return json.loads(text)
    space = " \t\n\r"
    start = len(text) - len(text.lstrip(space))
    try:
        value, end = _json.make_scanner(_Reading())(text, start)  # type: ignore[arg-type]  # (a context by its attributes)
    except StopIteration as stop:
        raise ValueError(f"no JSON value at character {stop.value}") from None
    if text[end:].strip(space):
        raise ValueError(f"more than one JSON value: extra data at character {end}")
    return value


def progress_record(text: str) -> tuple:
    """(rank, seq, time, n, total, bar, closed, desc) of a short progress record (the text after
    ``p``), as the types they were written from; ``ValueError`` when the record is malformed."""
    rank, seq, when, n, total, bar, closed, desc = text.split(",", 7)
    if closed not in ("0", "1") or not (rank.isdigit() and seq.isdigit() and bar.isdigit()):
        raise ValueError("not a progress record")
    return (int(rank), int(seq), number(when), number(n), number(total) if total else None,
            int(bar), closed == "1", desc)


def _number_text(value) -> str:
    """An int as digits, anything else (numpy scalars too) as the repr of a Python float."""
    return str(value) if type(value) is int else repr(float(value))  # noqa: E721


def _one_line(text: str) -> str:
    return text.replace("\n", " ").replace("\r", " ") if "\n" in text or "\r" in text else text


def number(text: str) -> int | float:
    """A number field of a progress record, as the type it was written from."""
    return int(text) if text.isdigit() else float(text)


def pipe_holds_data(fd: int) -> bool:
    """True while the pipe ``fd`` writes to holds bytes not read yet (False for what is no pipe):
    a writer beside the cell waits for it, lest it cut a line the cell is part way through."""
    try:
        import fcntl  # by the writers beside the cell, not at a rank's start-up
        import sys
        import termios

        return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"), sys.byteorder) > 0
    except (ImportError, OSError):
        return False


def write_all(fd: int, line: str) -> None:
    data = line.encode("utf-8", errors="replace")
    while data:
        data = data[os.write(fd, data):]


class Emitter:
    """Writes one rank's wire events, numbering them; used by the rank runtime."""

    def __init__(self, rank: int, write, token: str) -> None:
        self.rank = rank
        self.token = token
        self._write = write
        self._seq = 0
        self._lock = allocate_lock()
        self.tap: Callable[[str], None] | None = None  # also given every line written (a session's cell transcript)

    def emit(self, kind: str, **values) -> None:
        self.emit_via(self._write, kind, **values)

    def hold_across_forks(self) -> None:
        """Take the lock around every ``os.fork``: a child forked while another thread of the rank
        writes an event would otherwise inherit the lock held, and hang on its first event."""
        os.register_at_fork(before=self._lock.acquire, after_in_parent=self._lock.release,
                            after_in_child=self._lock.release)

    def emit_via(self, write, kind: str, **values) -> None:
        """Emit through ``write`` instead (another stream), numbered with this rank's other events."""
        with self._lock:  # threads of one rank must not share a sequence number
            fields = {"rank": self.rank, "seq": self._seq, "time": time.time(), **values}
            self._seq += 1
            line = encode(kind, fields, self.token)
            write(line + "\n")
            if self.tap is not None:
                self.tap(line)
