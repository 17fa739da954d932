"""Run one cell as a job: capture, pack, submit, watch, collect. No IPython shell in here.

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
from typing import Any, Callable, Mapping

from IPython.core.error import UsageError

from . import capture, jobdir, payload
from .backends import get_backend
from .backends.base import BackendJob
from .errors import JobError, JobTimeoutError, PayloadError
from .events import LauncherExited, Phase, StopRequested
from .job import Job
from .options import Config, LaunchOptions
from .rebind import is_notebook_function, rebind
from .layout import VALUE_NAME, result_path
from .view import make_view
from .view.console import ConsoleEcho

STOP_LIMIT = 600.0  # seconds to wait for a stopped job to end (a cloud job takes minutes)
POLL_SECONDS = 0.1  # longest wait for the backend's next events before the view is redrawn


@dataclass
class CellRun:
    job: Job | None  # None after --dry-run
    values: dict[str, Any] = field(default_factory=dict)
    output: Any = None
    has_output: bool = False


def run_cell(source: str, namespace: Mapping[str, Any], options: LaunchOptions, config: Config,
             on_job: Callable[[Job], None] = lambda job: None, echo: ConsoleEcho | None = None,
             clock: Callable[[], float] = time.monotonic,
             deliver: Callable[[dict], None] = lambda values: None) -> CellRun:
    """Run ``source`` (plain Python) as ``options.world_size`` ranks; see the module docstring.

    With ``options.run_async`` it returns once the job is submitted and ``deliver`` receives
    the values when the job has succeeded.
    """
    code = capture.analyze(source)
    backend = get_backend(options.backend, config, options)
    echo = echo or ConsoleEcho()
    for warning in backend.check(options):
        echo.say(warning)
    job_name = options.job_name or jobdir.new_job_name()
    captured = capture.capture(code, namespace)
    for name, kind, size in captured.large_values():
        echo.say(f"sending {name} ({kind}, {_size(size)}) to {options.world_size} ranks")

    cache_dir = config.get("cache_dir")
    _prepare(cache_dir)
    try:
        job_dir = jobdir.create(cache_dir, job_name)
    except FileExistsError:
        raise UsageError(f"a job named {job_name} exists already (see {cache_dir}/jobs); "
                         "choose another --job-name") from None
    meta = {"source": source, "returns": code.assigns, "gather": options.gather, "display": code.display_result}
    digest = payload.write(os.path.join(job_dir, payload.PAYLOAD_FILE), captured.packed, meta,
                           digest=backend.pins_digest)
    if options.dry_run:
        print(backend.plan(job_dir, job_name, digest, options))
        shutil.rmtree(job_dir, ignore_errors=True)
        return CellRun(None)
    jobdir.prune(cache_dir, config.get("keep_jobs"), job_dir)
    # per-rank state: only for a real job
    job = Job(job_name, backend.name, options.world_size, options.procs_per_instance, clock)
    jobdir.record(job_dir, name=job.name, backend=backend.name, world_size=options.world_size,
                  instances=options.instances, procs_per_instance=options.procs_per_instance, digest=digest,
                  status="running", started=time.time(), keep_payload=config.get("keep_payloads"))

    view = None
    if not options.quiet:
        view = make_view(config.get("view"), job.model, lambda: os.path.join(job.job_dir, "logs"))
        if view.shows_output:
            echo.hold()
    try:
        job.model.fold(Phase("submitting"))
        backend_job = backend.submit(job_dir, job.name, digest, options)
    except BaseException:
        job.model.fold(LauncherExited(None, refused="the job could not be submitted"))  # it never started
        job.model.fold(Phase(job.status, "could not be submitted"))
        jobdir.record(job_dir, status=job.status, ended=time.time())
        jobdir.finished(job_dir)
        if view is not None:
            view.close()
        raise
    job.start(job_dir, backend_job.cancel)
    job.view = view
    jobdir.record(job_dir, launcher_pid=getattr(backend_job, "pid", None),
                  launcher_started=getattr(backend_job, "started", None))
    on_job(job)
    follow = FollowSettings(code.assigns, options.gather, namespace, options.timeout, backend.stop_description,
                            None if options.quiet or options.run_async else echo, clock)
    follower = Follower(job, backend_job, follow)
    if options.run_async:
        return follower.in_background(lambda run: deliver(run.values))
    return follower.run()


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


class Follower:
    """Watches a submitted job to its end, stops it on any exception here, collects results."""

    def __init__(self, job: Job, backend_job: BackendJob, settings: FollowSettings):
        self.job, self.backend_job, self.settings = job, backend_job, settings
        self.echo, self.clock = settings.echo, settings.clock
        self.thread: threading.Thread | None = None

    def show(self, event) -> None:
        self.job.record(event)
        if self.echo is not None:
            self.echo.show(event)

    def tick(self) -> None:
        if self.job.view is not None:
            self.job.view.update()

    def _say(self, text: str) -> None:
        (self.echo or ConsoleEcho()).say(text)

    def run(self) -> CellRun:
        job, backend_job, settings = self.job, self.backend_job, self.settings
        try:  # whatever happens in this process, the job does not outlive the cell
            job.model.fold(Phase("starting"))
            error = self._watch()
            if error is None:
                job.model.fold(Phase("collecting results"))
                backend_job.fetch_results(job.job_dir, range(job.world_size) if settings.gather else [0])
                run = CellRun(job)
                _collect(run, settings.returns, settings.gather, self.echo or ConsoleEcho())
                for name, value in run.values.items():
                    if is_notebook_function(value):
                        run.values[name] = rebind(value, settings.namespace)
        except BaseException as exc:
            if not backend_job.finished:
                if isinstance(exc, KeyboardInterrupt):
                    self._say(f"interrupted: stopping job {job.name} ({job.world_size} ranks: {settings.stop_description})")
                else:
                    self._say(f"stopping job {job.name}: {type(exc).__name__} in the notebook")
                self._stop("interrupt" if isinstance(exc, KeyboardInterrupt) else "error")
                if backend_job.finished:
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
            for event in backend_job.poll(POLL_SECONDS):
                self.show(event)
            self.tick()
            now = clock()
            if deadline is not None and now > deadline and not backend_job.finished:
                self._stop("timeout")
                return JobTimeoutError(
                    f"job {job.name} ran past --timeout {timeout:g}s; all {job.world_size} ranks were stopped "
                    "(raise --timeout, or see the job's logs for where it spent the time)"
                )
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

    def _stop(self, reason: str) -> None:
        """Stop the job; an interrupt while stopping starts the stop again, and once the stop
        is requested, an interrupt only ends the waiting (a cloud job may take minutes)."""
        job, backend_job, clock = self.job, self.backend_job, self.clock
        job.model.fold(StopRequested(reason))
        requested_at = None
        while True:
            try:
                if requested_at is None:
                    backend_job.cancel()
                    requested_at = clock()
                while not backend_job.finished and clock() - requested_at < self.settings.stop_limit:
                    for event in backend_job.poll(POLL_SECONDS):
                        self.show(event)
                break
            except KeyboardInterrupt:
                if requested_at is not None:
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


def attach(name: str, namespace, config: Config, echo: ConsoleEcho | None = None,
           clock: Callable[[], float] = time.monotonic) -> CellRun:
    """Follow a SageMaker job started earlier (by this or another kernel) to its end: the
    dashboard is rebuilt from its logs and status, and its results come back."""
    from .backends.sagemaker.job import attach as find

    backend_job, info = find(name, config.get("region"))
    echo = echo or ConsoleEcho()
    job = Job(name, "sagemaker", info["instances"] * info["procs_per_instance"], info["procs_per_instance"], clock)
    _prepare(config.get("cache_dir"))
    job_dir = jobdir.create(config.get("cache_dir"), name, reuse=True)
    job.view = make_view(config.get("view"), job.model, lambda: os.path.join(job.job_dir, "logs"))
    job.start(job_dir, backend_job.cancel)
    follow = FollowSettings(info["returns"], info["gather"], namespace, None, "StopTrainingJob", echo, clock)
    return Follower(job, backend_job, follow).run()


def _prepare(cache_dir: str) -> None:
    """The cache folder checked before anything is written or launched; what is wrong with it is a UsageError."""
    try:
        jobdir.prepare(cache_dir)
    except jobdir.FolderError as exc:
        raise UsageError(str(exc)) from None


def _collect(run: CellRun, returns: list[str], gather: bool, echo: ConsoleEcho) -> None:
    """Read rank 0's results (every rank's with --gather) into ``run``.

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
        echo.say(f"{shown} was not brought back: {reason}")


def _size(n: float) -> str:
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")
