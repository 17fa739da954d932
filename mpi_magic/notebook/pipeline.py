"""One cell pipeline: prepare -> submit -> follow -> collect, for a one-off cell, a session's
cell and a job started earlier (``%mpirun_attach``). No IPython shell in here.

What differs between the three is a route's (``CellRoute``): how the job folder is prepared
(capture and pack the cell; for a session, only the values its ranks do not hold), what
submitting means (a backend's job, a cell sent to waiting ranks, a job found by name), and
what following and collecting add (a session's teardown, what its ranks now hold).
Everything that can be wrong with the input is found before the job folder is even made;
an interrupt or a timeout stops every rank before the cell raises.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

from IPython.core.error import UsageError

from ..backends import registry
from ..backends.base import AttachableBackend, Backend, BackendJob, SessionBackend
from ..backends.follow import stop_then_wait
from ..errors import JobError, JobTimeoutError, MpiMagicError, PayloadError, RemoteRankError, ResultsLost
from ..options import Config, LaunchOptions
from ..shared import cell, jobdir, payload
from ..shared.cost import budget_reached, dollars
from ..shared.events import LauncherExited, Output, Phase, RollCall, StopRequested
from ..shared.layout import POST_MORTEM, VALUE_NAME, result_path
from ..shared.rebind import is_notebook_function, rebind
from ..view import View, make_view
from ..view.console import ConsoleEcho
from . import capture, tracking
from .holdings import Selection
from .job import Job
from .session import Session, SessionCell

STOP_LIMIT = 600.0  # seconds to wait for a stopped job to end (a cloud job takes minutes)
POLL_SECONDS = 0.1  # longest wait for the backend's next events before the view is redrawn
INTERRUPT_ROLL_CALL = 2.0  # seconds the ranks get to give their stacks when a cell is interrupted
INTERRUPT_ASKED_ROLL_CALL = 10.0  # the same, for ranks asked through their job's channel (Slurm, S3 and a log)


@dataclass
class CellRun:
    job: Job | None  # None after --dry-run
    values: dict[str, Any] = field(default_factory=dict)
    output: Any = None
    has_output: bool = False


@dataclass
class Prepared:
    """A job folder ready to submit: its payload written, and what comes back from it."""

    job_name: str
    job_dir: str
    digest: str | None
    returns: list[str]
    gather: bool
    source: str = ""  # the cell's code, for where a rank is ("cell line 7")
    cell_file: str = cell.FILENAME  # what the cell's code is compiled under


class CellRoute(Protocol):
    """Where a cell's job goes: what the pipeline's steps do there."""

    @property
    def backend_name(self) -> str:
        """As the view and job.json show it."""

    @property
    def world_size(self) -> int: ...

    @property
    def procs_per_instance(self) -> int: ...

    def prepare(self, config: Config, echo: ConsoleEcho) -> Prepared | None:
        """The job folder with its payload; None after --dry-run (the plan was printed)."""

    def submit(self, prepared: Prepared) -> BackendJob:
        """Start the job (or find it), returning what the follower watches."""

    def follow_settings(self, prepared: Prepared, echo: ConsoleEcho | None, clock: Callable[[], float]) -> FollowSettings:
        """How to follow it: the stop's wording, the timeout, what to say once stopped."""

    def follow(self, follower: Follower) -> CellRun:
        """Follow the job to its end and collect its results."""

    def tracked(self, job_name: str) -> tracking.JobRecord | None:
        """What records the job in a tracking service (``--mlflow``), if anything does."""


def run_cell(source: str, namespace: Mapping[str, Any], options: LaunchOptions, config: Config,
             on_job: Callable[[Job], None] = lambda job: None, echo: ConsoleEcho | None = None,
             clock: Callable[[], float] = time.monotonic,
             deliver: Callable[[dict], None] = lambda values: None,
             cell_names: capture.CellNames = lambda filename: None, cell_file: str = cell.FILENAME) -> CellRun:
    """Run ``source`` (plain Python) as ``options.world_size`` ranks, as a job of its own.

    With ``options.run_async`` it returns once the job is submitted and ``deliver`` receives
    the values when the job has succeeded. ``cell_names`` names the notebook's cells that the
    code it sends comes from, as the notebook's tracebacks do; the cell's own code is compiled
    as ``cell_file``, which ``cell.name_cell`` may have named.
    """
    code = capture.analyze(source, cell_file)
    backend = registry.make(options.backend, config, options)
    return _run(OneOffCell(backend, code, namespace, options, cell_names), options, config, on_job,
                echo or ConsoleEcho(), clock, deliver)


def run_in_session(session: Session, source: str, namespace: Mapping[str, Any], options: LaunchOptions,
                   config: Config, on_job: Callable[[Job], None] = lambda job: None,
                   echo: ConsoleEcho | None = None, clock: Callable[[], float] = time.monotonic,
                   cell_names: capture.CellNames = lambda filename: None, cell_file: str = cell.FILENAME) -> CellRun:
    """Run ``source`` on the session's ranks, sending only the values they do not hold."""
    code = capture.analyze(source, cell_file)
    echo = echo or ConsoleEcho()
    return _run(SessionCellRoute(session, code, namespace, options, echo, cell_names), options, config, on_job,
                echo, clock)


def attach(name: str, namespace, config: Config, echo: ConsoleEcho | None = None,
           clock: Callable[[], float] = time.monotonic) -> CellRun:
    """Follow a job started earlier (by this or another kernel) to its end: the dashboard is
    rebuilt from its logs and status, and its results come back."""
    return _run(AttachedJob(registry.attachable(config), name, namespace), LaunchOptions(), config,
                lambda job: None, echo or ConsoleEcho(), clock)


def _run(route: CellRoute, options: LaunchOptions, config: Config, on_job: Callable[[Job], None],
         echo: ConsoleEcho, clock: Callable[[], float],
         deliver: Callable[[dict], None] = lambda values: None) -> CellRun:
    """prepare -> submit -> follow -> collect."""
    prepared = route.prepare(config, echo)
    if prepared is None:
        return CellRun(None)
    job = Job(prepared.job_name, route.backend_name, route.world_size, route.procs_per_instance, clock)
    job.model.stall_after = config.get("stall_after")
    view = None if options.quiet else _open_view(config, job, echo)
    record = route.tracked(prepared.job_name)  # (once made, it is ended whatever happens)
    try:
        job.model.fold(Phase("submitting"))
        backend_job = route.submit(prepared)
    except BaseException as exc:
        job.model.fold(LauncherExited(None, refused="the job could not be submitted"))  # it never started
        job.model.fold(Phase(job.status, "could not be submitted"))
        jobdir.record(prepared.job_dir, status=job.status, ended=time.time())
        jobdir.finished(prepared.job_dir)
        if view is not None:
            view.close()
        if record is not None:
            record.ended(job, exc, echo.say)
        raise
    job.start(prepared.job_dir, backend_job.cancel, backend_job.stacks_dir, prepared.source, backend_job.request_stacks,
              prepared.cell_file)
    job.view = view
    if backend_job.launcher is not None:  # pruning spares the folder of a job whose launcher runs
        pid, started = backend_job.launcher
        jobdir.record(prepared.job_dir, launcher_pid=pid, launcher_started=started)
    else:  # the ranks run elsewhere and fill the folder (Slurm), or this kernel will (SageMaker): it is spared
        import psutil  # while the kernel that follows the job runs

        jobdir.record(prepared.job_dir, follower_pid=os.getpid(), follower_started=psutil.Process().create_time())
    if isinstance(route, (OneOffCell, ExportedCell)):
        job.launch = options
    on_job(job)
    quiet_echo = None if options.quiet or options.run_async else echo
    follower = Follower(job, backend_job, route.follow_settings(prepared, quiet_echo, clock), record)
    if options.run_async:
        return follower.in_background(lambda run: deliver(run.values))
    return route.follow(follower)


class OneOffCell:
    """A cell run as a job of its own on ``backend``: everything it reads is packed and sent."""

    def __init__(self, backend: Backend, code: capture.CellCode, namespace: Mapping[str, Any], options: LaunchOptions,
                 cell_names: capture.CellNames):
        self.backend, self.code, self.namespace, self.options = backend, code, namespace, options
        self.cell_names = cell_names
        self.backend_name, self.world_size = backend.name, options.world_size
        self.procs_per_instance = options.procs_per_instance

    def prepare(self, config: Config, echo: ConsoleEcho) -> Prepared | None:
        backend, options = self.backend, self.options
        _check_budget(backend, options)
        for warning in backend.check(options):
            echo.say(warning)
        job_name = options.job_name or jobdir.new_job_name()
        captured = capture.capture(self.code, self.namespace, cell_names=self.cell_names)
        _announce_large(captured, options.world_size, echo)
        return _pack(config, job_name, captured.packed, cell_meta(self.code, options), options, self.code.assigns,
                     pin=backend.pins_digest, reuse=False,
                     plan=lambda job_dir, digest: backend.plan(job_dir, job_name, digest, options),
                     record={"backend": backend.name, "world_size": options.world_size, "instances": options.instances,
                             "procs_per_instance": options.procs_per_instance})

    def submit(self, prepared: Prepared) -> BackendJob:
        return self.backend.submit(prepared.job_dir, prepared.job_name, prepared.digest, self.options)

    def follow_settings(self, prepared: Prepared, echo: ConsoleEcho | None, clock: Callable[[], float]) -> FollowSettings:
        return FollowSettings(prepared.returns, prepared.gather, self.namespace, self.options.timeout,
                              self.backend.stop_description, echo, clock, max_cost=self.options.max_cost)

    def follow(self, follower: Follower) -> CellRun:
        return follower.run()

    def tracked(self, job_name: str) -> tracking.JobRecord | None:
        options = self.options
        run = tracking.open_run(options, job_name, f"job {job_name}", self.backend_name, options.world_size,
                                options.procs_per_instance)
        return tracking.JobRecord(run) if run is not None else None


class SessionCellRoute:
    """A cell on a session's ranks: only the values they do not hold are sent; what it assigns
    and could not come back stays there, and a cell the ranks cannot get back from ends the session."""

    def __init__(self, session: Session, code: capture.CellCode, namespace: Mapping[str, Any],
                 options: LaunchOptions, echo: ConsoleEcho, cell_names: capture.CellNames):
        self.session, self.code, self.namespace, self.options, self.echo = session, code, namespace, options, echo
        self.cell_names = cell_names
        self.backend_name, self.world_size = session.backend, session.world_size
        self.procs_per_instance = session.procs_per_instance
        self.selection: Selection | None = None
        self.cell: SessionCell | None = None

    def prepare(self, config: Config, echo: ConsoleEcho) -> Prepared | None:
        session, options, code = self.session, self.options, self.code
        holdings = session.holdings
        captured = capture.capture(code, self.namespace, holdings.keeps, self.cell_names)
        self.selection = selection = holdings.select(captured.packed, self.namespace)
        _announce_large(captured, session.world_size, echo, {item.name for item in selection.send})
        kept = sorted(captured.kept + selection.same)
        plan = (f"would run on session {session.name} ({session.world_size} ranks): sending "
                + (", ".join(f"{p.name} ({payload.size_text(p.size)})" for p in selection.send) or "nothing")
                + (f"; the ranks hold {', '.join(kept)} already" if kept else ""))
        meta = {**cell_meta(code, options), "return_limit": config.get("return_limit")}
        return _pack(config, f"{session.name}-{session.cells + 1}", selection.send, meta, options, code.assigns,
                     pin=False, reuse=True, plan=lambda job_dir, digest: plan,
                     record={"backend": session.backend, "world_size": session.world_size, "session": session.name})

    def submit(self, prepared: Prepared) -> BackendJob:
        assert self.selection is not None, "prepared first"
        self.cell = self.session.run(prepared.job_dir, None)
        self.session.holdings.delivered(self.selection)
        return self.cell

    def follow_settings(self, prepared: Prepared, echo: ConsoleEcho | None, clock: Callable[[], float]) -> FollowSettings:
        session = self.session
        return FollowSettings(
            prepared.returns, prepared.gather, self.namespace, self.options.timeout,
            f"interrupting the cell on every rank; the session is kept if all are back within {session.grace:g}s",
            echo, clock, stayed_is_news=session.stayed_is_news,
            stopped_message=lambda name: (f"cell {name} interrupted on every rank; session {session.name} is kept"
                                          if session.status != "stopped" else session.ended_sentence()))

    def follow(self, follower: Follower) -> CellRun:
        session, cell = self.session, self.cell
        assert cell is not None, "submitted first"
        try:
            run = follower.run()
        except ResultsLost as exc:
            raise ResultsLost(f"{exc}{self._left_on_ranks()}") from None
        except BaseException:
            if not cell.finished:  # the notebook stopped waiting for the ranks to get back
                session.tear_down("the notebook stopped waiting for the interrupted cell to end")
            if session.status == "stopped" and session.tell_ended() and follower.job.view is None:
                self.echo.say(session.ended_sentence())  # (a view's summary says it already)
            raise
        assert run.job is not None
        stayed = [name for name in run.job.unreturned if name in self.code.assigns]
        session.holdings.assigned(self.code.assigns, run.values, stayed, self.namespace)
        session.brought_back(run.values)
        return run

    def tracked(self, job_name: str) -> tracking.JobRecord | None:
        run = self.session.tracking_run
        return tracking.JobRecord(run, cell=f"cell{self.session.cells + 1}") if run is not None else None

    def _left_on_ranks(self) -> str:
        """After a cell that ran but whose results were lost: what it assigned is the ranks' own. The
        notebook's values of those names are left as they were, and are not sent over the ranks' values."""
        names = self.code.assigns
        self.session.holdings.assigned(names, {}, names, self.namespace)
        return (f"; here {', '.join(names)} keep what they held before the cell, and later cells use the ranks' "
                "values (rebind a name here to send yours)" if names else "")


class ExportedCell:
    """A cell exported with its values (``export.py``), run again from its folder without a notebook:
    its payload is copied into a job folder of its own and the backend runs it as the cell did."""

    def __init__(self, backend: Backend, folder: str, exported: dict[str, Any], options: LaunchOptions):
        self.backend, self.folder, self.exported, self.options = backend, folder, exported, options
        self.backend_name, self.world_size = backend.name, options.world_size
        self.procs_per_instance = options.procs_per_instance

    def prepare(self, config: Config, echo: ConsoleEcho) -> Prepared:
        cache_dir = config.get("cache_dir")
        _prepare_cache(cache_dir)
        job_name = self.options.job_name or jobdir.new_job_name("export")
        job_dir = jobdir.create(cache_dir, job_name)
        path = os.path.join(job_dir, payload.PAYLOAD_FILE)
        with open(os.path.join(self.folder, payload.PAYLOAD_FILE), "rb") as src, jobdir.open_private(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
        digest = payload.file_digest(path) if self.backend.pins_digest else None
        jobdir.prune(cache_dir, config.get("keep_jobs"), job_dir)
        jobdir.record(job_dir, name=job_name, backend=self.backend.name, world_size=self.options.world_size,
                      instances=self.options.instances, procs_per_instance=self.options.procs_per_instance,
                      digest=digest, status="running", started=time.time(), keep_payload=config.get("keep_payloads"))
        exported = self.exported
        return Prepared(job_name, job_dir, digest, exported["returns"], self.options.gather, exported["source"],
                        exported["cell_file"])

    def submit(self, prepared: Prepared) -> BackendJob:
        return self.backend.submit(prepared.job_dir, prepared.job_name, prepared.digest, self.options)

    def follow_settings(self, prepared: Prepared, echo: ConsoleEcho | None, clock: Callable[[], float]) -> FollowSettings:
        return FollowSettings(prepared.returns, prepared.gather, {}, self.options.timeout,
                              self.backend.stop_description, echo, clock)

    def follow(self, follower: Follower) -> CellRun:
        return follower.run()

    def tracked(self, job_name: str) -> tracking.JobRecord | None:
        return None


def run_exported(folder: str, exported: dict[str, Any], options: LaunchOptions, config: Config,
                 echo: ConsoleEcho) -> CellRun:
    """Run the cell exported to ``folder`` (``export.json`` read as ``exported``) as a job of its own."""
    backend = registry.make(options.backend, config, options)
    return _run(ExportedCell(backend, folder, exported, options), options, config, lambda job: None, echo,
                time.monotonic)


class AttachedJob:
    """A job started earlier, found by name: nothing to pack; its folder here is made again."""

    def __init__(self, jobs: AttachableBackend, name: str, namespace):
        self.jobs, self.name, self.namespace = jobs, name, namespace
        self.backend_name = jobs.name
        self.found, info = jobs.attach(name)
        self.info = info
        self.world_size, self.procs_per_instance = info["instances"] * info["procs_per_instance"], info["procs_per_instance"]

    def prepare(self, config: Config, echo: ConsoleEcho) -> Prepared:
        cache_dir = config.get("cache_dir")
        _prepare_cache(cache_dir)
        job_dir = jobdir.create(cache_dir, self.name, reuse=True)
        return Prepared(self.name, job_dir, None, self.info["returns"], self.info["gather"],
                        cell_file=self.info["cell_file"])

    def submit(self, prepared: Prepared) -> BackendJob:
        return self.found

    def follow_settings(self, prepared: Prepared, echo: ConsoleEcho | None, clock: Callable[[], float]) -> FollowSettings:
        return FollowSettings(prepared.returns, prepared.gather, self.namespace, None, self.jobs.stop_description,
                              echo, clock)

    def follow(self, follower: Follower) -> CellRun:
        return follower.run()

    def tracked(self, job_name: str) -> tracking.JobRecord | None:
        return None


def _pack(config: Config, job_name: str, items: list, meta: dict, options: LaunchOptions, returns: list[str], *,
          pin: bool, reuse: bool, plan: Callable[[str, str | None], str], record: dict[str, Any]) -> Prepared | None:
    """The job folder with the payload of ``items``, old folders pruned, job.json begun; with
    --dry-run, ``plan(job_dir, digest)`` is printed instead and the folder removed."""
    cache_dir = config.get("cache_dir")
    _prepare_cache(cache_dir)
    try:
        job_dir = jobdir.create(cache_dir, job_name, reuse=reuse)
    except FileExistsError:
        raise UsageError(f"a job named {job_name} exists already (see {cache_dir}/jobs); "
                         "choose another --job-name") from None
    digest = payload.write(os.path.join(job_dir, payload.PAYLOAD_FILE), items, meta, digest=pin)
    if options.dry_run:
        print(plan(job_dir, digest))
        shutil.rmtree(job_dir, ignore_errors=True)
        return None
    jobdir.prune(cache_dir, config.get("keep_jobs"), job_dir)
    jobdir.record(job_dir, name=job_name, **record, digest=digest, status="running", started=time.time(),
                  keep_payload=config.get("keep_payloads"))
    return Prepared(job_name, job_dir, digest, returns, options.gather, meta["source"], meta["cell_file"])


def start_session(options: LaunchOptions, config: Config, echo: ConsoleEcho | None = None,
                  clock: Callable[[], float] = time.monotonic) -> Session:
    """Start ranks that wait for cells; returns once every one is up."""
    backend = registry.make(options.backend, config, options)
    if not isinstance(backend, SessionBackend):
        raise UsageError(f"the {backend.name} backend runs each cell as a job of its own: it keeps no "
                         "session; leave out %mpirun_session, or choose another --backend")
    echo = echo or ConsoleEcho()
    _check_budget(backend, options)
    for warning in backend.check(options):
        echo.say(warning)
    cache_dir = config.get("cache_dir")
    _prepare_cache(cache_dir)
    name = options.job_name or jobdir.new_job_name("session")
    session = Session(name, backend.name, options, config.get("session_grace"), cache_dir, clock)
    ranks = backend.start_session(name, options, config)
    session.start(ranks, None if options.quiet else echo.say, detach=options.detach)
    session.tracking_run = tracking.open_run(options, name, f"session {name}", backend.name, options.world_size,
                                             options.procs_per_instance)
    return session


def attach_session(job_name: str, config: Config, detach: bool = False, quiet: bool = False,
                   echo: ConsoleEcho | None = None, clock: Callable[[], float] = time.monotonic) -> Session:
    """Take over a session started from this machine (by a kernel that is gone): its ranks keep
    their state; the values they hold are sent again when a cell needs them, as this notebook
    cannot know them."""
    jobs = registry.attachable(config)
    echo = echo or ConsoleEcho()
    cache_dir = config.get("cache_dir")
    _prepare_cache(cache_dir)
    ranks, info = jobs.attach_session(job_name)
    try:
        options = LaunchOptions(instances=info["instances"], gpus=info["procs_per_instance"], backend=jobs.name,
                                env=info["env"], detach=detach)
        session = Session(job_name, jobs.name, options, config.get("session_grace"), cache_dir, clock,
                          cells=info["cells"])
    except BaseException:  # the job ran before this notebook came: it runs on
        ranks.let_go("the attach failed")
        raise
    session.start(ranks, None if quiet else echo.say, detach=detach, attached=True)
    return session


@dataclass
class FollowSettings:
    """What following a job to its end needs besides the job: what to bring back, when to give
    up, how to talk to the user, and the clock every wait is measured on."""

    returns: list[str]
    gather: bool
    namespace: Any
    timeout: float | None = None
    stop_description: str = "stopping every rank"
    echo: ConsoleEcho | None = None
    clock: Callable[[], float] = time.monotonic
    stop_limit: float = STOP_LIMIT
    stopped_message: Callable[[str], str] | None = None  # what to say once the job (named) has stopped
    stayed_is_news: Callable[[str], bool] | None = None  # in a session: whether to say that a name stays there
    max_cost: float | None = None  # US dollars: the job is stopped once the meter says it cost this much


class Follower:
    """Watches a submitted job to its end, stops it on any exception here, collects results."""

    def __init__(self, job: Job, backend_job: BackendJob, settings: FollowSettings,
                 record: tracking.JobRecord | None = None):
        self.job, self.backend_job, self.settings = job, backend_job, settings
        self.record = record  # what records the job in a tracking service, if anything does
        self.echo, self.clock = settings.echo, settings.clock
        self.thread: threading.Thread | None = None

    def show(self, event) -> None:
        self.job.record(event)
        if self.record is not None:
            self.record.event(event)
        if self.echo is not None:
            self.echo.show(event)

    def show_all(self, batch: list) -> None:
        """A poll's events, in order; each run of output lines (a flood's) is taken at once."""
        lines: list[Output] = []
        for event in batch:
            if type(event) is Output:
                lines.append(event)
                continue
            if lines:
                self._show_lines(lines)
                lines = []
            self.show(event)
        if lines:
            self._show_lines(lines)

    def _show_lines(self, lines: list[Output]) -> None:
        self.job.record_lines(lines)
        if self.record is not None:
            for event in lines:
                self.record.event(event)
        if self.echo is not None:
            for event in lines:
                self.echo.show(event)

    def tick(self) -> None:
        if self.job.view is not None:
            self.job.view.update()

    def _say(self, text: str) -> None:
        (self.echo or ConsoleEcho()).say(text)

    def run(self) -> CellRun:
        job, backend_job, settings = self.job, self.backend_job, self.settings
        error: JobError | None = None
        raised: BaseException | None = None
        try:  # whatever happens in this process, the job does not outlive the cell
            job.model.fold(Phase("starting"))
            error = self._watch()
            if isinstance(error, RemoteRankError):
                self._fetch_post_mortems()
            if error is None:
                job.model.fold(Phase("collecting results"))
                backend_job.fetch_results(job.job_dir, range(job.world_size) if settings.gather else [0])
                run = CellRun(job)
                _collect(run, settings.returns, settings.gather, self.echo or ConsoleEcho(), settings.stayed_is_news)
                for name, value in run.values.items():
                    if is_notebook_function(value):
                        run.values[name] = rebind(value, settings.namespace)
        except BaseException as exc:
            raised = exc
            if not backend_job.finished:
                if isinstance(exc, KeyboardInterrupt):
                    try:
                        where = self._interrupt_roll_call()
                    except KeyboardInterrupt:  # a second interrupt: stop without it
                        where = ""
                    if where:
                        self._say(f"where the ranks were: {where}")
                if isinstance(exc, KeyboardInterrupt):
                    self._say(f"interrupted: stopping job {job.name} ({job.world_size} ranks: {settings.stop_description})")
                else:
                    self._say(f"stopping job {job.name}: {type(exc).__name__} in the notebook")
                self._stop("interrupt" if isinstance(exc, KeyboardInterrupt) else "error")
                if backend_job.finished and settings.stopped_message is not None:
                    self._say(settings.stopped_message(job.name))
                elif backend_job.finished:
                    self._say(f"job {job.name} stopped; nothing of it is left running")
                else:
                    self._say(f"job {job.name} was asked to stop ({settings.stop_description}) and is still stopping")
            raise
        finally:
            if job.model.exit is None:  # the backend could not say how it ended
                job.model.fold(LauncherExited(None))
            job.model.fold(Phase(job.status))
            jobdir.record(job.job_dir, status=job.status, ended=time.time())
            jobdir.finished(job.job_dir)
            if job.view is not None:
                job.view.close()
            if self.echo is not None:
                self.echo.release()
            if self.record is not None:
                self.record.ended(job, error or raised, self._say)
        if error is not None:
            raise error
        return run

    def _watch(self) -> JobError | None:
        """Follow the job until the launcher is gone; the error the cell raises, if any."""
        job, backend_job, clock, timeout = self.job, self.backend_job, self.clock, self.settings.timeout
        deadline = clock() + timeout if timeout else None
        all_done_at = None
        ended_here = False
        while not backend_job.finished:
            self.show_all(backend_job.poll(POLL_SECONDS))
            job.take_reported_roll_call()
            if job.model.stall_needs_roll_call():
                self._stall_roll_call()
            self.tick()
            now = clock()
            if deadline is not None and now > deadline and not backend_job.finished:
                queued = job.model.phase == "queued"
                self._stop("timeout")
                if queued:
                    return JobTimeoutError(f"job {job.name} ran past --timeout {timeout:g}s still waiting in the "
                                           "scheduler's queue, and was cancelled (--timeout counts the wait too)")
                return JobTimeoutError(f"job {job.name} ran past --timeout {timeout:g}s; {self._stopped()} "
                                       "(raise --timeout, or see the job's logs for where it spent the time)")
            spent, budget = job.model.cost(), self.settings.max_cost
            if budget is not None and spent is not None and spent.amount >= budget and not backend_job.finished:
                self._stop("budget")
                return JobError(f"job {job.name}: {budget_reached(spent, budget)}; {self._stopped()} "
                                "(raise --max-cost to let it run longer)")
            grace, linger = backend_job.abort_grace, backend_job.linger
            failed_at = job.model.first_failure_at
            if all_done_at is None and all(s.status == "completed" for s in job.ranks):
                all_done_at = now
            # a rank failed and the launcher has not stopped the others, or every rank succeeded and
            # something a rank started still holds the launcher's output
            stuck_after_failure = grace is not None and failed_at is not None and now - failed_at > grace
            held_after_success = linger is not None and all_done_at is not None and now - all_done_at > linger
            if (stuck_after_failure or held_after_success) and not ended_here:
                ended_here = True
                backend_job.cancel()
        if job.model.stop_reason == "cancel":
            return JobError(f"job {job.name} was cancelled; all {job.world_size} ranks were stopped")
        return job.model.error()

    def _stopped(self) -> str:
        """What a stop from here (a timeout, a budget) left of the job, once it ended."""
        return (self.settings.stopped_message(self.job.name) if self.settings.stopped_message
                else f"all {self.job.world_size} ranks were stopped")

    def _fetch_post_mortems(self) -> None:
        """The frames and locals each failed rank kept, into the job folder for %mpirun_debug (only
        those ranks', and only on failure); where they cannot be fetched, %mpirun_debug says so."""
        ranks = [state.rank for state in self.job.ranks if state.post_mortem]
        if ranks:
            try:
                self.backend_job.fetch_results(self.job.job_dir, ranks, POST_MORTEM)
            except Exception:  # noqa: BLE001 - the cell's own error matters more than its debugging aid
                pass

    def _stall_roll_call(self) -> None:
        try:
            self.job.stall_roll_call()
        except OSError as exc:  # (the job folder has gone)
            self.job.model.fold(RollCall(f"not taken ({type(exc).__name__})", stall=True))

    def _interrupt_roll_call(self) -> str:
        """Where every rank was when the cell was interrupted, folded into the model for the views:
        read at once where the notebook signals the ranks, else from their answers through the job's
        channel, for which the job's events go on being shown ("" if it could not be taken: the folder
        has gone, no rank has started yet, the scheduler or S3 did not take the request)."""
        job, backend_job = self.job, self.backend_job
        if job.signals_ranks:
            limit, pump = INTERRUPT_ROLL_CALL, None
        else:
            limit = INTERRUPT_ASKED_ROLL_CALL
            waited: list[bool] = []

            def pump() -> None:  # (called once the ranks were asked, while answers are missing)
                if not waited:
                    waited.append(True)
                    self._say(f"asking the ranks of job {job.name} where they are (up to {limit:g}s; interrupt "
                              "again to stop at once)")
                self.show_all(backend_job.poll(0.05))
        try:
            return str(job.roll_call(limit, pump=pump))
        except OSError as exc:
            job.model.fold(RollCall(f"not taken ({type(exc).__name__})", False))
        except MpiMagicError:
            pass
        return ""

    def _stop(self, reason: str) -> None:
        """Stop the job; an interrupt while stopping starts the stop again, and once the stop
        is requested, an interrupt only ends the waiting (a cloud job may take minutes)."""
        backend_job = self.backend_job
        self.job.model.fold(StopRequested(reason))
        requested = False

        def cancel() -> None:
            nonlocal requested
            backend_job.cancel()
            requested = True

        while True:
            try:
                stop_then_wait(cancel, lambda: backend_job.finished, self.settings.stop_limit,
                               lambda: self.show_all(backend_job.poll(POLL_SECONDS)), self.clock)
                break
            except KeyboardInterrupt:
                if requested:
                    break

    def in_background(self, deliver: Callable[[CellRun], None]) -> CellRun:
        """Follow the job from a thread; ``deliver`` gets the results when it succeeds."""
        def follow() -> None:
            try:
                deliver(self.run())
            except BaseException as exc:  # noqa: BLE001 - kept for job.wait() to raise
                self.job.error = exc

        self.thread = threading.Thread(target=follow, name=f"mpi_magic {self.job.name}", daemon=True)
        self.job.follower = self.thread
        self.thread.start()
        return CellRun(self.job)


def _check_budget(backend: Backend, options: LaunchOptions) -> None:
    """A budget the meter cannot keep, for want of a price, is refused before anything starts."""
    unpriced = backend.unpriced(options) if options.max_cost is not None else None
    if unpriced is None:
        return
    assert options.max_cost is not None
    if "max_cost" in options.given:
        raise UsageError(f"--max-cost {dollars(options.max_cost)} cannot be kept: {unpriced}; drop it")
    raise UsageError(f"the max_cost setting ({dollars(options.max_cost)}) cannot be kept: {unpriced}; unset it with "
                     "%mpirun_config max_cost=")


def _open_view(config: Config, job: Job, echo: ConsoleEcho) -> View:
    """The job's live view; rank 0's prints wait for the end where the view shows them already."""
    view = make_view(config.get("view"), job.model, lambda: os.path.join(job.job_dir, "logs"))
    if view.shows_output:
        echo.hold()
    return view


def cell_meta(code: capture.CellCode, options: LaunchOptions) -> dict:
    """What the ranks need to know besides the values: the cell, compiled, what it is called, and what to
    bring back."""
    return {"source": code.source, "code": cell.compiled(code.source, code.value_at, code.filename),
            "returns": code.assigns, "gather": options.gather, "value_at": code.value_at, "cell_file": code.filename,
            "cell_name": cell.name_of(code.filename)}


def _announce_large(captured: capture.Captured, world_size: int, echo: ConsoleEcho,
                    sent: set[str] | None = None) -> None:
    """Say which large values are about to cross (only those in ``sent``, where given)."""
    for name, kind, size in captured.large_values():
        if sent is None or name in sent:
            echo.say(f"sending {name} ({kind}, {payload.size_text(size)}) to {world_size} ranks")


def _prepare_cache(cache_dir: str) -> None:
    """The cache folder checked before anything is written or launched; what is wrong with it is a UsageError."""
    try:
        jobdir.prepare(cache_dir)
    except jobdir.FolderError as exc:
        raise UsageError(str(exc)) from None


def _collect(run: CellRun, returns: list[str], gather: bool, echo: ConsoleEcho,
             stayed_is_news: Callable[[str], bool] | None = None) -> None:
    """Read rank 0's results (every rank's with --gather) into ``run``.

    In a session (``stayed_is_news`` given), what did not come back stays on the ranks, and the
    user hears so once per name.

    A module the cell imported comes back only if the notebook has imported it already:
    importing, say, mpi4py.MPI here would initialise MPI inside the notebook's kernel.
    """
    job = run.job
    assert job is not None, "results are collected only for a job that ran"
    ranks = range(job.world_size) if gather else [0]
    per_rank = []
    for rank in ranks:
        digest = job.model.result_digests.get(rank)
        try:
            if not digest:
                raise PayloadError("its digest was never reported, so they are not trusted")
            # checked against what the rank reported: results changed on their way are not unpickled
            bundle = payload.read(result_path(job.job_dir, rank), digest)
            values, problems = bundle.load_all()
        except (OSError, PayloadError) as exc:
            values, problems = {}, {"(all)": f"rank {rank}'s results could not be read: {exc}"}
        else:
            modules = {name: sys.modules.get(module) for name, module in bundle.meta.get("modules", {}).items()}
            run.values.update({name: module for name, module in modules.items() if module is not None})
        for name, reason in problems.items():
            job.unreturned.setdefault(name, f"could not be unpickled here: {reason}")
        per_rank.append(values)
    first = per_rank[0]
    if VALUE_NAME in first:
        run.output, run.has_output = first.pop(VALUE_NAME), True
    for name in returns:
        if gather:
            missing = [r for r, values in zip(ranks, per_rank) if name not in values]
            if not missing:
                run.values[name] = [values[name] for values in per_rank]
            elif len(missing) < len(per_rank):
                job.unreturned.setdefault(name, f"missing on ranks {missing}")
        elif name in first:
            run.values[name] = first[name]
    for name, reason in job.unreturned.items():
        shown = "the cell's output" if name == VALUE_NAME else name
        if stayed_is_news is None:
            echo.say(f"{shown} was not brought back: {reason}")
        elif stayed_is_news(name):
            echo.say(f"{shown} stayed on the ranks: {reason}")
