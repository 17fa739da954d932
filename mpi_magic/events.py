"""The one stream between a running job and whoever watches it.

Ranks report by writing one line per event to stdout: ``MARKER`` then compact JSON with a
schema version, the rank, a per-rank sequence number and a timestamp. The launcher tags
every line with its rank (``--tag-output`` in Open MPI, ``-l`` in MPICH), so plain output is
attributed too. The same ``StreamDecoder`` reads a local mpirun pipe or a log re-read from
the cloud: duplicates are dropped, gaps counted, and foreign lines become plain output.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import asdict, dataclass, field, fields

MARKER = "@@mpi_magic@@"
SCHEMA_VERSION = 1


@dataclass
class Output:
    """A line (or part of one) that a rank wrote to stdout or stderr."""

    rank: int
    stream: str
    text: str


@dataclass
class LauncherOutput:
    """A line from the launcher itself (not attributed to any rank)."""

    text: str


@dataclass
class RankStarted:
    rank: int
    instance: int
    local_rank: int
    world_size: int
    host: str = ""
    pid: int = 0
    seq: int = 0
    time: float = 0.0


@dataclass
class RankFinished:
    """A rank's cell ended: ``ok``, or the exception it raised."""

    rank: int
    ok: bool
    error_type: str = ""
    message: str = ""
    traceback: str = ""
    unreturned: dict[str, str] = field(default_factory=dict)
    results: str = ""  # SHA-256 of the rank's results file, checked before it is unpickled
    seq: int = 0
    time: float = 0.0


@dataclass
class Progress:
    """A rank's progress bar moved (``bar`` tells nested bars apart)."""

    rank: int
    n: float
    total: float | None = None
    desc: str = ""
    bar: int = 0
    closed: bool = False
    seq: int = 0
    time: float = 0.0


@dataclass
class Note:
    """Something the backend reports about the whole job (SageMaker's FailureReason, billable time)."""

    text: str


@dataclass
class Phase:
    """The job as a whole moved on (packaging, starting, running, done, ...). Client-side."""

    name: str
    detail: str = ""


@dataclass
class LauncherExited:
    """The launcher process ended with ``returncode`` (negative: killed by that signal)."""

    returncode: int


WireEvent = RankStarted | RankFinished | Progress
Event = WireEvent | Output | LauncherOutput | Note | Phase | LauncherExited

_KINDS: dict[str, type] = {"started": RankStarted, "finished": RankFinished, "progress": Progress}
_KIND_OF = {cls: kind for kind, cls in _KINDS.items()}


def encode(event: WireEvent) -> str:
    """One wire line (without newline) for ``event``."""
    body = {"v": SCHEMA_VERSION, "k": _KIND_OF[type(event)]}
    body.update({k: v for k, v in asdict(event).items() if v not in ("", None, {})})
    return MARKER + json.dumps(body, separators=(",", ":"))


def decode_payload(text: str) -> WireEvent | None:
    """The event in ``text`` (the part after MARKER), or None when it is not one of ours."""
    try:
        body = json.loads(text)
        cls = _KINDS[body.pop("k")]
        if body.pop("v") != SCHEMA_VERSION:
            return None
        names = {f.name for f in fields(cls)}
        event = cls(**{k: v for k, v in body.items() if k in names})
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not (type(event.rank) is int and type(event.seq) is int):  # noqa: E721 - bool is not a rank
        return None
    return event


# Open MPI 5: "[1,3]<stdout>: text"; Open MPI 4: "[1,3]<stdout>:text"; MPICH -l: "[3] text".
_OPENMPI_TAG = re.compile(r"^\[\d+,(\d+)\]<(stdout|stderr)>:(.*)$", re.DOTALL)
_MPICH_TAG = re.compile(r"^\[(\d+)\] (.*)$", re.DOTALL)


def parse_tag(line: str, stream: str = "stdout", style: str = "openmpi5") -> tuple[int, str, str] | None:
    """(rank, stream, text) for a launcher-tagged line, else None.

    ``stream`` is the pipe the line came from, used where the tag does not say (MPICH).
    """
    if style == "mpich":
        match = _MPICH_TAG.match(line)
        return (int(match.group(1)), stream, match.group(2)) if match else None
    match = _OPENMPI_TAG.match(line)
    if not match:
        return None
    text = match.group(3)
    if style == "openmpi5" and text.startswith(" "):
        text = text[1:]
    return int(match.group(1)), match.group(2), text


class StreamDecoder:
    """Turns launcher lines into events, dropping duplicates and counting gaps per rank."""

    def __init__(self, style: str = "openmpi5") -> None:
        self.style = style
        # Per rank: every seq below _complete has been seen; _ahead holds those seen beyond it.
        self._complete: dict[int, int] = {}
        self._ahead: dict[int, set[int]] = {}
        self.duplicates = 0

    @property
    def gaps(self) -> dict[int, int]:
        """{rank: events missing below the newest one seen}, for ranks with any missing."""
        gaps = {}
        for rank, ahead in self._ahead.items():
            if ahead:
                gaps[rank] = max(ahead) + 1 - self._complete[rank] - len(ahead)
        return gaps

    def feed(self, line: str, stream: str = "stdout") -> list[Event]:
        line = line.rstrip("\r\n")
        tagged = parse_tag(line, stream, self.style)
        if tagged is None:
            if MARKER in line:
                return self._split(None, stream, line)
            return [LauncherOutput(line)]
        rank, stream, text = tagged
        return self._split(rank, stream, text)

    def _split(self, rank: int | None, stream: str, text: str) -> list[Event]:
        at = text.find(MARKER)
        if at < 0:
            return [Output(rank, stream, text)] if rank is not None else [LauncherOutput(text)]
        events: list[Event] = []
        before, wire = text[:at], text[at + len(MARKER):]
        event = decode_payload(wire)
        if event is None:
            return [Output(rank, stream, text)] if rank is not None else [LauncherOutput(text)]
        if before and rank is not None:
            events.append(Output(rank, stream, before))
        if self._accept(event):
            events.append(event)
        return events

    def _accept(self, event: WireEvent) -> bool:
        complete = self._complete.get(event.rank, 0)
        ahead = self._ahead.setdefault(event.rank, set())
        if event.seq < complete or event.seq in ahead:
            self.duplicates += 1
            return False
        if event.seq == complete:
            complete += 1
            while complete in ahead:
                ahead.remove(complete)
                complete += 1
            self._complete[event.rank] = complete
        else:
            self._complete.setdefault(event.rank, complete)
            ahead.add(event.seq)
        return True


class Emitter:
    """Writes one rank's wire events, numbering them; used by the rank runtime."""

    def __init__(self, rank: int, write) -> None:
        self.rank = rank
        self._write = write
        self._seq = 0
        self._lock = threading.Lock()

    def emit(self, cls: type, **values) -> None:
        with self._lock:  # threads of one rank must not share a sequence number
            event = cls(rank=self.rank, seq=self._seq, time=time.time(), **values)
            self._seq += 1
            self._write(encode(event) + "\n")
