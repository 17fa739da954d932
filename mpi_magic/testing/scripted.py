"""A test double for a backend: plays a script of events on a fake clock.

It lets the follower's logic (watching, --timeout, stopping the others after a failure,
lingering after success, interrupts, cancel(), collecting results) be tested in milliseconds
and without sleeping; the local backend's real-mpirun tests check the contract it stands for.

    clock = FakeClock()
    job = ScriptedJob(clock, [(0.0, RankStarted(...)), (1.0, RankFinished(...)), (1.5, LauncherExited(0))])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Union, cast

from ..shared.events import Event, LauncherExited, LauncherOutput
from ..shared.layout import RESULTS

if TYPE_CHECKING:
    from ..backends.base import Backend, BackendJob

# At its time, a step is delivered (an event), raised in the watching thread (an exception,
# e.g. KeyboardInterrupt), or called (a function, e.g. the user's job.cancel()).
Step = Union[Event, BaseException, Callable[[], None]]


class FakeClock:
    """A monotonic clock that moves only when the scripted job waits."""

    def __init__(self, start: float = 100.0):
        self.now = start
        self.start = start

    def __call__(self) -> float:
        return self.now

    @property
    def elapsed(self) -> float:
        return self.now - self.start


class ScriptedJob:
    """A running job whose events come from ``script``: [(seconds after start, step), ...].

    ``cancel()`` is recorded in ``cancels`` (times since start); unless ``stops_after`` is None,
    the job then ends that many seconds after the first cancel with ``LauncherExited(-2)``, dropping what the
    script still had. ``results`` is called as ``results(job_dir, ranks)`` by ``fetch_results``.
    """

    launcher = None  # played from a script: no launcher process
    stacks_dir = None  # no rank process here to signal
    name = "scripted"
    host = "scripted-host"

    def __init__(self, clock: FakeClock, script: list[tuple[float, Step]], abort_grace: float | None = 3.0,
                 linger: float | None = 3.0, stops_after: float | None = 0.5,
                 results: Callable[[str, object], None] | None = None):
        self.clock = clock
        self.abort_grace, self.linger = abort_grace, linger
        self.stops_after = stops_after
        self._script = sorted(((clock.start + at, i, step) for i, (at, step) in enumerate(script)),
                              key=lambda item: item[:2])
        self._results = results
        self._finished = False
        self.cancels: list[float] = []
        self.fetched: list[list[int]] = []

    @property
    def finished(self) -> bool:
        return self._finished

    def poll(self, timeout: float) -> list[Event]:
        """What is due now; if nothing is, the clock moves to the next step or by ``timeout``."""
        if not self._due() and self._script:
            self.clock.now = min(self._script[0][0], self.clock.now + timeout)
        elif not self._script:
            self.clock.now += timeout
        batch: list[Event] = []
        while self._due():
            _, _, step = self._script.pop(0)
            if isinstance(step, BaseException):
                if batch:  # deliver what came before first, as a real pipe would
                    self._script.insert(0, (self.clock.now, -1, step))
                    break
                raise step
            if callable(step) and not isinstance(step, type):
                step()
                continue
            batch.append(cast(Event, step))  # neither an exception nor a function: an event
            if isinstance(step, LauncherExited):
                self._finished = True
                self._script.clear()
        return batch

    def _due(self) -> bool:
        return bool(self._script) and self._script[0][0] <= self.clock.now

    def cancel(self) -> None:
        self.cancels.append(self.clock.elapsed)
        if self.stops_after is not None and not self._finished and len(self.cancels) == 1:
            at = self.clock.now + self.stops_after
            self._script = [item for item in self._script if item[0] < at and not isinstance(item[2], LauncherExited)]
            self._script.append((at, len(self.cancels) + 1_000_000, LauncherOutput("scripted: stopped")))
            self._script.append((at, len(self.cancels) + 1_000_001, LauncherExited(-2)))

    def request_stacks(self) -> bool:
        return False

    def fetch_results(self, job_dir: str, ranks, kind: str = RESULTS) -> None:
        if kind != RESULTS:  # a failed rank's frames: a scripted job has none
            return
        self.fetched.append(list(ranks))
        if self._results is not None:
            self._results(job_dir, ranks)


class ScriptedBackend:
    """Hands out one prepared ``ScriptedJob``, as a backend's ``submit`` would."""

    name = "scripted"
    pins_digest = False
    stop_description = "a scripted stop"

    def __init__(self, job: ScriptedJob):
        self.job = job

    def check(self, options) -> list[str]:
        return []

    def unpriced(self, options) -> str | None:
        return None  # its script's Billing events carry the price

    def plan(self, job_dir: str, job_name: str, digest: str | None, options) -> str:
        return f"would play {len(self.job._script)} scripted steps"

    def submit(self, job_dir: str, job_name: str, digest: str | None, options) -> ScriptedJob:
        return self.job


if TYPE_CHECKING:  # read by the type checker only: these are a Backend and its BackendJob
    def _is_backend(backend: ScriptedBackend) -> Backend:
        return backend

    def _is_backend_job(job: ScriptedJob) -> BackendJob:
        return job
