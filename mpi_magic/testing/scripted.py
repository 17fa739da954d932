"""A test double for a backend: plays a script of events on a fake clock.

It lets the follower's logic (watching, --timeout, stopping the others after a failure,
lingering after success, interrupts, cancel(), collecting results) be tested in milliseconds
and without sleeping; the local backend's real-mpirun tests check the contract it stands for.

    clock = FakeClock()
    job = ScriptedJob(clock, [(0.0, RankStarted(...)), (1.0, RankFinished(...)), (1.5, LauncherExited(0))])

``declaration()`` makes it a backend like the others, which the tests register: ``--backend scripted``
runs each rank of a cell here, in this process, one after another, and plays what they did as a job;
its sessions' ranks (``PlayedSessionRanks``) keep a namespace each from cell to cell.
"""

from __future__ import annotations

import contextlib
import io
import os
import queue
import threading
import time
import traceback
from typing import TYPE_CHECKING, Callable, Iterable, Union, cast

from ..backends.base import Declaration
from ..options import JOB, Option, Setting, positive_float
from ..runtime import cell_loop
from ..runtime import rank as rank_runtime
from ..shared import channel, payload, reporting, wire
from ..shared.events import (Event, LauncherExited, LauncherOutput, Output, RankFinished, RankStacks, RankStarted,
                             StreamDecoder)
from ..shared.layout import RESULTS, result_path

if TYPE_CHECKING:
    from ..backends.base import Backend, BackendJob, SessionBackend, SessionRanks
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

    def start_session(self, name: str, options: LaunchOptions, config: Config) -> PlayedSessionRanks:
        return PlayedSessionRanks(name, options)


class PlayedCells(cell_loop.LocalCells):
    """A played rank's cells: payloads and results in the notebook's job folders, as a local session's
    ranks have them; nothing to listen on (the notebook hands the cell over in this process)."""

    def __init__(self) -> None:
        self.source = None


class PlayedSessionRanks:
    """A session's ranks as the scripted backend plays them: each rank a namespace of its own in the
    notebook's process, kept from cell to cell. A cell sent runs on each rank in turn through the
    session runtime's own ``run_cell`` (the rank's placement in the environment meanwhile), and what
    each printed and reported comes back as its events, decoded as a launcher's lines are. Rank 0's
    wait for the next cell ends the session after ``--max-idle``, in the runtime's words. Nothing runs
    beside the notebook: no MPI between the ranks, and a cell that blocks, blocks the notebook."""

    stop_description = "a scripted stop"
    job_name = None
    latency = 0.0
    start_limit = 10.0
    launcher = None
    stacks_dir = None
    released = None

    def __init__(self, name: str, options: LaunchOptions):
        self.name = name
        self._world_size, self._per_instance = options.world_size, options.procs_per_instance
        self._idle_timeout = options.max_idle
        self._token = wire.new_token()
        self._decoder = StreamDecoder(self._token)
        self._namespaces = [rank_runtime.new_namespace() for _ in range(self._world_size)]
        self._events: queue.Queue[Event] = queue.Queue()
        self._finished = self._closed = False
        self._idle_since = time.monotonic()
        self._cells = PlayedCells()
        self._written: list[str] = []  # the lines the rank being played emits (each rank numbers its own)
        self._playing = threading.Lock()  # one rank played at a time (a cell sent, or the pump's idle end)
        self._emitters = [wire.Emitter(rank, self._written.append, self._token) for rank in range(self._world_size)]
        for rank in range(self._world_size):
            self._as_rank(rank, _started)

    def _as_rank(self, rank: int, play: Callable[[wire.Emitter, rank_runtime.Placement], None]) -> None:
        """``play`` as ``rank``: its placement in the environment, what it prints and emits captured."""
        per_instance = self._per_instance
        place = rank_runtime.Placement(rank, self._world_size, rank // per_instance, rank % per_instance, per_instance,
                                       self._world_size // per_instance)
        with self._playing:
            self._written.clear()
            kept = dict(os.environ)
            printed = io.StringIO()
            try:
                rank_runtime.export_placement(place, os.environ)
                with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
                    play(self._emitters[rank], place)
            finally:  # what the rank changed in the environment is undone, and nothing else touched
                for name in {*kept, *os.environ}:
                    if os.environ.get(name) != kept.get(name):
                        if name in kept:
                            os.environ[name] = kept[name]
                        else:
                            del os.environ[name]
            for line in printed.getvalue().splitlines():
                self._events.put(Output(rank, "stdout", line))
            for event in self._decoder.feed_rank(rank, [line.rstrip("\n") for line in self._written]):
                self._events.put(event)

    @property
    def finished(self) -> bool:
        return self._finished and self._events.empty()

    def poll(self, timeout: float) -> list[Event]:
        if self._idle_timeout and not self._closed and time.monotonic() - self._idle_since >= self._idle_timeout:
            self.close(cell_loop.idle_reason(self._idle_timeout))
        try:
            batch = [self._events.get(timeout=timeout)]
        except queue.Empty:
            return []
        while not self._events.empty():
            batch.append(self._events.get_nowait())
        return batch

    def connect(self) -> bool:
        return True

    def send_cell(self, number: int, job_dir: str, digest: str | None) -> None:
        message = channel.cell_message(number, job_dir, digest)

        def run(emitter: wire.Emitter, place: rank_runtime.Placement) -> None:
            cell_loop.run_cell(message, place, emitter, reporting.Reporter(emitter), self._namespaces[place.rank],
                               _NO_INTERRUPTS, self._cells)
            emitter.emit(wire.READY, cell=number)

        for rank in range(self._world_size):
            self._as_rank(rank, run)
        self._idle_since = time.monotonic()

    def close(self, reason: str) -> None:
        """Every rank leaves, rank 0 saying why, as the runtime's do."""
        if self._closed:
            return
        self._closed = True
        self._as_rank(0, lambda emitter, place: emitter.emit(wire.CLOSING, reason=reason))
        self._events.put(LauncherExited(0))
        self._finished = True

    def fetch_results(self, job_dir: str, ranks: Iterable[int], kind: str = RESULTS) -> None:
        """The ranks wrote them into the cell's folder already."""

    def interrupt(self, pids: dict[int, int]) -> None:
        """A played cell has run to its end by the time an interrupt could come."""

    def request_stacks(self) -> bool:
        return False  # (a played rank has no thread of its own to be asked on)

    def memory(self, pids: dict[int, int]) -> dict[int, int]:
        return {}

    def facts(self) -> list[str]:
        return []

    def stop(self, wait: bool = True) -> None:
        self.close("stopped")

    def let_go(self, reason: str) -> None:
        self.stop(wait=False)


def _started(emitter: wire.Emitter, place: rank_runtime.Placement) -> None:
    """A played rank's start, as the runtime's: where it runs, then waiting for the first cell."""
    rank_runtime.announce(emitter, place)
    emitter.emit(wire.READY, cell=0)


class _NoInterrupts(cell_loop.CellInterrupts):
    """A played cell runs to its end (the notebook's own SIGINT handler stays as it is)."""

    def __init__(self) -> None:
        self.armed = False


_NO_INTERRUPTS = _NoInterrupts()


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

    def _is_session_backend(backend: PlayedBackend) -> SessionBackend:
        return backend

    def _is_session_ranks(ranks: PlayedSessionRanks) -> SessionRanks:
        return ranks
