"""Progress from inside a cell: ``mpi_magic.progress``, a small tqdm-like bar.

On a rank, updates become ``Progress`` events, at most about ``MAX_RATE`` per second per rank
(the latest state of every bar is kept and the final one is always sent), so a tight loop
pays little and a remote log is not flooded. Outside a job it only counts.
"""

from __future__ import annotations

import itertools
import time
from _thread import allocate_lock  # threading's Lock, without importing threading on every rank

from . import wire

TYPE_CHECKING = False  # typing and collections.abc are not imported on the ranks: they cost start-up time
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from collections.abc import Callable

MAX_RATE = 10.0  # progress events per second per rank


class Reporter:
    """Rate-limits one rank's progress events across all its bars.

    A bar is any object with ``bar_id``, ``n``, ``total`` and ``desc``; a held-back bar is
    remembered, not copied, so ``flush`` sends its latest state.
    """

    def __init__(self, emitter: wire.Emitter, max_rate: float = MAX_RATE, clock=time.monotonic):
        self.emitter = emitter  # (metrics.MetricLog sends through it too)
        self.at_flush: list[Callable[[], None]] = []  # what else sends what it holds when the cell ends (metrics)
        self._interval = 1.0 / max_rate
        self.clock = clock
        self.next_at = 0.0
        self._held: dict[int, progress] = {}
        self._lock = allocate_lock()
        self._ids = itertools.count()

    def new_bar(self) -> int:
        return next(self._ids)

    def update(self, bar, final: bool = False) -> bool:
        """Send ``bar``'s state now if due (or final), else hold it; True when sent."""
        now = self.clock()
        if not final and now < self.next_at:
            self._held[bar.bar_id] = bar
            return False
        with self._lock:
            self._held.pop(bar.bar_id, None)
            held, self._held = self._held, {}
            self._send(bar, closed=final)
            for other in held.values():  # bars held back meanwhile (an outer loop) go out too
                self._send(other)
                other._held = False
            self.next_at = now + self._interval
        return True

    def _send(self, bar, closed: bool = False) -> None:
        self.emitter.emit(wire.PROGRESS, n=bar.n, total=bar.total, desc=bar.desc or "", bar=bar.bar_id,
                           closed=closed)

    def flush(self) -> None:
        """Send every held bar's latest state, and what ``at_flush`` holds (the cell has ended)."""
        with self._lock:
            held, self._held = self._held, {}
            for bar_id in sorted(held):
                self._send(held[bar_id])
        for flush in self.at_flush:
            flush()


_reporter: Reporter | None = None


def install(reporter: Reporter | None) -> None:
    """Route progress to ``reporter`` (the rank runtime calls this before the cell runs)."""
    global _reporter
    _reporter = reporter


def current_reporter() -> Reporter | None:
    return _reporter


class progress:  # noqa: N801 - named like tqdm, which it stands in for
    """A progress bar reported per rank to the dashboard: wraps an iterable or counts by hand.

    ``for x in progress(data, desc="epoch")`` or ``with progress(total=100) as bar: bar.update(5)``.
    """

    def __init__(self, iterable: Iterable | None = None, total: float | None = None, desc: str | None = None):
        if total is None and iterable is not None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except TypeError:
                total = None
        self.iterable, self.total, self.desc = iterable, total, desc or ""
        self.n: float = 0
        self._reporter = _reporter
        self.bar_id = self._reporter.new_bar() if self._reporter else 0
        self._held = False
        self._closed = False
        self._send()

    def _send(self, final: bool = False) -> None:
        reporter = self._reporter
        if reporter is not None:
            self._held = not reporter.update(self, final)

    def update(self, n: float = 1) -> None:
        self.n += n
        reporter = self._reporter
        # The hot path: once held, a bar only asks the clock whether it is due.
        if reporter is not None and (not self._held or reporter.clock() >= reporter.next_at):
            self._held = not reporter.update(self)

    def __iter__(self) -> Iterator:
        if self.iterable is None:
            raise TypeError("progress() without an iterable is counted with update(n)")
        try:
            for item in self.iterable:
                yield item
                self.update()
        finally:
            self.close()

    def __len__(self) -> int:
        return int(self.total or 0)

    def set_description(self, desc: str) -> None:
        self.desc = desc
        self._send()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._send(final=True)

    def __enter__(self) -> "progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"progress({self.desc!r}, {self.n}/{self.total})"
