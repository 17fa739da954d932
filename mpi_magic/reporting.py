"""Progress from inside a cell: ``mpi_magic.progress``, a small tqdm-like bar.

On a rank, updates become ``Progress`` events, at most about ``MAX_RATE`` per second per rank
(the latest state of every bar is kept and the final one is always sent), so a tight loop
pays little and a remote log is not flooded. Outside a job it only counts.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Iterable, Iterator

from . import events

MAX_RATE = 10.0  # progress events per second per rank


class Reporter:
    """Rate-limits one rank's progress events across all its bars."""

    def __init__(self, emitter: events.Emitter, max_rate: float = MAX_RATE, clock=time.monotonic):
        self._emitter = emitter
        self._interval = 1.0 / max_rate
        self._clock = clock
        self._next_at = 0.0
        self._pending: dict[int, tuple[float, float | None, str]] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()

    def new_bar(self) -> int:
        return next(self._ids)

    def update(self, bar: int, n: float, total: float | None, desc: str, final: bool = False) -> None:
        now = self._clock()
        if not final and now < self._next_at:
            self._pending[bar] = (n, total, desc)  # the hot path: one clock read and one dict store
            return
        with self._lock:
            self._pending.pop(bar, None)
            self._emitter.emit(events.Progress, n=n, total=total, desc=desc, bar=bar)
            self._next_at = now + self._interval

    def flush(self) -> None:
        """Send every bar's latest state (the cell has ended)."""
        with self._lock:
            pending, self._pending = self._pending, {}
            for bar, (n, total, desc) in sorted(pending.items()):
                self._emitter.emit(events.Progress, n=n, total=total, desc=desc, bar=bar)


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
        self.iterable, self.total, self.desc, self.n = iterable, total, desc or "", 0
        self._reporter = _reporter
        self._bar = self._reporter.new_bar() if self._reporter else 0
        self._closed = False
        self._send()

    def _send(self, final: bool = False) -> None:
        if self._reporter is not None:
            self._reporter.update(self._bar, self.n, self.total, self.desc, final)

    def __iter__(self) -> Iterator:
        if self.iterable is None:
            raise TypeError("progress() without an iterable is counted with update(n)")
        try:
            for item in self.iterable:
                yield item
                self.n += 1
                self._send()
        finally:
            self.close()

    def __len__(self) -> int:
        return int(self.total or 0)

    def update(self, n: float = 1) -> None:
        self.n += n
        self._send()

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
