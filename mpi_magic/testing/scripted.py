"""A test double for a backend: plays a script of events on a fake clock.

It lets the follower's logic (watching, --timeout, stopping the others after a failure,
lingering after success, interrupts, cancel(), collecting results) be tested in milliseconds
and without sleeping; the local backend's real-mpirun tests check the contract it stands for.

    clock = FakeClock()
    job = ScriptedJob(clock, [(0.0, RankStarted(...)), (1.0, RankFinished(...)), (1.5, LauncherExited(0))])

``declaration()`` makes it a backend like the others, which the tests register: ``--backend scripted``
runs each rank of a cell here, in this process, one after another, and plays what they did as a job.
"""

from __future__ import annotations

import contextlib
import io
import os
import traceback
from typing import TYPE_CHECKING, Callable, Union, cast

from ..backends.base import Declaration
from ..options import JOB, Option, Setting, positive_float
from ..shared import payload
from ..shared.events import Event, LauncherExited, LauncherOutput, Output, RankFinished, RankStacks, RankStarted
from ..shared.layout import RESULTS, result_path

if TYPE_CHECKING:
    from ..backends.base import Backend, BackendJob
    from ..options import Config, LaunchOptions

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
    script still had. ``results`` is called as ``results(job_dir, ranks)`` by ``fetch_results``. Where
    ``stacks`` gives ranks' frames ({rank: [(filename, line, function), ...]}), ``request_stacks()`` is
    recorded in ``asked`` and each of those ranks answers ``answer_after`` seconds later, as ranks asked
    through their job's channel do; elsewhere it asks nothing.
    """

    launcher = None  # played from a script: no launcher process
    stacks_dir = None  # no rank process here to signal
    name = "scripted"
    host = "scripted-host"

    def __init__(self, clock: FakeClock, script: list[tuple[float, Step]], abort_grace: float | None = 3.0,
                 linger: float | None = 3.0, stops_after: float | None = 0.5,
                 results: Callable[[str, object], None] | None = None,
                 stacks: dict[int, list[tuple[str, int, str]]] | None = None, answer_after: float = 0.5):
        self.clock = clock
        self.stacks, self.answer_after = stacks, answer_after
        self.asked: list[float] = []
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
        if self.stacks is None or self._finished:
            return False
        self.asked.append(self.clock.elapsed)
        at = self.clock.now + self.answer_after
        self._script += [(at, 2_000_000 + rank, RankStacks(rank, [list(frame) for frame in frames]))
                         for rank, frames in self.stacks.items()]
        self._script.sort(key=lambda item: item[:2])
        return True

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


class PlayedBackend:
    """The scripted backend as ``--backend scripted`` makes it: each rank runs the cell here, in turn,
    in a namespace of its own made from the payload; what it printed, its end and its results are then
    played as the job's events, ``pace`` seconds apart on a fake clock (no real time passes)."""

    pins_digest = False
    stop_description = "a scripted stop"

    def __init__(self, name: str, pace: float):
        self.name, self.pace = name, pace

    def check(self, options: LaunchOptions) -> list[str]:
        return []

    def unpriced(self, options: LaunchOptions) -> str | None:
        return "a scripted job has no price"

    def plan(self, job_dir: str, job_name: str, digest: str | None, options: LaunchOptions) -> str:
        return f"would play {options.world_size} ranks, {self.pace:g} s apart"

    def submit(self, job_dir: str, job_name: str, digest: str | None, options: LaunchOptions) -> ScriptedJob:
        bundle = payload.read(os.path.join(job_dir, payload.PAYLOAD_FILE))
        script: list[tuple[float, Step]] = []
        for rank in range(options.world_size):
            at = rank * self.pace
            script.append((at, RankStarted(rank, rank // options.gpus, rank % options.gpus, options.world_size,
                                           host="scripted-host")))
            printed, finished = _run_rank(bundle, job_dir, rank)
            script += [(at, Output(rank, "stdout", line)) for line in printed] + [(at, finished)]
        script.append((options.world_size * self.pace, LauncherExited(0)))
        return ScriptedJob(FakeClock(), script, linger=None)


def _run_rank(bundle: payload.Bundle, job_dir: str, rank: int) -> tuple[list[str], RankFinished]:
    """Run the cell as ``rank`` would: the lines it printed, and its end (rank 0 writes its results file)."""
    namespace = {"__name__": "__main__", **bundle.load_all()[0]}
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(bundle.meta["source"], namespace)
    except Exception as exc:  # noqa: BLE001 - the rank's failure, reported as a rank reports it
        return out.getvalue().splitlines(), RankFinished(rank, False, type(exc).__name__, str(exc),
                                                         traceback.format_exc())
    returned = [payload.pack_result(name, namespace[name]) for name in bundle.meta["returns"] if name in namespace]
    os.makedirs(os.path.dirname(result_path(job_dir, rank)), exist_ok=True)
    digest = payload.write(result_path(job_dir, rank), returned, {"rank": rank}) if rank == 0 else None
    return out.getvalue().splitlines(), RankFinished(rank, True, results_digest=digest or "")


def declaration(name: str = "scripted") -> Declaration:
    """The scripted backend as a fourth one, for the registry (``registry.register``): it declares an
    option (``--pace``) and a setting (``scripted_pace``) of its own, as every backend may."""
    pace = Setting("scripted_pace", 0.5, positive_float, f"{name}: seconds between one rank's end and the next's")

    def values(args, config: Config) -> dict:
        return {"pace": config.pick("scripted_pace", args.pace)}

    def make(config: Config, options: LaunchOptions) -> PlayedBackend:
        return PlayedBackend(name, options.settings["pace"])

    return Declaration(
        name=name, about="ranks played from a script, for tests", make=make, default_gpus=lambda settings: 1,
        max_ranks=64, why_max="it plays each rank in turn in the notebook's process",
        options=(Option(JOB, ("--pace",), {"default": None, "metavar": "SECONDS",
                                           "help": f"{name}: seconds between one rank's end and the next's."},
                        only=name),),
        settings=(pace,), values=values,
    )


if TYPE_CHECKING:  # read by the type checker only: these are a Backend and its BackendJob
    def _is_backend(backend: ScriptedBackend) -> Backend:
        return backend

    def _is_played_backend(backend: PlayedBackend) -> Backend:
        return backend

    def _is_backend_job(job: ScriptedJob) -> BackendJob:
        return job
