"""The one stream between a running job and whoever watches it: the notebook's event classes
and the decoder that turns launcher lines into them.

Ranks write their events in the format of ``wire``. The launcher tags every line with its
rank (``--tag-output`` in Open MPI, ``-l`` in MPICH), so plain output is attributed too. The
same ``StreamDecoder`` reads a local mpirun pipe or a log re-read from the cloud.

An event is believed only as far as its source: it must carry the job's token (text a cell
prints by accident does not), its rank must be the rank of the tag that carried it, and every
field must have a sane type and range. Anything else is plain output, and a line that carried
the token but failed those checks is dropped and counted, never raised.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, field, fields
from typing import Iterable

from . import metrics, wire


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
    results_digest: str = ""  # SHA-256 of the rank's results file, checked before it is unpickled
    post_mortem: str = ""  # SHA-256 of a failed rank's frames and locals (%mpirun_debug), where it kept them
    post_mortem_lost: str = ""  # why it kept none, where it tried
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
class RankReady:
    """In a session: the rank waits for the next cell (``cell``: the one it finished, 0 after start)."""

    rank: int
    cell: int
    seq: int = 0
    time: float = 0.0
    key: str = ""  # rank 0 of a SageMaker session, after start: the public key its cells' end records are signed with


@dataclass
class SessionClosing:
    """In a session: rank 0 ends it (``reason``: stop, idle, the notebook is gone)."""

    rank: int
    reason: str
    seq: int = 0
    time: float = 0.0


@dataclass
class RankStacks:
    """Where a rank was when asked through mpirun (``shared/stacks.py``): its main thread's
    frames, [filename, line, function], innermost last."""

    rank: int
    frames: list = field(default_factory=list)
    seq: int = 0
    time: float = 0.0


@dataclass
class Metrics:
    """Numbers a rank logged since its last report (``mpi_magic.log``, tqdm's ``set_postfix``):
    {name: [[step, value], ...]}, each name's points in the order they were logged."""

    rank: int
    points: dict[str, list[list[float]]] = field(default_factory=dict)
    seq: int = 0
    time: float = 0.0


@dataclass
class Resources:
    """What a rank uses now, sampled on it (``runtime/resources.py``): ``cpu`` in percent of one
    core (above 100 with several busy threads), ``rss`` resident bytes, and where it has a GPU
    the GPU memory it holds (bytes) and that GPU's utilisation (percent); None where unknown."""

    rank: int
    cpu: float | None = None
    rss: int | None = None
    gpu_memory: int | None = None
    gpu_util: float | None = None
    seq: int = 0
    time: float = 0.0


@dataclass
class Note:
    """Something the backend reports about the whole job (SageMaker's FailureReason)."""

    text: str


@dataclass
class Billing:
    """The job's billable instance time so far: ``instance_seconds``, growing by ``instances`` a
    second while ``running`` (until the next Billing), priced at ``hourly_price`` (on demand, per
    instance; None where unknown, and for a job on a ``training_plan``, which the plan paid for);
    ``spot``: the price is an upper bound. Client-side."""

    instances: int
    instance_seconds: float
    running: bool
    hourly_price: float | None = None
    spot: bool = False
    training_plan: str = ""  # the plan whose reserved capacity it runs on: paid for by the plan, not by the hour


@dataclass
class Phase:
    """The job as a whole moved on (packaging, starting, running, done, ...). Client-side."""

    name: str
    detail: str = ""


# Phases (SageMaker's secondary statuses) in which a job's ranks are not up yet: the backend that
# reports them and the model that shows them both read this
STARTING_PHASES = frozenset({"Starting", "Pending", "LaunchingMLInstances", "PreparingTrainingStack", "Downloading",
                             "DownloadingTrainingImage"})


QUEUED, RUNNING = "queued", "running"  # the states of an Allocation the view reads; a scheduler's others pass as named


@dataclass
class Allocation:
    """A batch scheduler's word on the job, in no scheduler's own terms: ``state`` QUEUED (waiting for
    its nodes: the ``reason`` why, as the scheduler words it, and its estimated ``starts``, epoch
    seconds), RUNNING, or another the scheduler names; the ``time_left`` of its time limit in seconds
    when read (math.inf: no limit; None: unknown); ``queue``: what the view calls the scheduler. Client-side."""

    state: str
    reason: str = ""
    starts: float | None = None
    time_left: float | None = None
    queue: str = "queue"


@dataclass
class Restarted:
    """The job started again from the beginning: every rank's state so far belongs to the
    attempt that ended. ``attempt``: 2 for the first restart; ``cause``: "spot interruption";
    ``reason``: what the user is told. Client-side."""

    attempt: int
    cause: str
    reason: str


@dataclass
class RankGone:
    """A rank's process is gone without having reported; how it ended is settled when the
    launcher exits (its output may still be on the way). Client-side."""

    rank: int


@dataclass
class StopRequested:
    """The notebook asked the job to stop (``reason``: interrupt, timeout, cancel, error, ...). Client-side."""

    reason: str


@dataclass
class RollCall:
    """Where every rank was when asked (``shared/stacks.py``): the ranks grouped by the cell line
    they are at, those that gave no stack and why; ``stall``: taken because the ranks went quiet.
    Client-side."""

    text: str
    stall: bool = False


@dataclass
class CellSent:
    """In a session: the notebook handed the ranks cell ``number`` (so ``number`` cells have run,
    counting those of a notebook it was taken over from). Client-side."""

    number: int


@dataclass
class LauncherExited:
    """The job ended: the launcher's ``returncode`` (negative: killed by that signal) and what
    it said about ranks that did not end by themselves ({rank: "was killed by signal 9"})."""

    returncode: int | None  # None: unknown (the job was still stopping when the notebook gave up waiting)
    reports: dict[int, str] = field(default_factory=dict)
    refused: str = ""  # the launcher's own reason when it refused to start any rank
    reason: str = ""  # why the job ended, where more is known than the launcher's status (a session ended)


class CellEnded(LauncherExited):
    """In a session: every rank is back to waiting, so the cell has ended while the launcher
    runs on (``reports`` name ranks that were stopped). Client-side."""


# What shows that ranks are alive and working: the one rule of activity a stall is measured from (a stack
# or a resource sample, which a stalled rank still sends, is none)
SIGNS_OF_LIFE = frozenset({Output, Progress, Metrics, RankStarted, RankFinished})

WireEvent = RankStarted | RankFinished | Progress | RankReady | SessionClosing | RankStacks | Metrics | Resources
Event = (WireEvent | Output | LauncherOutput | Note | Billing | Phase | Allocation | Restarted | RankGone | StopRequested
         | RollCall | CellSent | LauncherExited)

_KINDS: dict[str, type] = {wire.STARTED: RankStarted, wire.FINISHED: RankFinished, wire.PROGRESS: Progress,
                           wire.READY: RankReady, wire.CLOSING: SessionClosing, wire.STACKS: RankStacks,
                           wire.METRICS: Metrics, wire.RESOURCES: Resources}
_KIND_OF = {cls: kind for kind, cls in _KINDS.items()}
_FIELDS = {cls: tuple(f.name for f in fields(cls)) for cls in _KINDS.values()}


def _count(value) -> bool:
    return type(value) is int and 0 <= value < 1 << 53  # noqa: E721 - bool is not a count


def _number(value) -> bool:
    kind = type(value)
    return (kind is float and math.isfinite(value) or kind is int and value < 1 << 53) and value >= 0


def _optional_number(value) -> bool:
    return value is None or _number(value)


def _at_most(limit: float):
    """A number from 0 to ``limit``, or None (not measured)."""
    return lambda value: value is None or _number(value) and value <= limit


def _optional_count(value) -> bool:
    return value is None or _count(value)


def _flag(value) -> bool:
    return type(value) is bool  # noqa: E721


def _text(limit: int):
    return lambda value: type(value) is str and len(value) <= limit  # noqa: E721


def _names(value) -> bool:
    """{name: reason} of values that did not come back."""
    return type(value) is dict and len(value) <= 10_000 and all(  # noqa: E721
        type(k) is str and len(k) <= 1000 and type(v) is str and len(v) <= 4000 for k, v in value.items())  # noqa: E721


def _frames(value) -> bool:
    """[[filename, line, function], ...] as a faulthandler dump names them."""
    return type(value) is list and len(value) <= 200 and all(  # noqa: E721
        type(frame) is list and len(frame) == 3 and _text(4000)(frame[0]) and _count(frame[1])  # noqa: E721
        and _text(1000)(frame[2]) for frame in value)


def _finite(value) -> bool:
    kind = type(value)
    return kind is float and math.isfinite(value) or kind is int and -(1 << 53) < value < 1 << 53


def _metric_points(value) -> bool:
    """{name: [[step, value], ...]}: at most as many names and points as a rank may send (with room)."""
    if type(value) is not dict or not 0 < len(value) <= metrics.MAX_NAMES:  # noqa: E721
        return False
    for name, points in value.items():
        if not (metrics.valid_name(name) and type(points) is list  # noqa: E721
                and 0 < len(points) <= 4 * metrics.BATCH_POINTS):
            return False
        for point in points:
            if not (type(point) is list and len(point) == 2 and _finite(point[0]) and _finite(point[1])):  # noqa: E721
                return False
    return True


def _digest(value) -> bool:
    return type(value) is str and len(value) <= 128 and all(c in "0123456789abcdef" for c in value)  # noqa: E721


_COMMON = {"rank": _count, "seq": _count, "time": _number}
# Every field a rank may send, with what it must be. Bounds sit above what the runtime sends.
_SCHEMA = {
    RankStarted: {**_COMMON, "instance": _count, "local_rank": _count, "world_size": _count, "host": _text(1000),
                  "pid": _count},
    RankFinished: {**_COMMON, "ok": _flag, "error_type": _text(1000), "message": _text(20_000),
                   "traceback": _text(100_000), "unreturned": _names, "results_digest": _digest, "post_mortem": _digest,
                   "post_mortem_lost": _text(1000)},
    RankReady: {**_COMMON, "cell": _count, "key": _text(100)},
    SessionClosing: {**_COMMON, "reason": _text(1000)},
    RankStacks: {**_COMMON, "frames": _frames},
    Metrics: {**_COMMON, "points": _metric_points},
    Progress: {**_COMMON, "n": _number, "total": _optional_number, "desc": _text(1000), "bar": _count,
               "closed": _flag},
    # a core's percent times a million cores; bytes below 1 << 53 (8 PiB)
    Resources: {**_COMMON, "cpu": _at_most(1e8), "rss": _optional_count, "gpu_memory": _optional_count,
                "gpu_util": _at_most(100.0)},
}


def encode(event: WireEvent, token: str) -> str:
    """One wire line (without newline) for ``event`` in the job whose token is ``token``."""
    cls = type(event)
    return wire.encode(_KIND_OF[cls], {name: getattr(event, name) for name in _FIELDS[cls]}, token)


def _decode_progress(text: str) -> Progress:
    try:
        rank, seq, when, n, total, bar, closed, desc = wire.progress_record(text)
    except ValueError:
        raise BadEvent("not a progress record") from None
    event = Progress(rank, n, total, desc, bar, closed, seq, when)  # positional: the fields' order
    if not (_number(event.n) and _optional_number(event.total) and _number(event.time) and len(event.desc) <= 1000
            and _count(event.rank) and _count(event.seq) and _count(event.bar)):
        raise BadEvent("progress out of range")
    return event


_loads = json.JSONDecoder().decode


class BadEvent(ValueError):
    """A line carried the job's marker but no valid event."""


def decode_payload(text: str) -> WireEvent:
    """The event in ``text`` (the part after the marker); ``BadEvent`` when it is not a valid one."""
    try:
        if text[:1] == "p":
            return _decode_progress(text[1:])
        body = _loads(text)
        if type(body) is not dict or body.pop("v", None) != wire.SCHEMA_VERSION:  # noqa: E721
            raise BadEvent("not an event of this version")
        cls = _KINDS[body.pop("k")]
        schema = _SCHEMA[cls]
        for name, value in body.items():
            if not schema[name](value):
                raise BadEvent(f"bad {name}")
        return cls(**body)
    except BadEvent:
        raise
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise BadEvent(type(exc).__name__) from None


# Open MPI 5: "[1,3]<stdout>: text"; Open MPI 4: "[1,3]<stdout>:text"; MPICH -l: "[3] text"; Slurm's
# srun --label: " 3: text" (these two name no stream: the pipe or file the line came from says it).
_TAG_PREFIXES = {
    "openmpi5": r"\[\d+,(?P<rank>\d+)\]<(?P<stream>stdout|stderr)>: ?",
    "openmpi4": r"\[\d+,(?P<rank>\d+)\]<(?P<stream>stdout|stderr)>:",
    "mpich": r"\[(?P<rank>\d+)\] (?P<stream>)",
    "srun": r" *(?P<rank>\d+): (?P<stream>)",
}
_TAGS = {style: re.compile(rf"^{prefix}(?P<text>.*)$", re.DOTALL) for style, prefix in _TAG_PREFIXES.items()}


def parse_tag(line: str, stream: str = "stdout", style: str = "openmpi5") -> tuple[int, str, str] | None:
    """(rank, stream, text) for a launcher-tagged line, else None.

    ``stream`` is the pipe the line came from, used where the tag does not say (MPICH).
    """
    match = _TAGS[style].match(line)
    if match is None:
        return None
    return int(match["rank"]), match["stream"] or stream, match["text"]


_COUNT = "[0-9]{1,15}"  # below 1 << 53, as ``_count`` wants
# finite, not negative and below 1 << 53, as ``_number`` wants; a float's repr has at most about 20
# decimals in this form ("0.00012345678901234568"), so nearly every number a rank writes fits
_PLAIN_NUMBER = r"[0-9]{1,15}(?:\.[0-9]{1,24})?"


@functools.cache
def _tagged_line(style: str) -> re.Pattern:
    """A launcher-tagged line, as ``_TAGS[style]`` reads it, whose groups also hold the fields of
    a progress record when the line is nothing but one, of the tag's own rank, in the plain form
    the runtime writes (the most frequent line of all): one match then checks what
    ``_decode_progress`` checks, but for the marker, which the decoder compares (so one pattern
    serves every job). Any other text after the tag is ``text``, for the general path."""
    record = (rf"(?P<marker>{re.escape(wire.MARKER_PREFIX)}[^@]*@@)p(?={_COUNT},)(?P=rank),(?P<seq>{_COUNT}),(?P<time>{_PLAIN_NUMBER}),"
              rf"(?P<n>{_PLAIN_NUMBER}),(?P<total>{_PLAIN_NUMBER})?,(?P<bar>{_COUNT}),(?P<closed>[01]),(?P<desc>.{{0,1000}})\Z")
    return re.compile(rf"^{_TAG_PREFIXES[style]}(?:{record}|(?P<text>.*)$)", re.DOTALL)


class StreamDecoder:
    """Turns launcher lines into events, dropping duplicates and counting gaps per rank.

    ``rejected`` counts lines that carried the job's marker but were not believed: malformed,
    out of range, or claiming another rank than the launcher's tag says.
    """

    def __init__(self, token: str, style: str = "openmpi5") -> None:
        self.marker = wire.marker(token)
        self.style = style
        # Per rank: every seq below _complete has been seen; _ahead holds those seen beyond it.
        self._complete: dict[int, int] = {}
        self._ahead: dict[int, set[int]] = {}
        self.duplicates = 0
        self.rejected = 0

    @property
    def style(self) -> str:
        """How the launcher tags lines (``_TAG_PREFIXES``); a job's log may say so after it began."""
        return self._style

    @style.setter
    def style(self, style: str) -> None:
        self._style, self._tagged = style, _tagged_line(style)

    @property
    def gaps(self) -> dict[int, int]:
        """{rank: events missing below the newest one seen}, for ranks with any missing."""
        gaps = {}
        for rank, ahead in self._ahead.items():
            if ahead:
                gaps[rank] = max(ahead) + 1 - self._complete[rank] - len(ahead)
        return gaps

    def rejections(self) -> list[Note]:
        """What the user is told at the end about lines that were not believed."""
        if not self.rejected:
            return []
        return [Note(f"{self.rejected} line{'s' if self.rejected > 1 else ''} carried this job's event marker but no "
                     "valid event of the rank that printed them; they are kept as that rank's output")]

    def feed(self, line: str, stream: str = "stdout") -> list[Event]:
        """The events of one line (a trailing newline is dropped)."""
        if line.endswith("\n"):
            line = line.rstrip("\r\n")
        return self.feed_lines((line,), stream)

    def feed_lines(self, lines: Iterable[str], stream: str = "stdout") -> list[Event]:
        """The events of ``lines`` (each without its newline), in order: a read's lines decoded
        in one call, as the local backend's readers hand them on."""
        decoded: list[Event] = []
        append, match = decoded.append, self._tagged.match
        complete, ahead = self._complete, self._ahead
        for line in lines:
            found = match(line)
            if found is None:  # the launcher's own words: no rank vouches for an event in them
                append(LauncherOutput(line))
                continue
            tag_rank, tag_stream, marker, seq, when, n, total, bar, closed, desc, text = found.groups()
            if marker is not None and marker != self.marker:  # another job's record: the general path's
                seq, text = None, line[found.start("marker"):]
            if seq is None:
                try:
                    decoded += self._decode_text(int(tag_rank), tag_stream or stream, text)
                except Exception:  # noqa: BLE001 - a line must never stop the reader of a job's output
                    append(LauncherOutput(line))
                continue
            # the line is a valid progress record alone (numbers read as wire.number does, written
            # out: this runs for nearly every line)
            rank, seq_no = int(tag_rank), int(seq)
            progress = Progress(rank, int(n) if n.isdigit() else float(n),
                                (int(total) if total.isdigit() else float(total)) if total else None, desc, int(bar),
                                closed == "1", seq_no, int(when) if when.isdigit() else float(when))
            if seq_no == complete.get(rank, 0) and not ahead.get(rank):  # _accept's usual case
                complete[rank] = seq_no + 1
                append(progress)
            elif self._accept(rank, seq_no):
                append(progress)
        return decoded

    def feed_rank(self, rank: int, lines: list[str]) -> list[Event]:
        """The events in lines ``rank`` wrote itself (no launcher's tag), checked as tagged ones are;
        a line that is no event of this job is dropped (it came from the rank's own record)."""
        events: list[Event] = []
        for line in lines:
            events += [event for event in self._decode_text(rank, "stdout", line) if not isinstance(event, Output)]
        return events

    def _decode_text(self, rank: int, stream: str, text: str) -> list[Event]:
        """The events in the text of a tagged line that is not a plain progress record."""
        at = text.find(self.marker)
        if at < 0:
            return [Output(rank, stream, text)]
        try:
            event = decode_payload(text[at + len(self.marker):])
            if event.rank != rank:
                raise BadEvent(f"rank {event.rank} in a line of rank {rank}")
        except BadEvent:
            self.rejected += 1
            return [Output(rank, stream, text)]
        # a rank's stacks come from a process of its own (``stacks.py``), outside its numbering;
        # one read twice is the same answer again
        if not isinstance(event, RankStacks) and not self._accept(rank, event.seq):
            return [Output(rank, stream, text[:at])] if at else []
        return [Output(rank, stream, text[:at]), event] if at else [event]

    def _accept(self, rank: int, seq: int) -> bool:
        complete = self._complete.get(rank, 0)
        ahead = self._ahead.get(rank)
        if seq == complete and not ahead:  # the usual case: the next event, none missing
            self._complete[rank] = complete + 1
            return True
        if ahead is None:
            ahead = self._ahead[rank] = set()
        if seq < complete or seq in ahead:
            self.duplicates += 1
            return False
        if seq == complete:
            complete += 1
            while complete in ahead:
                ahead.remove(complete)
                complete += 1
            self._complete[rank] = complete
        else:
            self._complete.setdefault(rank, complete)
            ahead.add(seq)
        return True


class ClockOffsets(dict):
    """Per instance, the least time any of its events took from its clock to ours: its clock's
    offset from ours (the skew between the two, plus the least delay), so times stamped on
    different instances compare. A plain dict, {instance: offset}."""

    def heard(self, instance: int, stamped: float, now: float) -> None:
        """An event of ``instance`` stamped ``stamped`` by its clock arrived at ``now`` by ours."""
        if stamped > 0:  # 0: not stamped
            offset = now - stamped
            if offset < self.get(instance, offset + 1):
                self[instance] = offset

    def ours(self, instance: int, stamped: float | None) -> float | None:
        """``stamped`` by ``instance``'s clock, by ours (None where either is not known)."""
        offset = self.get(instance)
        return None if stamped is None or offset is None else stamped + offset
