"""Ranks that stay up between cells: started once, fed cell after cell, stopped on request.

A session is one launcher run whose ranks wait for cells (``runtime/cell_loop.py``). A pump
thread takes every event the backend delivers and routes it to the cell being run, or,
between cells, to the session's own log. Each cell is followed like a one-off job
(``SessionCell`` is its backend job), except that it ends when every rank is back to waiting.
A rank that is not back within the grace period after a failure, an interrupt or a timeout
(blocked in a collective the others left) cannot be recovered: the whole session is torn
down and says so. No IPython in here.
"""

from __future__ import annotations

import atexit
import dataclasses
import math
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..shared import events, jobdir
from ..shared.cost import budget_reached, dollars
from ..shared.layout import RESULTS
from ..shared import stacks as dumps
from ..backends.base import LEAVE_WAIT, SessionRanks
from ..backends.follow import stop_then_wait
from ..errors import JobError, SessionStartError, counted, ranks_phrase
from . import tracking
from .holdings import Holdings
from .job import CELL, ask_ranks, reported_answers
from ..backends.registry import refused_on_session
from ..options import ONE_OFF, LaunchOptions
from ..shared.slurmtime import clock
from ..view.console import ConsoleEcho
from ..view.model import JobModel

QUEUE_SIZE = 10_000
MAX_BATCH = 2_000
# what a session's model folds during a cell too (the cell's own model gets every event)
SESSION_FACTS = (events.RankStarted, events.RankReady, events.SessionClosing, events.LauncherExited, events.Billing,
                 events.Resources, events.Allocation)


_IN_SHAPE = ("instances", "gpus", "backend")  # what a refusal's "runs 2 x 4 ranks on slurm" says already


def _asked(flag: str, value) -> str:
    """A cell's option as a refusal names it: --time 3, --spot; other --mpirun-args for a list (which
    may hold %mpirun_config's too) or a mapping."""
    if value is True:
        return flag
    return f"other {flag}" if isinstance(value, (list, tuple, dict)) else f"{flag} {value}"


def _own(flag: str, value) -> str | None:
    """A session's option as a refusal names it (runs ... with it): --time 5, no --spot, the default
    --partition; None for a list or a mapping, which the sentence leaves out."""
    if isinstance(value, (list, tuple, dict)):
        return None
    if value is None or value is False:
        return f"{'the default' if value is None else 'no'} {flag}"
    return _asked(flag, value)


@dataclass
class SessionRank:
    """One rank of a session, as ``session.ranks`` lists it."""

    rank: int
    pid: int
    host: str
    status: str  # idle, running, stopped


class Session:
    """Ranks kept up between cells (``%mpirun_session start``; ``--out NAME`` keeps this handle).

    ``status`` is starting, idle, running or stopped; ``cells`` counts the cells run;
    ``ranks`` lists each rank's pid, host and status; ``job_name`` is the SageMaker training
    job's (None for local ranks); ``stop()`` ends it.
    """

    def __init__(self, name: str, backend: str, options: LaunchOptions, grace: float,
                 cache_dir: str, clock: Callable[[], float] = time.monotonic, cells: int = 0):
        self.name, self.backend, self.options, self.grace = name, backend, options, grace
        self.cache_dir = cache_dir
        self.instances, self.procs_per_instance = options.instances, options.procs_per_instance
        self.world_size = options.world_size
        self.clock = clock
        self.holdings = Holdings()
        self._told_ended = False  # the user heard that the session is gone (or ended it)
        self._told_stayed: set[str] = set()  # names already reported as staying on the ranks
        self.started_at = clock()
        self.idle_since = self.started_at
        self._ranks: SessionRanks | None = None
        self._lock = threading.Condition()
        self._up = False  # every rank was up and waiting for cells once
        self._cell: SessionCell | None = None  # the cell running now
        # the session's state, folded from its ranks' events: who is up and waiting, what rank 0 said
        # when it ended, the launcher's exit, billing, the cells run and why it stopped
        self.model = JobModel(name, backend, self.world_size, self.procs_per_instance, clock)
        self.model.fold(events.CellSent(cells))
        self._pump: Pump | None = None
        self._say: Callable[[str], None] | None = None  # while starting: how the backend's phases are shown
        self.job_dir = ""
        self.tracking_run: tracking.RunWriter | None = None  # its one run in a tracking service (--mlflow), if any
        self._stopped_here = False  # the notebook ended it (a stop, the kernel's exit), not a failure
        self._over_budget = False  # it ended because it cost --max-cost

    # -- for the user -----------------------------------------------------------------------

    @property
    def status(self) -> str:
        model = self.model
        if model.stop_reason is not None or model.exit is not None:
            return "stopped"
        if self._cell is not None:
            return "running"
        return "idle" if self._up else "starting"

    @property
    def cells(self) -> int:
        """Cells run on it (by the notebook it was taken over from too)."""
        return self.model.cells

    @property
    def ended_reason(self) -> str | None:
        """Why it stopped, once it has."""
        return self.model.stop_reason

    @property
    def job_name(self) -> str | None:
        return self._ranks.job_name if self._ranks is not None else None

    @property
    def ranks(self) -> list[SessionRank]:
        with self._lock:
            cell, stopped = self._cell, self.status == "stopped"
            return [SessionRank(state.rank, state.pid, state.host,
                                "stopped" if stopped else
                                "running" if cell is not None and state.rank not in cell.back else
                                "idle" if state.ready_after is not None else "starting")
                    for state in self.model.ranks]

    def _pids(self) -> dict[int, int]:
        return {state.rank: state.pid for state in self.model.ranks if state.pid}

    @property
    def bytes_sent(self) -> int:
        """Bytes of notebook values sent to the ranks over the session's life."""
        return self.holdings.bytes_sent

    def idle_for(self) -> float | None:
        return self.clock() - self.idle_since if self.status == "idle" else None

    def memory(self) -> dict[int, int]:
        """{rank: resident bytes} where the backend can tell."""
        if self._ranks is None or self.status == "stopped":
            return {}
        return self._ranks.memory(self._pids())

    def _at_exit(self) -> None:
        """The kernel shuts down: stop the session at once, without waiting for a cloud job's end."""
        self.stop("the notebook's Python is exiting", wait=False)

    def stop(self, reason: str = "stopped from the notebook", wait: bool = True) -> None:
        """End the session: the ranks are asked to leave, then stopped; nothing is left running
        (``wait=False``: the stop is under way when this returns)."""
        ranks = self._ranks
        if ranks is None or self.status == "stopped":
            return
        self._told_ended = True  # the user's own choice: later cells need not be told
        self._stopped_here = True
        idle = self.status == "idle"
        with self._lock:  # why it ended is the notebook's reason, not what reaches it last of the ranks' end
            self.model.fold(events.StopRequested(reason))
        if idle:  # the ranks are told first, and get a moment to leave by themselves
            def close() -> None:
                try:
                    ranks.close(reason)
                except OSError:
                    pass
            stop_then_wait(close, lambda: ranks.finished, LEAVE_WAIT if wait else 0, clock=self.clock)
        self._end(reason, wait)

    def facts(self) -> list[str]:
        """What the backend adds to ``%mpirun_session`` (a SageMaker job's name, status, billable time)."""
        return self._ranks.facts() if self._ranks is not None else []

    def said_between_cells(self, limit: int = 5) -> list[str]:
        """The last lines the ranks printed outside any cell (rank 0 refusing an object, say)."""
        return [f"[rank {rank}] {text}" for rank, stream, text in list(self.model.tail)[-limit:]]

    def mismatch(self, options: LaunchOptions) -> str | None:
        """Why a cell with these options cannot run on this session (None: it can), in one sentence;
        which options it cannot take is decided by their declared scope (``refused_on_session``)."""
        refused = refused_on_session(self.options, options)
        if not refused:
            return None
        one_off = [o.flag for o in refused if o.scope == ONE_OFF]
        if one_off:
            return (f"{one_off[0]} applies to one-off cells, not to a session's; run the cell as a one-off job "
                    "with --no-session")
        if any(o.dest == "env" for o in refused):
            shown = " ".join(f"{k}={v}" for k, v in self.options.env.items()) or "none"
            return (f"--env is fixed when a session starts (session {self.name} has: {shown}); set the variable "
                    "inside the cell (os.environ[...] = ...), run the cell as a one-off job with --no-session, or "
                    "%mpirun_session stop and start one with that --env")
        asked = " and ".join(_asked(o.flag, options.value(o.dest)) for o in refused)
        own = [named for o in refused
               if o.dest not in _IN_SHAPE and (named := _own(o.flag, self.options.value(o.dest)))]
        has = f" with {' and '.join(own)}" if own else ""
        return (f"this cell asks for {asked}, but session {self.name} runs {self.instances} x "
                f"{self.procs_per_instance} ranks on {self.backend}{has}: run it as a one-off job with --no-session, "
                "or %mpirun_session stop and start one that fits")

    def __repr__(self) -> str:
        return (f"<mpi_magic.Session {self.name} {self.backend} {self.status}: {counted(self.world_size, 'rank')} "
                f"({self.instances} x {self.procs_per_instance}), {counted(self.cells, 'cell')} run>")

    # -- life cycle -------------------------------------------------------------------------

    def start(self, ranks: SessionRanks, say: Callable[[str], None] | None = None, detach: bool = False,
              attached: bool = False) -> None:
        """Wait until every rank is up and waiting for cells (rank 0 on the channel): after the
        ``self.cells``-th cell, when taking over a running session (``attached``). With
        ``detach``, the session outlives this Python (a SageMaker job, until its heartbeat limit)."""
        self._ranks = ranks
        self._say = say
        try:
            self.job_dir = jobdir.create(self.cache_dir, self.name, reuse=attached)
            jobdir.record(self.job_dir, name=self.name, backend=self.backend, world_size=self.world_size,
                          instances=self.instances, procs_per_instance=self.procs_per_instance, status="running",
                          session=True, started=time.time(), launcher_pid=(ranks.launcher or (None, None))[0],
                          launcher_started=(ranks.launcher or (None, None))[1])
        except BaseException:  # the ranks (a training job) are up already: nothing may keep running unowned
            if attached:
                ranks.let_go("the attach failed")
            else:
                ranks.stop(wait=False)
            raise
        self._pump = Pump(self, ranks)
        if not detach:
            atexit.register(self._at_exit)
        if say:
            say(f"session {self.name}: {'taking over' if attached else 'starting'} {self.world_size} ranks "
                f"({self.instances} x {self.procs_per_instance}, {self.backend})")
        limit = ranks.start_limit
        deadline = self.clock() + limit
        try:
            while True:
                connected = ranks.connect()
                with self._lock:
                    ready = sum(1 for state in self.model.ranks if state.ready_after == self.cells)
                    if self.status == "stopped":
                        break
                    if connected and ready == self.world_size:
                        self._up = True
                        self.idle_since = self.clock()
                        break
                    self._lock.wait(0.005)
                if self.clock() > deadline:
                    self._end(f"its ranks were not all up after {limit:g}s")
                    raise SessionStartError(f"session {self.name}: only {ready} of {self.world_size} ranks were up "
                                            f"after {limit:g}s, so it was stopped")
        except BaseException:
            if attached:  # the job was running before: giving up watching it must not stop it
                self._let_go("taking it over was interrupted")
            else:
                self._end("its start was interrupted")
            raise
        if not self._up:
            if self.model.exit is not None and self._pump is not None:
                self._pump.join(LEAVE_WAIT)  # the launcher is gone: its last events say why
            failure = self._start_failure()
            self._end("its ranks ended while starting")
            raise SessionStartError(failure)
        self._say = None
        if say:
            say(f"session {self.name}: {self.world_size} ranks ready in {self.clock() - self.started_at:.1f}s")

    def _start_failure(self) -> str:
        """Why the ranks ended before they were all up (the launcher's words, or SageMaker's
        replacing the instances), with the ranks' last lines: a rank that cannot start says why there."""
        model = self.model
        error = model.error() if model.exit is not None else None
        why = self.ended_reason or (str(error) if error is not None else "") or "no rank said why"
        lines = [f"\n[rank {rank}] {text}" for rank, stream, text in list(model.tail)[-8:]]
        return (f"session {self.name} could not start: its ranks ended before all {self.world_size} were up "
                f"({why})" + "".join(lines))

    def ranks_ended(self, ranks: SessionRanks) -> None:
        """The pump read the ranks' last event: the session is over, for the reason they gave."""
        with self._lock:
            self.model.fold(events.StopRequested(ranks.released or self._closing_reason()))  # (unless one was)
            self._lock.notify_all()
        ranks.stop(wait=False)  # what the backend keeps for the ranks (a channel, a heartbeat) ends with them
        atexit.unregister(self._at_exit)
        self._end_run()

    def route(self, event: events.Event) -> None:
        """Between cells the session's model folds every event (its tail keeps what the ranks
        printed then); during a cell it folds the session's own facts, and the cell gets every event."""
        if isinstance(event, events.Restarted):
            self._replaced(event)
        with self._lock:
            cell = self._cell
            starting = self.status == "starting"
            if cell is None or isinstance(event, SESSION_FACTS):
                self.model.fold(event)
            if isinstance(event, (events.RankReady, events.LauncherExited)):
                self._lock.notify_all()
            elif isinstance(event, events.Phase) and self._say is not None and starting:
                self._say(f"session {self.name}: {event.detail or event.name}")  # SageMaker's phases
        if cell is not None:
            cell.queue.put(event)  # bounded: a flooding rank is slowed down, not stored

    def keep_to_budget(self) -> None:
        """End the session once the meter says it cost ``--max-cost``, idle or in a cell (which then
        ends as under any end of its session)."""
        budget = self.options.max_cost
        spent = self.model.cost() if budget is not None and self.model.stop_reason is None else None
        if budget is not None and spent is not None and spent.amount >= budget:
            self._over_budget = True
            self._end(budget_reached(spent, budget), wait=False)  # the pump reads on until the job stopped

    def _replaced(self, event: events.Restarted) -> None:
        """SageMaker started the session's job again (a spot interruption) on new instances: what
        the ranks held is gone and a cell that ran is lost, so the session ends instead of going on
        as if nothing happened (its ranks never run an earlier cell again: ``s3channel.S3RankEnd``)."""
        # (no cell may start now; the pump reads on until the job stopped)
        self._end(f"{event.cause}: the job's instances were replaced, and what the ranks held with them", wait=False)

    def _closing_reason(self) -> str:
        closing, end = self.model.closing, self.model.exit
        if closing:
            return closing
        if end is not None and end.refused:
            return f"the launcher refused to start the ranks: {end.refused}"
        if end is not None and (end.reports or end.reason):
            said = [f"rank {r} {why}" for r, why in sorted(end.reports.items())]
            return "; ".join(said + ([end.reason] if end.reason else []))
        return "its launcher exited"

    def _let_go(self, reason: str) -> None:
        """This notebook holds the session no more; its ranks run on (another notebook may take them over)."""
        assert self._ranks is not None
        self._ranks.let_go(reason)
        if self._pump is not None and not self._pump.is_current:
            self._pump.join(LEAVE_WAIT)
        with self._lock:
            self.model.fold(events.StopRequested(self._ranks.released or reason))
        atexit.unregister(self._at_exit)
        if self.job_dir:
            jobdir.record(self.job_dir, status="stopped", ended=time.time(), reason=self.ended_reason)
        self._end_run()

    def _end(self, reason: str, wait: bool = True) -> None:
        """Stop everything of the session now; idempotent."""
        with self._lock:
            self.model.fold(events.StopRequested(reason))  # (the first reason stays)
        if self._ranks is not None:
            self._ranks.stop(wait)
        if wait and self._pump is not None and not self._pump.is_current:
            self._pump.join(LEAVE_WAIT)
        atexit.unregister(self._at_exit)
        if self.job_dir:
            jobdir.record(self.job_dir, status="stopped", ended=time.time(), reason=self.ended_reason)
        self._end_run()

    def _end_run(self) -> None:
        """The session has ended: so does its run (once a cell in flight has written its record),
        finished if the notebook stopped it or its ranks ended it for idleness, killed at its budget,
        else failed (its ranks lost, torn down after a cell); once. The pump thread does not wait."""
        if self.tracking_run is not None:
            status = ("completed" if self._stopped_here or self.model.closing else
                      "stopped" if self._over_budget else "failed")
            on_pump = self._pump is not None and self._pump.is_current
            self.tracking_run.end(status, ConsoleEcho().say, wait=0 if on_pump else tracking.FINISH_WAIT)

    # -- cells ------------------------------------------------------------------------------

    def run(self, job_dir: str, digest: str | None) -> SessionCell:
        """Hand the cell in ``job_dir`` to the ranks; its events go to the ``SessionCell`` returned."""
        ranks = self._ranks
        assert ranks is not None and self.status == "idle", "a cell runs on an idle session"
        with self._lock:
            self.model.fold(events.CellSent(self.cells + 1))
            cell = self._cell = SessionCell(self, self.cells, self.clock)
            now = time.time()
            for state in self.model.ranks:  # the cell's ranks are the session's, already up: who and where
                if state.pid:
                    cell.queue.put(events.RankStarted(state.rank, state.instance, state.local_rank, self.world_size,
                                                      state.host, state.pid, time=now))
            for state in self.model.ranks:  # and what they use (a rank reports that only as it changes), in
                # the room a huge world leaves: the queue is read only once this returns
                if (state.cpu is not None or state.rss is not None) and cell.queue.qsize() < QUEUE_SIZE // 2:
                    cell.queue.put(events.Resources(state.rank, state.cpu, state.rss, state.gpu_memory, state.gpu_util,
                                                    time=now))
            billing = self.model.billing
            if billing is not None:  # the instance time billed so far shows from the cell's start
                if billing.running:
                    billed = billing.instance_seconds + billing.instances * (self.clock() - self.model.billing_at)
                    billing = dataclasses.replace(billing, instance_seconds=billed)
                cell.queue.put(billing)
            allocation = self.model.allocation
            if allocation is not None and allocation.time_left is not None:  # the time left shows from the start
                cell.queue.put(dataclasses.replace(allocation, time_left=self.model.time_left()))
        try:
            ranks.send_cell(cell.number, job_dir, digest)
        except OSError as exc:
            self.cell_ended(cell)
            self._end(str(exc) if ranks.released else f"rank 0 could not be reached ({exc})")
            raise JobError(self.ended_sentence()) from None
        return cell

    def tell_ended(self) -> bool:
        """True the first time it is asked after the session ended: the caller says so to the user."""
        if self.status != "stopped" or self._told_ended:
            return False
        self._told_ended = True
        return True

    def stayed_is_news(self, name: str) -> bool:
        """True the first time ``name`` stays on the ranks since it was last brought back."""
        if name in self._told_stayed:
            return False
        self._told_stayed.add(name)
        return True

    def brought_back(self, names) -> None:
        """These names are in the notebook again: their staying on the ranks is news once more."""
        self._told_stayed.difference_update(names)

    def cell_ended(self, cell: SessionCell) -> None:
        """``cell`` is over (every rank back, or the session gone): the session is idle again."""
        with self._lock:
            if self._cell is cell:
                self._cell = None
            self.idle_since = self.clock()
        while True:  # what arrived after the cell ended belongs to the time between cells
            try:
                event = cell.queue.get_nowait()
            except queue.Empty:
                break
            self.route(event)

    def interrupt(self, ranks: list[int]) -> None:
        assert self._ranks is not None
        pids = self._pids()
        self._ranks.interrupt({r: pids[r] for r in ranks if r in pids})

    @property
    def stacks_dir(self) -> str | None:
        """Where the ranks dump their stacks when signalled (None: the backend cannot signal them)."""
        return self._ranks.stacks_dir if self._ranks is not None else None

    def request_stacks(self) -> bool:
        """Ask the ranks for their stacks through their own channel (the answers come as events)."""
        return self._ranks is not None and self._ranks.request_stacks()

    def roll_call(self, limit: float | None = None) -> dumps.Snapshot:
        """Where the session's ranks are now, grouped ("ranks 0, 1 waiting for a cell" while idle); a
        running cell's own roll-call names the cell's lines. Asked through ``stacks_dir`` where the
        notebook can signal the ranks, else through the ranks' channel (Slurm, S3), whose answers
        take the channel's latency more (``limit``: seconds they get, by default)."""
        if self.stacks_dir is not None:
            return dumps.Snapshot(*ask_ranks(self.stacks_dir, self.model.ranks, limit or dumps.ANSWER_LIMIT), CELL, [])
        asked_at = self.clock()
        if not self.request_stacks():
            raise JobError(f"the ranks of session {self.name} ({self.backend}) cannot be asked for their stacks: "
                           "the session has ended")
        limit = dumps.ANSWER_LIMIT + self.latency if limit is None else limit
        return dumps.Snapshot(*reported_answers(self.model, asked_at, limit, self.clock), CELL, [])

    @property
    def latency(self) -> float:
        """Seconds the channel adds before the notebook sees interrupted ranks back (S3 and CloudWatch)."""
        return self._ranks.latency if self._ranks is not None else 0.0

    def tear_down(self, reason: str) -> None:
        """The world cannot be whole again (a rank stuck in a collective): stop everything."""
        self._end(reason)

    def fetch_results(self, job_dir: str, ranks, kind: str = RESULTS) -> None:
        assert self._ranks is not None
        self._ranks.fetch_results(job_dir, ranks, kind)

    def ended_under_a_cell(self) -> str:
        """The launcher exited while a cell ran: the reason is the launcher's, unless one was set."""
        with self._lock:
            self.model.fold(events.StopRequested(self._closing_reason()))  # (unless one was)
        return self.ended_sentence()

    @property
    def released(self) -> bool:
        """Another notebook took the session over: its ranks run on, held from there."""
        return self._ranks is not None and self._ranks.released is not None

    def ended_sentence(self) -> str:
        if self.released:
            return (f"session {self.name} is not this notebook's any more: {self.ended_reason}; its ranks run on "
                    f"(%mpirun_session attach {self.job_name} takes it back here)")
        return (f"session {self.name} ended: {self.ended_reason}; every rank was stopped and the session's state "
                "is gone (the next cell runs as a one-off job, or start a new session with %mpirun_session start)")


class Pump:
    """The thread that reads a session's ranks until they end: each event goes to the session
    (``Session.route``: between cells its model, during one the cell), the session is kept to its
    budget between reads, and told when the ranks have ended."""

    READ_WAIT = 0.2  # seconds one read waits for the ranks' first event

    def __init__(self, session: Session, ranks: SessionRanks):
        self.session, self.ranks = session, ranks
        self._thread = threading.Thread(target=self._run, name=f"mpi_magic {session.name}", daemon=True)
        self._thread.start()

    @property
    def is_current(self) -> bool:
        """True on the pump's own thread (which must not wait for itself)."""
        return threading.current_thread() is self._thread

    def join(self, timeout: float) -> None:
        self._thread.join(timeout=timeout)

    def _run(self) -> None:
        while True:
            for event in self.ranks.poll(self.READ_WAIT):
                self.session.route(event)
            if self.ranks.finished:
                break
            self.session.keep_to_budget()
        self.session.ranks_ended(self.ranks)


class SessionCell:
    """One cell on a session, as the follower sees a backend job: finished once every rank has
    reported and is back to waiting (or the session ended). An interrupt reaches the ranks still
    in the cell; those not back within the session's grace period tear the session down."""

    launcher = None  # a cell's ranks are the session's: its folder records their launcher
    abort_grace = 0.0  # a failed rank interrupts the others at once, as the launcher would stop them
    linger = None

    def __init__(self, session: Session, number: int, clock: Callable[[], float]):
        self.session, self.number, self.clock = session, number, clock
        self.queue: queue.Queue[events.Event] = queue.Queue(maxsize=QUEUE_SIZE)
        self.reported: set[int] = set()
        self.back: set[int] = set()  # waiting for the next cell again
        self._done = False
        self._interrupted_at: float | None = None
        self._why_interrupted = ""

    @property
    def stacks_dir(self) -> str | None:
        return self.session.stacks_dir

    def request_stacks(self) -> bool:
        return self.session.request_stacks()  # (where they are asked through stacks_dir: False)

    @property
    def finished(self) -> bool:
        return self._done

    def poll(self, timeout: float) -> list[events.Event]:
        batch: list[events.Event] = []
        try:
            batch.append(self.queue.get(timeout=timeout))
            while len(batch) < MAX_BATCH:
                batch.append(self.queue.get_nowait())
        except queue.Empty:
            pass
        shown: list[events.Event] = []
        for event in batch:
            if isinstance(event, events.RankReady):
                if event.cell == self.number:
                    self.back.add(event.rank)
                continue
            if isinstance(event, events.SessionClosing):
                continue
            if isinstance(event, events.RankFinished):
                self.reported.add(event.rank)
                if not event.ok and self._interrupted_at is None:
                    self._why_interrupted = f"rank {event.rank} failed"
            if isinstance(event, events.LauncherExited):  # the session ended under the cell
                self._end()
                ended = self.session.ended_under_a_cell()
                shown += [dataclasses.replace(event, reason=ended), events.Note(ended)]
                return shown
            shown.append(event)
        world = self.session.world_size
        if not self._done and len(self.back) == world and len(self.reported) == world:
            self._end()
            shown.append(events.CellEnded(0))
        elif not self._done and self._interrupted_at is not None and \
                self.clock() - self._interrupted_at > self.session.grace + self.session.latency:
            stuck = [r for r in range(world) if r not in self.back]
            self.session.tear_down(f"{ranks_phrase(stuck)} did not get back to waiting within "
                                   f"{self.session.grace + self.session.latency:g}s after "
                                   f"{self._why_interrupted or 'the interrupt'} (blocked in a collective?)")
        return shown

    def _end(self) -> None:
        self._done = True
        self.session.cell_ended(self)

    def cancel(self) -> None:
        """Interrupt the cell on every rank still in it (once); the grace period starts now."""
        if self._interrupted_at is not None or self._done:
            return
        self._interrupted_at = self.clock()
        self.session.interrupt([r for r in range(self.session.world_size) if r not in self.reported])

    def fetch_results(self, job_dir: str, ranks, kind: str = RESULTS) -> None:
        self.session.fetch_results(job_dir, ranks, kind)


def describe(session: Session) -> str:
    """What ``%mpirun_session`` prints."""
    lines = [f"session {session.name}: {session.backend}, {session.instances} x {session.procs_per_instance} = "
             f"{session.world_size} ranks, {session.status}"]
    if session.status != "stopped":
        lines += session.facts()
    ranks = session.ranks
    alive = sum(1 for r in ranks if r.status in ("idle", "running"))
    facts = [f"ranks alive: {alive}/{session.world_size}", f"cells run: {session.cells}"]
    idle = session.idle_for()
    if idle is not None:
        facts.append(f"idle for: {idle:.0f}s")
    left = session.model.time_left()
    if left is not None:
        facts.append("no time limit" if left == math.inf else f"time left: {clock(left)}")
    budget, spent = session.options.max_cost, session.model.cost()
    if budget is not None:
        facts.append(f"spent: {spent} of --max-cost {dollars(budget)}" if spent else f"--max-cost: {dollars(budget)}")
    memory = session.memory()
    if memory:
        from ..shared.payload import size_text

        facts.append(f"memory per rank: {size_text(sum(memory.values()) / len(memory))} "
                     f"(largest {size_text(max(memory.values()))})")
    lines.append(", ".join(facts))
    said = session.said_between_cells()
    if said:
        lines.append("said between cells:\n  " + "\n  ".join(said))
    if session.status == "stopped" and session.ended_reason:
        lines.append(f"ended: {session.ended_reason}")
    held = session.holdings.held_names()
    if held and session.status != "stopped":
        more = f", ... ({len(held)} in all)" if len(held) > 20 else ""
        lines.append("names the ranks hold: " + ", ".join(held[:20]) + more)
    return "\n".join(lines)
