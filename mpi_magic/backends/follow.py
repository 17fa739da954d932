"""What every running job does with its ranks' events, whatever reads their lines: it tallies them
(which ranks started, where, which reported, whether one failed, the launcher's last words), so that
its end can say which ranks never reported, and it queues them for the notebook's ``poll``.

A backend's job keeps only its source of lines (a pipe, files on a shared filesystem, a log in the
cloud) and its way to start and stop; every stop then waits for the end the same way
(``stop_then_wait``).
"""

from __future__ import annotations

import queue
import subprocess
import time
from typing import Callable, Iterable

from ..shared.events import Event, LauncherExited, LauncherOutput, Output, RankFinished, RankStacks, RankStarted
from .launcher import LauncherLog

# At most this many events are handed out by one poll, gathered for at most this many seconds: the
# follower redraws between polls, and one queue operation per event would cost more than decoding it.
MAX_BATCH, MAX_BATCH_SECONDS = 2_000, 0.05


class Tally:
    """What the events said so far of the job's ranks; a session's ranks report anew in each cell
    (``new_cell``)."""

    def __init__(self) -> None:
        self.pids: dict[int, int] = {}  # {rank: its pid}, from each rank's start
        self.hosts: set[str] = set()  # where the ranks said they started
        self.world_size: int | None = None  # as the ranks said (None before the first started)
        self.reported: set[int] = set()  # the ranks that finished the cell, either way
        self.failed = False  # a rank reported a failure in this cell
        self.answered: set[int] = set()  # the ranks that sent their stack since it was cleared (when they were asked)
        self.log = LauncherLog()  # the launcher's own last lines

    def take(self, events: Iterable[Event]) -> None:
        for event in events:
            if type(event) is Output:  # the most frequent, which says nothing of where the ranks are
                continue
            if isinstance(event, RankStarted):
                self.pids[event.rank] = event.pid
                self.hosts.add(event.host)
                self.world_size = event.world_size
            elif isinstance(event, RankFinished):
                self.reported.add(event.rank)
                self.failed = self.failed or not event.ok
            elif isinstance(event, LauncherOutput):
                self.log.add(event.text)
            elif isinstance(event, RankStacks):
                self.answered.add(event.rank)

    def new_cell(self) -> None:
        self.reported.clear()
        self.failed = False

    @property
    def started(self) -> set[int]:
        return set(self.pids)

    @property
    def all_reported(self) -> bool:
        return self.world_size is not None and len(self.reported) >= self.world_size

    def unreported(self) -> set[int]:
        """The ranks that started and never reported, once the launcher is gone; none where another
        rank's failure explains it (the launcher stopped them because of it)."""
        return set() if self.failed else set(self.pids) - self.reported

    def ended(self, returncode: int | None, launcher_hung: bool = False) -> LauncherExited:
        """The job's end, from the launcher's exit status and its last words (``LauncherLog.ended``); a
        launcher that hung counts as one that started ranks, whatever they said."""
        return self.log.ended(returncode, bool(self.pids) or launcher_hung, self.unreported())


class EventQueue:
    """Batches of events from a job's reader threads, bounded: at most ``size`` batches wait, so a
    rank flooding its output is slowed down instead of filling this process's memory."""

    def __init__(self, size: int):
        self._queue: queue.Queue[list[Event]] = queue.Queue(maxsize=size)
        self._held: list[Event] = []  # taken from the queue beyond what one poll hands out

    def put(self, batch: list[Event]) -> None:
        self._queue.put(batch)

    def take(self, timeout: float) -> list[Event]:
        """The events that arrived (at most ``MAX_BATCH``, gathered for at most ``MAX_BATCH_SECONDS``),
        waiting at most ``timeout`` seconds for the first."""
        batch, self._held = self._held, []
        started = time.monotonic()
        try:
            if not batch:
                batch = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
            while len(batch) < MAX_BATCH and time.monotonic() - started < MAX_BATCH_SECONDS:
                batch += self._queue.get_nowait()
        except queue.Empty:
            pass
        if len(batch) > MAX_BATCH:
            batch, self._held = batch[:MAX_BATCH], batch[MAX_BATCH:]
        return batch


def stop_then_wait(stop: Callable[[], None], over: Callable[[], bool], limit: float,
                   wait: Callable[[], object] = lambda: time.sleep(0.02),
                   clock: Callable[[], float] = time.monotonic) -> bool:
    """Ask for the end (``stop``, unless it is ``over`` already), then wait up to ``limit`` seconds for it,
    calling ``wait`` between looks (a pause, or the follower folding the job's events meanwhile). True
    once it is over; a limit of 0 asks without waiting."""
    if not over():
        stop()
    deadline = clock() + limit
    while not over() and clock() < deadline:
        wait()
    return over()


def watchdog(argv: list[str]) -> subprocess.Popen:
    """A process of its own session that runs ``argv`` (which ends the job) when the notebook's end of
    its pipe closes without saying "ended": the kernel exited or was killed (``release`` tells it)."""
    return subprocess.Popen(["/bin/sh", "-c", 'read word; [ "$word" = ended ] || exec "$@"', "watchdog", *argv],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def release(watchdog: subprocess.Popen) -> None:
    """The job has ended: its watchdog leaves without doing anything."""
    try:
        assert watchdog.stdin is not None
        watchdog.stdin.write(b"ended\n")
        watchdog.stdin.close()
    except OSError:
        pass
    watchdog.wait()
