"""Numeric metrics from inside a cell: ``mpi_magic.log(loss=0.3)`` (and tqdm's ``set_postfix`` on a
rank), the limits and thinning rule that the ranks and the notebook both keep, and the series the
notebook keeps of them (``MetricStore``: ``job.metrics``, the charts).

On a rank, values are coalesced and sent as ``metrics`` events, at most about ``MAX_RATE`` a
second on average (bursts of ``BURST``); what is held back goes out with the next event or when
the cell ends, so the last value of every series always arrives. Between two events each name
keeps at most ``BATCH_POINTS`` points, thinned evenly (fewer when many names share an event's
``EVENT_POINTS``), so a loop that logs a million times sends a few hundred points, not a million. Outside a job the values are checked and nothing is kept.
The notebook keeps at most ``SERIES_POINTS`` points a series plus the latest, thinned evenly as
more arrive (``Thinned``), and ``MAX_NAMES`` names a rank, however much a job logs.

This module is imported on a rank by the cell's first ``log`` or ``set_postfix``, not at start-up.
"""

from __future__ import annotations

import math
import time
from _thread import allocate_lock  # threading's Lock, without importing threading on every rank
from array import array

from . import reporting, wire

MAX_RATE = reporting.MAX_RATE  # metrics events per second per rank, on average
BURST = 10  # events a rank may send at once after a quiet spell (two calls in a row both go out)
MAX_NAMES = 32  # metric names per rank and cell
NAME_LENGTH = 64  # characters of a metric name
BATCH_POINTS = 16  # points per name in one event
EVENT_POINTS = 256  # points in one event, all names together: a line of about 8 kB at most, as log agents like
SERIES_POINTS = 1000  # points per series the notebook keeps (plus the latest)


class Thinned:
    """A series of (step, value) points that holds at most ``capacity`` of them plus the latest,
    however many are added: when full, every other point is dropped and from then on only every
    second point added is kept (then every fourth, ...), so the kept points stay evenly spread
    over what was added. The latest point is always kept."""

    __slots__ = ("capacity", "steps", "values", "stride", "added", "last")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity + capacity % 2  # even: halving keeps the stride's multiples
        self.steps = array("d")
        self.values = array("d")
        self.stride = 1  # every stride-th point added is kept
        self.added = 0
        self.last: tuple[float, float] | None = None  # the latest point, while it is not among the kept

    def add(self, step: float, value: float) -> None:
        added, self.added = self.added, self.added + 1
        if added % self.stride:
            self.last = (step, value)
            return
        if len(self.steps) >= self.capacity:
            del self.steps[1::2], self.values[1::2]
            self.stride *= 2
            if added % self.stride:
                self.last = (step, value)
                return
        self.steps.append(step)
        self.values.append(value)
        self.last = None

    def points(self) -> list[tuple[float, float]]:
        kept = list(zip(self.steps, self.values))
        return kept + [self.last] if self.last is not None else kept

    def latest(self) -> tuple[float, float] | None:
        if self.last is not None:
            return self.last
        return (self.steps[-1], self.values[-1]) if self.steps else None

    def __len__(self) -> int:
        return len(self.steps) + (self.last is not None)


def valid_name(name: object) -> bool:
    """A metric name: an identifier of at most ``NAME_LENGTH`` characters."""
    return type(name) is str and len(name) <= NAME_LENGTH and name.isidentifier()  # noqa: E721


_SKIP = None  # a number that is not finite: its step counts, but it is not sent


def _number(name: str, value: object) -> float | None:
    """``value`` as a float (None when it is not finite); ``TypeError`` when it is not a number."""
    kind = type(value)
    if kind is not float and kind is not int:
        import numbers  # only for numbers of other types (numpy's)

        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise TypeError(f"mpi_magic.log takes int or float values, and {name} is a {kind.__name__}: pass "
                            f"float({name}) (or {name}.item() for a tensor)")
    try:
        number = float(value)  # type: ignore[arg-type]
    except OverflowError:  # an int beyond any float
        return _SKIP
    return number if math.isfinite(number) else _SKIP


# -- on a rank ---------------------------------------------------------------------------------

class MetricLog:
    """One rank's metrics, coalesced and rate-limited (a token bucket of ``burst`` events,
    refilled at ``max_rate`` a second); ``flush`` sends what is held when the cell ends."""

    def __init__(self, emitter: wire.Emitter, max_rate: float = MAX_RATE, burst: int = BURST,
                 clock=time.monotonic) -> None:
        self._emitter = emitter
        self._rate, self._burst = max_rate, float(burst)
        self._clock = clock
        self._tokens, self._filled_at = float(burst), clock()
        self._pending: dict[str, Thinned] = {}
        self._next_step: dict[str, float] = {}  # each name's step when none is given
        self._lock = allocate_lock()
        self.sent = 0  # events sent

    def add(self, step: float | None, values: dict[str, float | None], strict: bool = True) -> None:
        """Record ``values`` ({name: number, or None for one not sent}) at ``step`` (each name's
        own count when None). A name beyond ``MAX_NAMES`` raises ``ValueError`` (``strict``) or is
        left out."""
        with self._lock:
            next_step, pending = self._next_step, self._pending
            if strict and len(next_step) + len(values) > MAX_NAMES:  # said before anything is recorded
                new = [name for name in values if name not in next_step]
                if len(next_step) + len(new) > MAX_NAMES:
                    raise ValueError(f"a rank logs at most {MAX_NAMES} metric names in a cell, and "
                                     f"{new[MAX_NAMES - len(next_step)]} would be one more")
            for name, value in values.items():
                if name not in next_step and len(next_step) >= MAX_NAMES:
                    continue  # (not strict: tqdm shows it, nothing else)
                at = next_step.get(name, 0) if step is None else step
                next_step[name] = at + 1
                if value is not None:
                    series = pending.get(name)
                    if series is None:
                        series = pending[name] = Thinned(BATCH_POINTS)
                    series.add(at, value)
            if pending and self._due():
                self._send()

    def _due(self) -> bool:
        now = self._clock()
        tokens = min(self._burst, self._tokens + (now - self._filled_at) * self._rate)
        self._filled_at = now
        if tokens >= 1.0:
            self._tokens = tokens - 1.0
            return True
        self._tokens = tokens
        return False

    def _send(self) -> None:
        share = max(1, EVENT_POINTS // len(self._pending))  # many names: fewer points each
        points = {name: [[whole_step(step), value] for step, value in _spread(series.points(), share)]
                  for name, series in self._pending.items()}
        self._pending = {}
        self._emitter.emit(wire.METRICS, points=points)
        self.sent += 1

    def flush(self) -> None:
        """Send what is held back (the cell has ended); the next cell counts its steps from 0."""
        with self._lock:
            if self._pending:
                self._send()
            self._next_step.clear()


def _spread(points: list, most: int) -> list:
    """At most ``most`` of ``points``, evenly spread, the last among them."""
    if len(points) <= most:
        return points
    if most == 1:
        return points[-1:]
    last = len(points) - 1
    return [points[round(i * last / (most - 1))] for i in range(most)]


def whole_step(step: float) -> float:
    """A whole step as an int ("3", not "3.0", on the wire and in ``job.metrics``)."""
    if type(step) is int:  # noqa: E721 - a count, as given
        return step
    return int(step) if step.is_integer() and abs(step) < 1 << 53 else step


_current: tuple[reporting.Reporter, MetricLog] | None = None
_current_lock = allocate_lock()


def current_log() -> MetricLog | None:
    """This rank's metric log (made on first use, flushed with its progress), None outside a job."""
    global _current
    reporter = reporting.current_reporter()
    if reporter is None:
        return None
    current = _current
    if current is None or current[0] is not reporter:
        with _current_lock:
            current = _current
            if current is None or current[0] is not reporter:
                metric_log = MetricLog(reporter.emitter, clock=reporter.clock)
                reporter.at_flush.append(metric_log.flush)
                current = _current = (reporter, metric_log)
    return current[1]


def log(step: float | None = None, **metrics: float) -> None:
    """Report this rank's numeric metrics: ``mpi_magic.log(loss=0.31, acc=0.9)``. The dashboard
    draws each name as a chart (a line per rank), ``job.metrics`` gives every rank's series
    ({rank: {"loss": [(step, value), ...]}}) and the summary keeps the final chart.

    ``step`` defaults to a count per name (0, 1, 2, ... in each cell). Values are int, float or
    numpy numbers (a bool or anything else raises ``TypeError``); NaN and infinities are not
    sent. Names are identifiers, at most 32 a rank. A rank sends at most about 10 events a second:
    points between two events are thinned evenly and the last value of each name always arrives,
    so calling this in a tight loop costs little. The notebook keeps 1,000 points a series,
    thinned evenly as more come. Outside a job the values are checked and nothing is kept.
    """
    values = {}
    for name, value in metrics.items():
        if not valid_name(name):
            raise ValueError(f"metric names are identifiers of at most {NAME_LENGTH} characters, not {name!r}")
        values[name] = _number(name, value)
    if step is not None:
        at = _number("step", step)
        if at is None:
            raise ValueError(f"mpi_magic.log's step must be finite, not {step!r}")
        step = at
    metric_log = current_log()
    if metric_log is not None:
        metric_log.add(step, values)


def log_postfix(postfix: dict) -> None:
    """The numbers among tqdm's ``set_postfix`` values (and strings that read as one, such as
    f"{loss:.3f}"), logged as ``log`` logs them without a step; other values, names that are not
    identifiers and names beyond ``MAX_NAMES`` are only shown by tqdm."""
    metric_log = current_log()
    if metric_log is None:
        return
    values = {}
    for name, value in postfix.items():
        if not valid_name(name):
            continue
        if type(value) is str:  # noqa: E721
            try:
                value = float(value)
            except ValueError:
                continue
        try:
            values[name] = _number(name, value)
        except TypeError:
            continue
    if values:
        metric_log.add(None, values, strict=False)


# -- in the notebook ------------------------------------------------------------------------

Points = list[tuple[float, float]]  # (step, value), in the order they were logged


class MetricStore:
    """The metric series of a job's ranks, folded from their ``Metrics`` events."""

    def __init__(self, capacity: int = SERIES_POINTS) -> None:
        self.capacity = capacity
        self.ranks: dict[int, dict[str, Thinned]] = {}
        self.names: dict[str, None] = {}  # every name a rank reported, in order of arrival (the charts' order)
        self.version = 0  # bumped by every fold, so a chart is redrawn only when it changed
        self.dropped = 0  # points of names beyond a rank's MAX_NAMES, not kept

    def __bool__(self) -> bool:
        return bool(self.names)

    def fold(self, rank: int, points: dict[str, list[list[float]]]) -> None:
        series = self.ranks.setdefault(rank, {})
        for name, pairs in points.items():
            kept = series.get(name)
            if kept is None:
                if len(series) >= MAX_NAMES:
                    self.dropped += len(pairs)
                    continue
                kept = series[name] = Thinned(self.capacity)
                self.names.setdefault(name)
            for step, value in pairs:
                kept.add(step, value)
        self.version += 1

    def by_name(self) -> dict[str, dict[int, Points]]:
        """{name: {rank: points}}, names in order of arrival, ranks in order."""
        return {name: {rank: series[name].points() for rank, series in sorted(self.ranks.items()) if name in series}
                for name in self.names}

    def latest(self, name: str) -> dict[int, float]:
        """{rank: the last value it logged for ``name``}."""
        found = {}
        for rank, series in sorted(self.ranks.items()):
            point = series[name].latest() if name in series else None
            if point is not None:
                found[rank] = point[1]
        return found

    def as_dict(self) -> dict[int, dict[str, Points]]:
        """{rank: {name: [(step, value), ...]}}, whole steps as ints: what ``job.metrics`` gives."""
        return {rank: {name: [(whole_step(step), value) for step, value in kept.points()]
                       for name, kept in series.items()}
                for rank, series in sorted(self.ranks.items()) if series}
