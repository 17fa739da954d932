"""A job's run in a tracking service (MLflow: ``--mlflow EXPERIMENT``), written by the notebook alone:
the ranks never talk to the service, so a job is one run, never one per rank.

``Tracker`` is the seam: what the notebook asks of a tracking service's client for one run (open it,
metrics in batches, tags, files, end it); ``MlflowTracker`` is MLflow's, and another service (W&B)
would be a class beside it. ``RunWriter`` writes a run from a thread of its own, a batch at a time,
so a slow or failing server never holds a cell up: a call the server refuses costs only what it
carried, the first failure is said once, and a server that fails several calls in a row ends the run
as failed where it still can. ``JobRecord`` turns one job's events and end into what its run records. A
session is one run: each cell's steps follow the steps the session's earlier cells logged, and a
session that ends under a cell ends its run once that cell's record is written.
"""

from __future__ import annotations

import os
import re
import threading
import time
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Protocol

from ..errors import RemoteRankError, compact_ranks
from ..options import LaunchOptions
from ..shared import events
from ..view.summary import Summary

if TYPE_CHECKING:
    from .job import Job

FLUSH_SECONDS = 1.0  # metrics are sent at most once a second, in batches
FINISH_WAIT = 10.0  # seconds a cell waits at its end for its run to be written (then it is, in the background)
PROBE_SECONDS = 3.0  # how long a tracking server gets to answer before the run is given up
MAX_PENDING = 100_000  # metric points held for a server that is behind; more are dropped (and counted)
TEXT_LIMIT = 5000  # characters of a tag's value (MLflow keeps up to 8000)
MAX_FAILURES = 3  # calls in a row the server fails before the run is given up
# MLflow's client waits 120 s for an answer and tries 7 times more, minutes for one call to a server
# that slowed or went away mid-run; these are its settings where the notebook's environment has none
CLIENT_SETTINGS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "15", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2"}

# a job's status -> the run's end
RUN_STATUS = {"completed": "FINISHED", "failed": "FAILED", "stopped": "KILLED"}


class Point(NamedTuple):
    """One metric value as a run records it."""

    key: str
    value: float
    step: int
    timestamp: int  # milliseconds since the epoch


class Tracker(Protocol):
    """One run in a tracking service, as the notebook writes it (from one thread)."""

    @property
    def max_batch(self) -> int:
        """Metric points one call takes."""

    def start(self, name: str, params: dict[str, str], tags: dict[str, str]) -> None:
        """Open the run; raises what keeps it from opening (a server that does not answer)."""

    def log_metrics(self, points: list[Point]) -> None: ...

    def set_tags(self, tags: dict[str, str]) -> None: ...

    def log_text(self, text: str, path: str) -> None:
        """A file of the run, at ``path`` among its artifacts."""

    def log_folder(self, folder: str, path: str) -> None:
        """Every file of ``folder``, under ``path`` among the run's artifacts."""

    def end(self, status: str) -> None:
        """Close the run: ``status`` is a job's (completed, failed, stopped)."""


class MlflowTracker:
    """A run in MLflow: the tracking URI is MLflow's own (``MLFLOW_TRACKING_URI`` or
    ``mlflow.set_tracking_uri``; a SageMaker MLflow tracking server's ARN with the ``sagemaker-mlflow``
    plugin), the experiment made if it does not exist. MLflow is imported here, on the writer's
    thread, so the cell does not wait for its import either."""

    max_batch = 1000  # what MLflow's log_batch takes at once

    def __init__(self, experiment: str):
        self.experiment = experiment
        self.client: Any = None  # MLflow's MlflowClient, once started
        self.run_id = ""

    def start(self, name: str, params: dict[str, str], tags: dict[str, str]) -> None:
        import mlflow
        from mlflow.entities import Param

        uri = mlflow.get_tracking_uri()
        if uri.startswith(("http://", "https://")):
            _probe(uri)  # a server that is down fails here at once, not after MLflow's minutes of retries
        for setting, value in CLIENT_SETTINGS.items():  # MLflow reads them from the environment at each call
            os.environ.setdefault(setting, value)
        client = self.client = mlflow.MlflowClient(uri)
        found = client.get_experiment_by_name(self.experiment)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            try:
                experiment_id = client.create_experiment(self.experiment)
            except mlflow.exceptions.MlflowException:  # another notebook made it meanwhile
                found = client.get_experiment_by_name(self.experiment)
                if found is None:
                    raise
                experiment_id = found.experiment_id
        self.run_id = client.create_run(experiment_id, run_name=name, tags=tags).info.run_id
        items = [Param(key, value) for key, value in params.items()]
        for at in range(0, len(items), 100):  # log_batch takes 100 params a call
            client.log_batch(self.run_id, params=items[at:at + 100])

    def log_metrics(self, points: list[Point]) -> None:
        from mlflow.entities import Metric

        self.client.log_batch(self.run_id, metrics=[Metric(p.key, p.value, p.timestamp, p.step) for p in points])

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(key, value) for key, value in tags.items()]
        for at in range(0, len(items), 100):
            self.client.log_batch(self.run_id, tags=items[at:at + 100])

    def log_text(self, text: str, path: str) -> None:
        self.client.log_text(self.run_id, text, path)

    def log_folder(self, folder: str, path: str) -> None:
        self.client.log_artifacts(self.run_id, folder, path)

    def end(self, status: str) -> None:
        self.client.set_terminated(self.run_id, RUN_STATUS[status])


def _probe(uri: str) -> None:
    """Raise ``OSError`` unless a server answers at ``uri`` within ``PROBE_SECONDS`` (any HTTP status
    is an answer: a proxy may keep /health for itself)."""
    import urllib.error  # (here: with ssl and http.client it would cost every %load_ext some 25 ms)
    import urllib.request

    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=PROBE_SECONDS):
            pass
    except urllib.error.HTTPError:
        pass
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise OSError(f"nothing answers at {uri} ({reason})") from None


def make_tracker(experiment: str) -> Tracker:
    """The tracker of ``--mlflow EXPERIMENT``."""
    return MlflowTracker(experiment)


class RunWriter:
    """One run written from a thread of its own: metrics gathered and sent a batch at a time, at most
    once a second; tags and files in the order given; the end last. Nothing here waits for the
    server, except ``end``, which waits a bounded time."""

    def __init__(self, tracker: Tracker, name: str, params: dict[str, str], tags: dict[str, str], label: str):
        self.tracker, self.label = tracker, label  # label: "job NAME" or "session NAME", as said to the user
        self.started_at = time.time()
        self.steps = Steps()
        self.problem = ""  # the first call the server failed, once there is one
        self.given_up = False  # the run is written no further (it could not open, or the server kept failing)
        self._told = False
        self._points: list[Point] = []
        self._dropped = 0
        self._actions: list[Callable[[], None]] = []
        self._ended = False
        self._open_cells = 0  # a session's cells whose records are still being written
        self._end_after_cells: str | None = None  # the status the run ends with once they are
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._write, args=(name, params, tags),
                                        name=f"mpi_magic tracking {label}", daemon=True)
        self._thread.start()

    def metrics(self, points: list[Point]) -> None:
        with self._wake:
            room = MAX_PENDING - len(self._points)
            self._points.extend(points[:max(0, room)])
            self._dropped += max(0, len(points) - max(0, room))

    def tags(self, tags: dict[str, str]) -> None:
        self._then(lambda: self.tracker.set_tags(tags))

    def text(self, text: str, path: str) -> None:
        self._then(lambda: self.tracker.log_text(text, path))

    def folder(self, folder: str, path: str) -> None:
        self._then(lambda: self.tracker.log_folder(folder, path))

    def _then(self, action: Callable[[], None]) -> None:
        with self._wake:
            self._actions.append(action)

    def cell_opened(self) -> None:
        """A session's cell will write into the run: its end waits for the cell's record."""
        with self._wake:
            self._open_cells += 1

    def cell_recorded(self, say: Callable[[str], None], wait: float = FINISH_WAIT) -> None:
        """A session's cell has written what it leaves; the run ends now if its session ended meanwhile."""
        with self._wake:
            self._open_cells -= 1
            status = self._end_after_cells if self._open_cells == 0 else None
        if status is not None:
            self.end(status, say, wait)
        else:
            self.tell(say)

    def end(self, status: str, say: Callable[[str], None], wait: float = FINISH_WAIT) -> None:
        """Close the run with a job's ``status`` (after a cell still in flight has written its record),
        waiting up to ``wait`` seconds for it to be written; ``say`` tells the user, once, why it was
        not, or that it is still being written (unless it was not waited for). Only the first status
        counts; a later call only waits."""
        with self._wake:
            if self._open_cells and not self._ended:
                self._end_after_cells = self._end_after_cells or status
                return
            if not self._ended:
                if self._dropped:
                    dropped = self._dropped
                    self._actions.append(lambda: self.tracker.set_tags({"mpi_magic.metrics_dropped": str(dropped)}))
                self._actions.append(lambda: self.tracker.end(status))
                self._ended = True
                self._wake.notify()
        self._thread.join(wait)
        if wait and self._thread.is_alive() and not self.given_up:
            say(f"MLflow is slow to take the run of {self.label}: it is written on in the background")
        self.tell(say)

    def tell(self, say: Callable[[str], None]) -> None:
        """Say, the first time it is asked after a call failed, what of the run is not written."""
        if self.problem and not self._told:
            self._told = True
            say(f"MLflow did not take the run of {self.label} ({self.problem}); the cell ran on without it"
                if self.given_up else
                f"MLflow refused part of the run of {self.label} ({self.problem}); the rest of it is written")

    def _write(self, name: str, params: dict[str, str], tags: dict[str, str]) -> None:
        if not self._call(lambda: self.tracker.start(name, params, tags)):
            self.given_up = True  # there is no run to end
            return
        failures = 0
        while True:
            with self._wake:
                if not self._ended:
                    self._wake.wait(FLUSH_SECONDS)
                points, self._points = self._points, []
                actions, self._actions = self._actions, []
                last = self._ended
            batch = self.tracker.max_batch
            calls: list[Callable[[], None]] = [partial(self.tracker.log_metrics, points[at:at + batch])
                                               for at in range(0, len(points), batch)]
            for call in calls + actions:
                failures = 0 if self._call(call) else failures + 1
                if failures >= MAX_FAILURES:
                    self.given_up = True
                    self._call(lambda: self.tracker.end("failed"))  # best effort: not left running for ever
                    return
            if last and not actions:
                return

    def _call(self, call: Callable[[], None]) -> bool:
        """Make one call to the server; False, and the first failure kept to be said, if it failed."""
        try:
            call()
            return True
        except Exception as exc:  # noqa: BLE001 - the job goes on; the user hears why once
            if not self.problem:
                lines = str(exc).strip().splitlines()
                self.problem = f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__
            return False


def run_params(options: LaunchOptions, backend: str, world_size: int, procs_per_instance: int) -> dict[str, str]:
    """The shape and the options a run records: what the line gave, and the backend's settings."""
    params = {"backend": backend, "world_size": str(world_size), "instances": str(world_size // procs_per_instance),
              "procs_per_instance": str(procs_per_instance)}
    for name in ("gather", "timeout", "mpirun_args"):
        value = options.value(name)
        if value not in (None, False, [], ""):
            params[name] = " ".join(value) if isinstance(value, list) else str(value)
    if options.env:
        params["env"] = " ".join(sorted(options.env))  # names only: values may be secrets
    for name, value in options.settings.items():
        if value not in (None, False, (), [], {}, ""):
            params[name] = (",".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict)
                            else " ".join(value) if isinstance(value, (list, tuple)) else str(value))
    return {name: value[:TEXT_LIMIT] for name, value in params.items()}


def open_run(options: LaunchOptions, name: str, label: str, backend: str, world_size: int,
             procs_per_instance: int) -> RunWriter | None:
    """The run of a job or session (``label``: "job NAME", "session NAME"), None without ``--mlflow``."""
    if options.mlflow is None:
        return None
    tags = {"mpi_magic.kind": label.split()[0], "mpi_magic.backend": backend}
    return RunWriter(make_tracker(options.mlflow), name, run_params(options, backend, world_size, procs_per_instance),
                     tags, label)


class Steps:
    """Where a run's steps are: a session's cells count their steps from 0 again, so each cell's
    steps are moved past the last one written, unless they start past it already (a step counted
    across cells)."""

    def __init__(self) -> None:
        self.last = -1
        self.cells = 0  # a session's cells recorded so far

    def offset_for(self, first: int) -> int:
        return 0 if first > self.last else self.last + 1


class JobRecord:
    """What one job's run records, from its events (metrics and resources as they come) and its end
    (peak memory, the failure, the roll-call, the summary and the logs). A session cell's record
    writes into the session's run: its files under ``cells/cellN/``, its tags named after it."""

    def __init__(self, writer: RunWriter, cell: str = ""):
        self.writer, self.cell = writer, cell
        self.steps = writer.steps
        if cell:
            self.steps.cells += 1
            writer.cell_opened()
        self.offset: int | None = None  # decided by the job's first metric point

    def event(self, event: events.Event) -> None:
        if isinstance(event, events.Metrics):
            self._metrics(event)
        elif isinstance(event, events.Resources) and event.cpu is not None:
            self.writer.metrics([Point(_key(event.rank, "system/cpu_percent"), event.cpu,
                                       int(time.time() - self.writer.started_at), _now_ms())])

    def _metrics(self, event: events.Metrics) -> None:
        if self.offset is None:
            first = min((int(step) for pairs in event.points.values() for step, _ in pairs), default=None)
            if first is None:
                return
            self.offset = self.steps.offset_for(first)
        now, offset = _now_ms(), self.offset
        points = [Point(_key(event.rank, name), float(value), int(step) + offset, now)
                  for name, pairs in event.points.items() for step, value in pairs]
        self.steps.last = max(self.steps.last, max((p.step for p in points), default=-1))
        self.writer.metrics(points)

    def ended(self, job: Job, error: BaseException | None, say: Callable[[str], None]) -> None:
        """The job has ended (``error``: what the cell raises, if anything): what it leaves goes to the
        run, which ends with it unless it is a session's, without waiting after an interrupt. What
        fails here is said, never raised: the cell's own outcome stands."""
        wait = 0 if isinstance(error, KeyboardInterrupt) else FINISH_WAIT
        try:
            self._ended(job, error, say, wait)
        except Exception as exc:  # noqa: BLE001 - a failure to record the job must not replace how it ended
            say(f"the MLflow run of {self.writer.label} misses the end of job {job.name} "
                f"({type(exc).__name__}: {_first_line(exc)[:200]})")
        finally:
            if self.cell:
                self.writer.cell_recorded(say, wait)

    def _ended(self, job: Job, error: BaseException | None, say: Callable[[str], None], wait: float) -> None:
        model, at = job.model, self._at()
        now = _now_ms()
        peaks = [Point(_key(state.rank, name), float(value), self.steps.cells, now)
                 for state in model.ranks
                 for name, value in (("peak_memory_bytes", state.peak_rss), ("peak_gpu_memory_bytes",
                                                                             state.peak_gpu_memory))
                 if value is not None]
        self.writer.metrics(peaks)
        tags = {}
        if self.cell:
            tags[self._tag("status")] = job.status
        failed = [state.rank for state in model.failed_first()]
        if error is not None or failed:
            tags[self._tag("failure")] = _first_line(error) if error is not None else job.status
        if failed:
            tags[self._tag("failed_ranks")] = compact_ranks(failed)
        if model.roll_call:
            tags[self._tag("roll_call")] = model.roll_call[:TEXT_LIMIT]
        if tags:
            self.writer.tags(tags)
        if isinstance(error, RemoteRankError):
            self.writer.text("\n\n".join(f"{failure.headline()}\n{failure.traceback}" for failure in error.failures),
                             at + "failure.txt")
        if job.job_dir:
            job.flush_logs()
            logs = os.path.join(job.job_dir, "logs")
            self.writer.text(Summary(model, logs)._repr_html_(), at + "summary.html")
            if os.path.isdir(logs):
                self.writer.folder(logs, at + "logs")
        if not self.cell:
            self.writer.end(job.status, say, wait)

    def _tag(self, name: str) -> str:
        return f"mpi_magic.{self.cell}.{name}" if self.cell else f"mpi_magic.{name}"

    def _at(self) -> str:
        return f"cells/{self.cell}/" if self.cell else ""


def _key(rank: int, name: str) -> str:
    """Rank 0's metric under its own name, another rank's under its own prefix: loss, rank3/loss; a
    character MLflow refuses in a name (it takes letters, digits and ``_-. :/``) becomes ``_``."""
    name = re.sub(r"/{2,}", "/", re.sub(r"[^/\w.\- :]", "_", name)).strip("/") or "_"
    return name if rank == 0 else f"rank{rank}/{name}"


def _now_ms() -> int:
    return int(time.time() * 1000)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return (lines[0] if lines else type(error).__name__)[:TEXT_LIMIT]
