"""Job state folded from events. It draws nothing; the widget and text views render it.

Rates and ETAs come from the ranks' own timestamps, elapsed times from an injected clock,
so tests are deterministic.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from .. import events
from ..errors import RankFailure

ACTIVE = ("starting", "running")
OUTPUT_TAIL = 200


@dataclass
class Bar:
    n: float = 0.0
    total: float | None = None
    desc: str = ""
    first: tuple[float, float] | None = None  # (time, n) of the first update, for the rate
    last_time: float = 0.0
    closed: bool = False

    @property
    def rate(self) -> float | None:
        if self.first is None or self.last_time <= self.first[0]:
            return None
        return (self.n - self.first[1]) / (self.last_time - self.first[0])


@dataclass
class RankState:
    """One rank as the user sees it (also ``job.ranks[r]``)."""

    rank: int
    instance: int
    local_rank: int
    host: str = ""
    pid: int = 0
    status: str = "starting"  # starting, running, completed, failed, stopped
    failure: RankFailure | None = None
    bars: dict[int, Bar] = field(default_factory=dict)
    last_line: str = ""
    started_at: float | None = None
    ended_at: float | None = None
    tail: deque = field(default_factory=lambda: deque(maxlen=OUTPUT_TAIL))
    outputs: int = 0  # lines seen, so a view knows when its tail changed

    @property
    def bar(self) -> Bar | None:
        """The bar that stands for the rank: its outermost open one, else the one that closed last
        (the outer loop of nested bars, the last of bars in sequence)."""
        open_bars = [i for i, b in self.bars.items() if not b.closed]
        if open_bars:
            return self.bars[min(open_bars)]
        return max(self.bars.items(), key=lambda item: (item[1].last_time, item[0]))[1] if self.bars else None

    @property
    def n(self) -> float:
        return self.bar.n if self.bar else 0.0

    @property
    def total(self) -> float | None:
        return self.bar.total if self.bar else None

    @property
    def fraction(self) -> float | None:
        bar = self.bar
        if self.status == "completed" and (bar is None or not bar.total):
            return 1.0
        if bar is None or not bar.total:
            return None
        return min(1.0, bar.n / bar.total)

    @property
    def rate(self) -> float | None:
        return self.bar.rate if self.bar else None

    @property
    def elapsed(self) -> float | None:
        """Seconds this rank has run (by its own clock), up to its last event."""
        if self.started_at is None:
            return None
        ends = [t for t in (self.ended_at, *(b.last_time for b in self.bars.values())) if t]
        return max(ends, default=self.started_at) - self.started_at

    @property
    def eta(self) -> float | None:
        bar, rate = self.bar, self.rate
        if bar is None or not bar.total or not rate or self.status not in ACTIVE:
            return None
        return max(0.0, (bar.total - bar.n) / rate)


class JobModel:
    def __init__(self, name: str, backend: str, world_size: int, procs_per_instance: int,
                 clock: Callable[[], float] = time.monotonic):
        self.name, self.backend, self.world_size = name, backend, world_size
        self.procs_per_instance = procs_per_instance
        self.ranks = [RankState(r, r // procs_per_instance, r % procs_per_instance) for r in range(world_size)]
        self.phase = "packaging"
        self.clock = clock
        self.started_at = clock()
        self.ended_at: float | None = None
        self.version = 0  # bumped on every change, so views redraw only when needed
        self.tail: deque = deque(maxlen=OUTPUT_TAIL)  # (rank, stream, text) of every rank, in order
        self.outputs = 0
        self.notes: list[str] = []  # what the backend reports at the end (FailureReason, billable time)

    @property
    def num_instances(self) -> int:
        return (self.world_size + self.procs_per_instance - 1) // self.procs_per_instance

    def fold(self, event: events.Event) -> None:
        if isinstance(event, events.Note):
            self.notes.append(event.text)
        elif isinstance(event, events.Phase):
            self.phase = event.name
            if event.name in ("completed", "failed", "stopped"):
                self.ended_at = self.clock()
                self._stop_active()
        elif isinstance(event, events.Output) and self._valid(event.rank):
            state = self.ranks[event.rank]
            state.tail.append((event.stream, event.text))
            state.outputs += 1
            self.tail.append((event.rank, event.stream, event.text))
            self.outputs += 1
            if event.text.strip():
                state.last_line = event.text
        elif isinstance(event, events.RankStarted) and self._valid(event.rank):
            state = self.ranks[event.rank]
            state.host, state.pid, state.started_at = event.host, event.pid, event.time
            if state.status == "starting":
                state.status = "running"
            if self.phase in ("packaging", "submitting", "starting"):
                self.phase = "running"
        elif isinstance(event, events.Progress) and self._valid(event.rank):
            state = self.ranks[event.rank]
            bar = state.bars.setdefault(event.bar, Bar())
            if bar.first is None or event.n < bar.n:  # a bar restarted (reset) measures its rate anew
                bar.first = (event.time, event.n)
            bar.n, bar.total, bar.last_time, bar.closed = event.n, event.total, event.time, event.closed
            bar.desc = event.desc or bar.desc
            if state.status == "starting":
                state.status = "running"
        elif isinstance(event, events.RankFinished) and self._valid(event.rank):
            state = self.ranks[event.rank]
            state.ended_at = event.time
            if event.ok:
                state.status = "completed"
            elif event.error_type == "KeyboardInterrupt":  # the launcher or the user stopped it
                state.status = "stopped"
            else:
                state.status = "failed"
                state.failure = RankFailure(event.rank, state.instance, state.host, event.error_type,
                                            event.message, event.traceback)
        else:
            return
        self.version += 1

    def _valid(self, rank: int | None) -> bool:
        return rank is not None and 0 <= rank < self.world_size

    def _stop_active(self) -> None:
        for state in self.ranks:
            if state.status in ACTIVE:
                state.status = "stopped"

    # -- what views show ------------------------------------------------------------------

    def elapsed(self) -> float:
        return (self.ended_at or self.clock()) - self.started_at

    def counts(self) -> dict[str, int]:
        counts = {s: 0 for s in ("starting", "running", "completed", "failed", "stopped")}
        for state in self.ranks:
            counts[state.status] += 1
        return counts

    def progress(self) -> float | None:
        """Mean fraction done over ranks that report one (None when none does)."""
        fractions = [f for f in (s.fraction for s in self.ranks) if f is not None]
        return sum(fractions) / len(fractions) if fractions else None

    def slowest(self, count: int = 5) -> list[RankState]:
        """Running ranks furthest behind, by fraction done."""
        running = [s for s in self.ranks if s.status == "running" and s.fraction is not None]
        return sorted(running, key=lambda s: (s.fraction, s.rank))[:count]

    def by_instance(self) -> list[list[RankState]]:
        return [self.ranks[i:i + self.procs_per_instance] for i in range(0, self.world_size, self.procs_per_instance)]
