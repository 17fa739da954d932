"""Slurm's word on this kernel's jobs: one batched ``squeue`` per poll for all of them, paced from
2 s up to 30 s (sites ask clients not to poll more often; many forbid a call per job), sooner
again when a job is added or stopped. ``sacct`` is not used: small clusters run without it."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ...shared.events import QUEUED, RUNNING, Allocation
from ...shared.slurmtime import seconds
from . import commands

FIRST, LONGEST, GROWTH = 2.0, 30.0, 1.5  # seconds between polls: the first, the longest, and the step
FORMAT = "%i|%T|%r|%S|%l|%L|%N"  # job id, state, reason, (estimated) start, time limit, time left, nodes
# Slurm writes a job without a time limit as UNLIMITED (INFINITE), or as one of a year (365-00:00:00,
# counting down); with a limit it cannot tell (INVALID, NOT_SET, N/A), the time left is unknown
NO_LIMIT, NO_LIMIT_WORDS = 365 * 86400.0, frozenset({"UNLIMITED", "INFINITE"})
# Slurm's backfill puts a job it cannot plan (one waiting behind jobs without a time limit) a year
# ahead: an estimate this far out says "unknown", and is not shown
UNPLANNED = 300 * 86400.0
ENDED = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
                   "PREEMPTED", "SPECIAL_EXIT", "TIMEOUT"})
# a job listed in one of these after it ran is back in the queue: Slurm requeued it (a failed node, where
# the cluster requeues jobs)
REQUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD"})


@dataclass(frozen=True)
class JobState:
    state: str
    reason: str = ""
    starts: float | None = None  # epoch seconds (estimated while pending)
    time_left: float | None = None  # seconds, when read; math.inf: no limit; None: unknown
    nodes: str = ""  # Slurm's node list once it runs ("n[1-2]")

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    def allocation(self) -> Allocation:
        """squeue's word in the view's terms (PENDING is queued, RUNNING running; Slurm's reason "None" none)."""
        state = {"PENDING": QUEUED, "RUNNING": RUNNING}.get(self.state, self.state.lower())
        return Allocation(state, "" if self.reason == "None" else self.reason, self.starts, self.time_left, "Slurm")


def parse(text: str) -> dict[str, JobState]:
    """``squeue -h -o FORMAT`` -> {job id: state}."""
    found = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 7:
            continue
        job_id, state, reason, start, limit, left, nodes = fields
        found[job_id] = JobState(state.split()[0] if state else "", reason, _epoch(start), _time_left(limit, left),
                                 nodes)
    return found


def _time_left(limit: str, left: str) -> float | None:
    """squeue's time left in seconds; math.inf for a job without a time limit; None where Slurm's
    figures cannot be read."""
    limit_seconds = seconds(limit)
    if limit.strip().upper() in NO_LIMIT_WORDS or (limit_seconds is not None and limit_seconds >= NO_LIMIT):
        return math.inf
    return None if limit_seconds is None else seconds(left)


def look(job_ids: list[str]) -> dict[str, JobState] | None:
    """The jobs' states, from one ``squeue``; None when it could not answer (slurmctld busy)."""
    try:
        shown = commands.run("squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-o", FORMAT)
    except Exception:  # noqa: BLE001 - a slow controller: the caller asks again later
        return None
    if shown.returncode != 0:
        return {} if "Invalid job id" in shown.stderr else None  # every one of them is gone from its memory
    return parse(shown.stdout)


def _epoch(text: str) -> float | None:
    try:
        when = time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None  # N/A, Unknown
    return None if when - time.time() > UNPLANNED else when


class QueueWatcher:
    """Calls each watched job's callback with its state after every poll (None: Slurm no longer
    lists it), from one thread that runs while there is a job to watch."""

    def __init__(self) -> None:
        self._jobs: dict[str, Callable[[JobState | None], None]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.interval = FIRST
        self.calls = 0  # squeue calls made, for the tests that count them

    def watch(self, job_id: str, callback: Callable[[JobState | None], None]) -> None:
        with self._lock:
            self._jobs[job_id] = callback
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="mpi_magic squeue", daemon=True)
                self._thread.start()
        self.hurry()

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._jobs.pop(job_id, None)
            if not self._jobs:
                self._wake.set()  # the thread ends now instead of after its wait

    def hurry(self) -> None:
        """Poll now, and pace up again from the first interval (a job was added or stopped)."""
        self.interval = FIRST
        self._wake.set()

    def _run(self) -> None:
        while True:
            with self._lock:
                jobs = dict(self._jobs)
                if not jobs:
                    self._thread = None
                    return
            self._wake.clear()
            states = self._poll(list(jobs))
            if states is not None:
                for job_id, callback in jobs.items():
                    callback(states.get(job_id))
            wait = self.interval
            self.interval = min(wait * GROWTH, LONGEST)  # (unless a hurry sets it back meanwhile)
            self._wake.wait(wait)

    def _poll(self, job_ids: list[str]) -> dict[str, JobState] | None:
        self.calls += 1
        return look(job_ids)


WATCHER = QueueWatcher()
