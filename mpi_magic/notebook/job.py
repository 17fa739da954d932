"""The job handle a cell gives back (``--out NAME``): status, ranks, logs, cancel.

A thin handle: the job's state is its model (folded from the backend's events), its output
is in the job folder's log files (written as lines arrive, so the full logs survive while
memory holds only recent lines), and stopping goes to the backend's job. The events the model
folds are kept in the folder too (``record.py``), so ``Job.load`` reopens a job that ended, after
the kernel that followed it has gone.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import TYPE_CHECKING, Callable

from ..errors import JobError, MpiMagicError
from ..options import Config, LaunchOptions
from ..shared import cell, events, jobdir, procs
from ..shared import stacks as dumps
from ..view.model import ACTIVE, ENDED, OUTPUT_TAIL, JobModel, RankState
from ..view.summary import Summary
from . import record

if TYPE_CHECKING:
    from ..view import View

CELL = "<cell>"  # the cell's frames, as job.stacks() names them
ROUND_SECONDS = 10.0  # stacks that arrive through the log this close to the newest answer the same request
CHANNEL_ANSWER_LIMIT = 30.0  # seconds the ranks of a SageMaker job get to answer through S3 and the log
_FLUSH_BYTES = 1 << 20
_FLUSH_SECONDS = 0.5


class Job:
    """One run of a cell. ``status`` is running, completed, failed or stopped.

    ``ranks[r]`` has ``rank``, ``instance``, ``local_rank``, ``host``, ``pid``, ``status``,
    ``n`` and ``total`` (its progress), ``cpu``, ``rss``, ``gpu_memory`` and ``gpu_util`` (what it
    uses, as last sampled; None until known); ``progress`` is the fraction done over all ranks;
    ``metrics`` each rank's logged numbers;
    ``widget`` is the live dashboard (None where none is shown).
    """

    def __init__(self, name: str, backend: str, world_size: int, procs_per_instance: int,
                 clock: Callable[[], float] = time.monotonic):
        self.name, self.backend, self.world_size = name, backend, world_size
        self.job_dir = ""
        self.model = JobModel(name, backend, world_size, procs_per_instance, clock)
        self.view: View | None = None  # the live view, where one is shown
        self.error: BaseException | None = None  # how a job followed in the background ended
        self.follower: threading.Thread | None = None  # the thread following it, with --async
        self._cancel: Callable[[], None] | None = None
        self._stacks_dir: str | None = None
        self._request_stacks: Callable[[], bool] = lambda: False  # (a job not started: asked nothing)
        self._stall_asked_for: float | None = None  # the quiet spell (``model.last_activity``) the ranks were asked in
        self._cell_lines: list[str] = []
        self._cell_file = cell.FILENAME
        self._clock = clock
        self._pending: dict[str, list[str]] = {}
        self._rank_logs: dict[int, str] = {}  # each rank's log file's name
        self._pending_bytes = 0
        self._last_flush = clock()
        self._folder_lost = False
        self.reopened = False  # loaded from its folder after it ended (``Job.load``): read-only
        self.source = ""  # the cell's code, as it ran
        self.launch: LaunchOptions | None = None  # a one-off cell's options, which an export runs it with again

    def start(self, job_dir: str, cancel: Callable[[], None], stacks_dir: str | None = None, source: str = "",
              request_stacks: Callable[[], bool] | None = None, cell_file: str = cell.FILENAME) -> None:
        """The job was submitted: its folder, how to stop it, and how its ranks are asked for
        their stacks (``stacks_dir`` where they dump them, else ``request_stacks``, which asks
        through the job's own channel) are known now; ``source`` is the cell's code, compiled
        as ``cell_file``."""
        self.job_dir, self._cancel = job_dir, cancel
        self.source, self._stacks_dir, self._cell_lines = source, stacks_dir, cell.numbered(source).splitlines()
        self._cell_file = cell_file
        self._request_stacks = request_stacks or self._request_stacks
        self._record()

    def _record(self) -> None:
        """Keep every event the model folds from now on in the job folder, written with the logs."""
        path = os.path.join(self.job_dir, "logs", record.FILE)
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)  # a job followed again (%mpirun_attach) is recorded from its beginning again
        model = self.model
        self._log(record.FILE, record.header(self.name, self.backend, self.world_size, model.procs_per_instance,
                                             model.stall_after))
        self.flush_logs()  # the header at once: a kernel that dies before the first event leaves a job to reopen
        recorder = record.Recorder(lambda line: self._log(record.FILE, line))

        def keep(event: events.Event) -> None:
            recorder(event, model.clock() - model.started_at)
            if isinstance(event, events.Phase) and event.name in ENDED:
                self.flush_logs()

        model.recorder = keep

    @classmethod
    def load(cls, name: str, cache_dir: str | None = None) -> "Job":
        """A job that ended, reopened from its folder in the cache directory (after a kernel
        restart too): its status, ranks, logs, metrics, failure, roll-call and ``summary``, as
        the cell left them. Read-only: it cannot be cancelled or asked for stacks."""
        cache_dir = cache_dir or Config().get("cache_dir")
        job_dir = os.path.join(cache_dir, "jobs", name)
        if not name or os.sep in name or not os.path.isdir(job_dir):
            raise JobError(f"no job named {name!r} is kept in {os.path.join(cache_dir, 'jobs')}: "
                           f"{kept_phrase(cache_dir)}")
        kept = jobdir.read_record(job_dir)
        if jobdir.is_running(kept):
            where = "this kernel: its cell's handle (--out) has it now" if _followed_here(kept) else "another kernel"
            raise JobError(f"job {name} is still running, followed by {where}; Job.load reopens a job once it has "
                           "ended")
        clock = _Replay()
        try:
            head, recorded = record.read(job_dir)
            job = cls(head["name"], head["backend"], head["world_size"], head["procs_per_instance"], clock)
            job.job_dir, job.reopened = job_dir, True
            model = job.model
            model.stall_after = head["stall_after"]
            for at, event in recorded:
                clock.now = max(clock.now, at)
                if isinstance(event, events.LauncherExited) and model.exit is None:
                    job._fold_last_lines()
                model.fold(event)
        except record.RecordError as exc:
            raise JobError(f"job {name} cannot be reopened: {exc}") from None
        if model.exit is None:
            job._fold_last_lines()
            model.fold(events.LauncherExited(None, reason="the kernel that followed it stopped before it ended"))
            model.fold(events.Phase(model.status))
        return job

    def _fold_last_lines(self) -> None:
        """Each rank's last lines and the launcher's, from the logs, as the view had them when the job ended."""
        for state in self.ranks:
            for line in _last_lines(os.path.join(self.job_dir, "logs", f"rank-{state.rank}.log"), OUTPUT_TAIL):
                stream = "stderr" if line.startswith(_STDERR) else "stdout"
                self.model.fold(events.Output(state.rank, stream, line.removeprefix(_STDERR)))
        for line in _last_lines(os.path.join(self.job_dir, "logs", "launcher.log"), self.model.launcher_tail.maxlen):
            self.model.fold(events.LauncherOutput(line))

    @property
    def cell_file(self) -> str:
        """The file name the cell's code was compiled under (``cell.FILENAME`` unless the notebook named it)."""
        return self._cell_file

    @property
    def summary(self) -> Summary:
        """The job's summary as the cell showed it when the job ended: HTML in a notebook, text elsewhere."""
        return Summary(self.model, os.path.join(self.job_dir, "logs") if self.job_dir else "")

    # -- what the model knows ---------------------------------------------------------------

    @property
    def status(self) -> str:
        return self.model.status

    @property
    def ranks(self) -> list[RankState]:
        return self.model.ranks

    @property
    def progress(self) -> float | None:
        return self.model.progress()

    @property
    def metrics(self) -> dict[int, dict[str, list[tuple[float, float]]]]:
        """Each rank's metrics, as ``mpi_magic.log`` and tqdm's ``set_postfix`` reported them:
        {rank: {"loss": [(step, value), ...]}}, at most 1,000 evenly thinned points a series plus
        the latest."""
        return self.model.metrics.as_dict()

    @property
    def unreturned(self) -> dict[str, str]:
        """{name: why} for names the cell assigned that could not come back."""
        return self.model.unreturned

    @property
    def widget(self):
        return self.view.widget if self.view is not None else None

    # -- events and logs --------------------------------------------------------------------

    def record(self, event: events.Event) -> None:
        if isinstance(event, events.Output):
            self.record_lines([event])
            return
        self.model.fold(event)
        if isinstance(event, events.LauncherOutput):
            self._log("launcher.log", event.text)
        elif isinstance(event, events.LauncherExited):
            self.flush_logs()
        self._flush_when_due()

    def record_lines(self, lines: list[events.Output]) -> None:
        """``record`` of each of many output lines at once (a flood's): folded, then logged per rank and all
        together, in one loop."""
        self.model.fold_lines(lines)
        pending, rank_logs = self._pending, self._rank_logs
        together = pending.setdefault("all.log", [])
        size = 0
        for event in lines:
            rank = event.rank
            line = (event.text if event.stream == "stdout" else _STDERR + event.text) + "\n"
            name = rank_logs.get(rank) or rank_logs.setdefault(rank, f"rank-{rank}.log")
            own = pending.get(name)
            if own is None:
                own = pending[name] = []
            own.append(line)
            tagged = f"[rank {rank}] {line}"
            together.append(tagged)
            size += len(line) + len(tagged)
        self._pending_bytes += size
        self._flush_when_due()

    def _flush_when_due(self) -> None:
        if self._pending_bytes > _FLUSH_BYTES or self._clock() - self._last_flush > _FLUSH_SECONDS:
            self.flush_logs()

    def _log(self, filename: str, line: str) -> None:
        self._pending.setdefault(filename, []).append(line + "\n")
        self._pending_bytes += len(line) + 1

    def flush_logs(self) -> None:
        if not self.job_dir:
            return
        pending, self._pending, self._pending_bytes = self._pending, {}, 0
        self._last_flush = self._clock()
        if self._folder_lost:
            return
        try:
            for filename, lines in pending.items():
                with jobdir.open_private(os.path.join(self.job_dir, "logs", filename), "a", encoding="utf-8") as f:
                    f.writelines(lines)
        except FileNotFoundError:
            self._folder_lost = True
            self.model.fold(events.Note(f"the job folder {self.job_dir} disappeared while the job ran; "
                                        "output from then on is not in its logs"))

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

    # -- for the user -----------------------------------------------------------------------

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

    @property
    def signals_ranks(self) -> bool:
        """True where the notebook signals the ranks itself (``stacks_dir``: they run on this machine),
        so their answers are read at once; elsewhere they are asked through the job's own channel
        (Slurm, S3) and answer with events."""
        return self._stacks_dir is not None

    def stall_roll_call(self) -> None:
        """The ranks went quiet (``model.stall_needs_roll_call``): the roll-call, taken now where the
        notebook signals them; elsewhere they are asked once per quiet spell, and the roll-call is made
        of their answers as these come (``take_reported_roll_call``). One that cannot be taken says why."""
        model = self.model
        if self.signals_ranks:
            self.roll_call(stall=True)
        elif self._stall_asked_for != model.last_activity and self._running():
            self._stall_asked_for = model.last_activity
            try:
                self._request_stacks()
            except MpiMagicError as exc:  # (the scheduler or S3 did not take the request: asked at the next stall)
                model.fold(events.RollCall(f"not taken ({exc})", stall=True))

    def stacks(self, limit: float | None = None) -> dict[int, list[dumps.Frame]]:
        """Where every rank is now: {rank: [(filename, line, function), ...]}, innermost last, the
        cell's frames named ``<cell>`` with its lines numbered as the cell shows them (the magic
        line is line 1), those of code from the notebook's earlier cells by the file name IPython
        compiled that cell under. A rank that gives none within ``limit`` seconds (3 locally, 30
        through a SageMaker job's log) is left out; ``roll_call()`` says why."""
        return self._ask(limit)[0]

    def roll_call(self, limit: float | None = None, stall: bool = False,
                  pump: Callable[[], None] | None = None) -> dumps.Snapshot:
        """Where every rank is now, which prints as the roll-call ("ranks 0, 1, 3 at cell line 7 in
        allreduce; rank 2 at cell line 12 in recv") and shows in the dashboard and the summary.
        ``pump`` folds the job's next events: given by the thread that follows the job, which would
        otherwise wait for answers only it brings in."""
        snapshot = dumps.Snapshot(*self._ask(limit, pump), CELL, self._cell_lines)
        self.model.fold(events.RollCall(str(snapshot), stall))
        return snapshot

    def _ask(self, limit: float | None, pump: Callable[[], None] | None = None
             ) -> tuple[dict[int, list[dumps.Frame]], dict[int, str]]:
        if self.reopened:
            raise JobError(f"job {self.name} was reopened after it ended ({self.status}): its ranks are gone, so they "
                           "cannot be asked where they are; its summary shows the last roll-call taken")
        if self._stacks_dir is not None:
            return ask_ranks(self._stacks_dir, self.ranks, dumps.ANSWER_LIMIT if limit is None else limit,
                             self._cell_file)
        asked_at = self._clock()
        if not (self._running() and self._request_stacks()):
            raise JobError(f"the ranks of job {self.name} ({self.backend}) cannot be asked for their stacks "
                           "now: none is running")
        return reported_answers(self.model, asked_at, CHANNEL_ANSWER_LIMIT if limit is None else limit, self._clock,
                                self._cell_file, pump)

    def _running(self) -> bool:
        """Whether a rank runs the cell now: one asked through the job's channel before any has started
        (or after every one has ended) gives no answer."""
        return any(state.status == "running" for state in self.ranks)

    def take_reported_roll_call(self) -> None:
        """Fold the roll-call made of the stacks that came through the log since the last one
        (SageMaker), once per batch of events however many ranks answered in it."""
        if self.model.new_reported_stacks():
            self.model.fold(events.RollCall(str(self.reported_roll_call()), self.model.waiting() is not None))

    def reported_roll_call(self) -> dumps.Snapshot:
        """The roll-call made of the stacks the ranks sent through the log (SageMaker: when they
        went quiet, or were asked): those that arrived within ``ROUND_SECONDS`` of the newest
        answer one request."""
        reported = dict(self.model.reported_stacks)
        newest = max((arrived for _, arrived in reported.values()), default=0.0)
        found = {rank: in_cell_words(frames, self._cell_file) for rank, (frames, arrived) in reported.items()
                 if newest - arrived <= ROUND_SECONDS}
        missing = {state.rank: "no answer yet" if state.status in ACTIVE else f"it has {state.status}"
                   for state in self.ranks if state.rank not in found}
        return dumps.Snapshot(found, missing, CELL, self._cell_lines)

    def cancel(self) -> None:
        """Stop every rank of this job now (the running cell then raises JobError)."""
        if self.reopened:
            raise JobError(f"job {self.name} was reopened after it ended ({self.status}): there is nothing left to "
                           "cancel")
        if self.status == "running" and self._cancel is not None:
            self.model.fold(events.StopRequested("cancel"))
            self._cancel()

    def __repr__(self) -> str:
        counts: dict[str, int] = {}
        for state in self.ranks:
            counts[state.status] = counts.get(state.status, 0) + 1
        summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        return f"<mpi_magic.Job {self.name} {self.backend} {self.status}: {self.world_size} ranks ({summary})>"


def _followed_here(kept: dict) -> bool:
    """Whether this kernel follows the running job whose job.json says ``kept``: it runs the job's
    launcher, or follows the job where the launcher runs elsewhere."""
    import psutil

    if kept.get("follower_pid") == os.getpid():
        return True
    try:
        return bool(kept.get("launcher_pid")) and psutil.Process(kept["launcher_pid"]).ppid() == os.getpid()
    except psutil.Error:
        return False


class _Replay:
    """The clock of a reopened job: when the event being folded again came (seconds since the job began)."""

    now = 0.0

    def __call__(self) -> float:
        return self.now


_STDERR = "[stderr] "  # how a rank's log marks its stderr lines


def _last_lines(path: str, count: int | None, limit: int = 4 << 20) -> list[str]:
    """The last ``count`` lines of a text file (of its last ``limit`` bytes at most); [] where it is missing."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - limit))
            data = f.read()
    except FileNotFoundError:
        return []
    lines = data.decode("utf-8", "replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if size > limit:
        lines = lines[1:]  # the first may be cut
    return lines[-count:] if count else []


def kept_phrase(cache_dir: str) -> str:
    """Which jobs are kept, in words ("the kept jobs are a, b and 3 more; %mpirun_jobs lists them")."""
    names = [info["name"] for info in jobdir.kept_jobs(cache_dir)]
    if not names:
        return "no job is kept there (keep_jobs in %mpirun_config says how many are)"
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f"the jobs kept are {shown} (%mpirun_jobs lists them; keep_jobs in %mpirun_config says how many are kept)"


def ask_ranks(stacks_dir: str, ranks: list[RankState], limit: float,
              cell_file: str = cell.FILENAME) -> tuple[dict[int, list[dumps.Frame]], dict[int, str]]:
    """The stacks of the ranks still running ({rank: frames}, those of the cell compiled as
    ``cell_file`` named ``<cell>``), and why each other rank gave none."""
    active = [s for s in ranks if s.status in ACTIVE]
    found, missing = dumps.request(stacks_dir, {s.rank: s.pid for s in active if s.pid}, limit, alive=procs.alive)
    missing.update({s.rank: "it has not reported its process yet" for s in active if not s.pid})
    missing.update({s.rank: f"it has {s.status}" for s in ranks if s.status not in ACTIVE})
    return {rank: in_cell_words(frames, cell_file) for rank, frames in found.items()}, missing


def reported_answers(model: JobModel, asked_at: float, limit: float, clock: Callable[[], float],
                     cell_file: str = cell.FILENAME, pump: Callable[[], None] | None = None
                     ) -> tuple[dict[int, list[dumps.Frame]], dict[int, str]]:
    """What ``ask_ranks`` gives, for ranks asked through their own channel: the stacks they sent as
    events since ``asked_at`` (waiting up to ``limit`` seconds for every running rank's), and why each
    other rank gave none. The answers come with the ranks' other events, which ``pump`` folds, else
    the thread that follows the job."""
    while True:
        reported = dict(model.reported_stacks)  # a copy: that thread adds to it meanwhile
        fresh = {rank: frames for rank, (frames, arrived) in reported.items() if arrived >= asked_at}
        waiting = [s.rank for s in model.ranks if s.status in ACTIVE and s.rank not in fresh]
        if not waiting or clock() - asked_at > limit:
            break
        if pump is None:
            time.sleep(0.05)
        else:
            pump()
    found = {rank: in_cell_words(frames, cell_file) for rank, frames in fresh.items()}
    missing = {rank: f"it did not answer within {limit:g}s" for rank in waiting}
    missing.update({s.rank: f"it has {s.status}" for s in model.ranks if s.status not in ACTIVE})
    return found, missing


def in_cell_words(frames, cell_file: str) -> list[dumps.Frame]:
    """A rank's frames with those of the cell compiled as ``cell_file`` named ``<cell>``, as job.stacks() gives them."""
    return [(CELL if filename == cell_file else filename, line, function) for filename, line, function in frames]
