"""The job handle a cell gives back (``--out NAME``): status, ranks, logs, cancel.

It folds the backend's events into per-rank state and writes every rank's output to the
job folder as it arrives, so the full logs survive while memory holds only recent lines.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

from . import events, launcher
from .errors import JobError, RankExitError, RankFailure, RemoteRankError
from .view.model import JobModel, RankState

_FLUSH_BYTES = 1 << 20
_FLUSH_SECONDS = 0.5


class Job:
    """One run of a cell. ``status`` is running, completed, failed or stopped.

    ``ranks[r]`` has ``rank``, ``instance``, ``local_rank``, ``host``, ``pid``, ``status``,
    ``n`` and ``total`` (its progress); ``progress`` is the fraction done over all ranks;
    ``widget`` is the live dashboard (None where none is shown).
    """

    def __init__(self, name: str, backend: str, world_size: int, procs_per_instance: int,
                 clock: Callable[[], float] = time.monotonic):
        self.name, self.backend, self.world_size = name, backend, world_size
        self.job_dir = ""
        self.status = "running"
        self.model = JobModel(name, backend, world_size, procs_per_instance, clock)
        self.widget = None
        self.unreturned: dict[str, str] = {}
        self.returncode: int | None = None
        self.first_failure_at: float | None = None
        self.cancelled = False
        self.result_digests: dict[int, str] = {}  # as each rank reported them
        self.error: BaseException | None = None  # how a job followed in the background ended
        self.follower: threading.Thread | None = None  # the thread following it, with --async
        self._cancel: Callable[[], None] | None = None
        self._clock = clock
        self._launcher_lines: list[str] = []
        self._pending: dict[str, list[str]] = {}
        self._pending_bytes = 0
        self._last_flush = clock()

    # -- folding events -------------------------------------------------------------------

    def start(self, job_dir: str, cancel: Callable[[], None]) -> None:
        """The job was submitted: its folder and how to stop it are known now."""
        self.job_dir, self._cancel = job_dir, cancel

    @property
    def ranks(self) -> list[RankState]:
        return self.model.ranks

    @property
    def progress(self) -> float | None:
        return self.model.progress()

    def record(self, event: events.Event) -> None:
        self.model.fold(event)
        if isinstance(event, events.Output):
            prefix = "" if event.stream == "stdout" else "[stderr] "
            self._log(f"rank-{event.rank}.log", prefix + event.text)
            self._log("all.log", f"[rank {event.rank}] {prefix}{event.text}")
        elif isinstance(event, events.LauncherOutput):
            self._launcher_lines.append(event.text)
            self._log("launcher.log", event.text)
        elif isinstance(event, events.RankFinished):
            if event.ok and event.results:
                self.result_digests[event.rank] = event.results
            if event.ok and event.rank == 0:
                self.unreturned.update(event.unreturned)
            elif not event.ok and event.error_type != "KeyboardInterrupt" and self.first_failure_at is None:
                self.first_failure_at = self._clock()
        elif isinstance(event, events.LauncherExited):
            self.returncode = event.returncode
            self.flush_logs()
        if self._pending_bytes > _FLUSH_BYTES or self._clock() - self._last_flush > _FLUSH_SECONDS:
            self.flush_logs()

    def _log(self, filename: str, line: str) -> None:
        self._pending.setdefault(filename, []).append(line + "\n")
        self._pending_bytes += len(line) + 1

    def flush_logs(self) -> None:
        if not self.job_dir:
            return
        for filename, lines in self._pending.items():
            with open(os.path.join(self.job_dir, "logs", filename), "a", encoding="utf-8") as f:
                f.writelines(lines)
        self._pending.clear()
        self._pending_bytes = 0
        self._last_flush = self._clock()

    # -- ending ---------------------------------------------------------------------------

    def finish(self, stopped: bool = False) -> JobError | None:
        """Settle every rank's status once the launcher is gone; the error to raise, if any."""
        self.flush_logs()
        reports = launcher.exit_reports("\n".join(self._launcher_lines))
        for state in self.ranks:
            report = reports.get(state.rank)
            if state.status in ("starting", "running"):
                if report and not stopped:
                    state.status = "failed"
                    state.failure = RankFailure(state.rank, state.instance, state.host, message=report)
                else:
                    state.status = "stopped"
            elif state.failure is not None and not state.failure.error_type and report:
                state.failure.message = report  # "exited before the cell finished" -> its exit status
        error = self._error(stopped)
        self.status = "stopped" if stopped else "failed" if error else "completed"
        self.model.fold(events.Phase(self.status))
        return error

    def _error(self, stopped: bool) -> JobError | None:
        if stopped or all(s.status == "completed" for s in self.ranks):
            return None  # every rank reported success: how the launcher ended does not matter
        failed = [s.failure for s in self.ranks if s.failure is not None]
        raised = [f for f in failed if f.error_type]
        if raised:
            return RemoteRankError(raised, self.world_size)
        if failed:
            return RankExitError(failed)
        tail = "\n".join(line for line in self._launcher_lines[-20:] if line.strip())
        unfinished = [s.rank for s in self.ranks if s.status != "completed"]
        return RankExitError([], f"ranks {unfinished} stopped before the cell finished; the launcher exited with "
                                 f"status {self.returncode}" + (f":\n{tail}" if tail else ""))

    # -- for the user -----------------------------------------------------------------------

    def logs(self, rank: int | None = None) -> str:
        """One rank's output (stderr lines marked), or every rank's with rank prefixes."""
        self.flush_logs()
        if not self.job_dir:
            return ""
        filename = "all.log" if rank is None else f"rank-{rank}.log"
        try:
            with open(os.path.join(self.job_dir, "logs", filename), encoding="utf-8") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    @property
    def done(self) -> bool:
        return self.status != "running"

    def wait(self, timeout: float | None = None) -> None:
        """Wait for a job started with --async; raises what the cell would have raised."""
        if self.follower is not None:
            self.follower.join(timeout)
            if self.follower.is_alive():
                raise TimeoutError(f"job {self.name} is still {self.status} after {timeout:g}s")
        if self.error is not None:
            raise self.error

    def cancel(self) -> None:
        """Stop every rank of this job now (the running cell then raises JobError)."""
        if self.status == "running" and self._cancel is not None:
            self.cancelled = True
            self._cancel()

    def __repr__(self) -> str:
        counts: dict[str, int] = {}
        for state in self.ranks:
            counts[state.status] = counts.get(state.status, 0) + 1
        summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        return f"<mpi_magic.Job {self.name} {self.backend} {self.status}: {self.world_size} ranks ({summary})>"
