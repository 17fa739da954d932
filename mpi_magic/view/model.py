"""Job state folded from events: the one place a job's state lives. It draws nothing; the
widget and text views render it, and the job and session handles read it (a session's model
folds the events of its ranks' life between and around cells: who is up, waiting, billed).

Rates, ETAs and the step times that name stragglers (``pace.py``) come from the ranks' own
timestamps, elapsed times from an injected clock, so tests are deterministic.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from ..shared import events
from ..shared.cost import Cost, estimate
from ..shared.metrics import MetricStore
from ..errors import JobError, RankExitError, RankFailure, RemoteRankError, first_failed_first, ranks_phrase
from .pace import Slow, Stragglers, ended_by

ACTIVE = ("starting", "running")
ENDED = ("completed", "failed", "stopped")
BEFORE_RANKS = frozenset({"packaging", "submitting", "queued", "starting", "restarting"}) | events.STARTING_PHASES
OUTPUT_TAIL = 200
LIVE_LINE = 4000  # characters of one output line kept for the live view (the log keeps it whole)
WAITING_AFTER = 30.0  # seconds without progress or output from any rank before the view says who waits (a stall)


@dataclass
class Bar:
    n: float = 0.0
    total: float | None = None
    desc: str = ""
    first: tuple[float, float] | None = None  # (time, n) of the first update, for the rate
    last_time: float = 0.0
    closed: bool = False

    @property
    def rate(self) -> float | None:
        if self.first is None or self.last_time <= self.first[0]:
            return None
        return (self.n - self.first[1]) / (self.last_time - self.first[0])


@dataclass
class RankState:
    """One rank as the user sees it (also ``job.ranks[r]``)."""

    rank: int
    instance: int
    local_rank: int
    host: str = ""
    pid: int = 0
    status: str = "starting"  # starting, running, completed, failed, stopped
    failure: RankFailure | None = None
    bars: dict[int, Bar] = field(default_factory=dict)
    last_line: str = ""
    started_at: float | None = None
    ended_at: float | None = None  # by its own clock: which rank failed first is judged by it
    failed_at: float | None = None  # by the notebook's clock, for stopping the others after a grace
    gone: bool = False  # its process vanished without reporting; settled when the launcher exits
    tail: deque = field(default_factory=lambda: deque(maxlen=OUTPUT_TAIL))
    outputs: int = 0  # lines seen, so a view knows when its tail changed
    attempt: int = 1  # of the job (2 and on after it started again)
    ready_after: int | None = None  # in a session: the cell it finished last, waiting for the next (0: up)
    post_mortem: str = ""  # where it failed: the SHA-256 of the frames and locals it kept for %mpirun_debug
    post_mortem_lost: str = ""  # or why it kept none
    # what it uses, as the rank last sampled it (None until it reports, or where it has no GPU)
    cpu: float | None = None  # percent of one core
    rss: int | None = None  # resident memory, bytes
    gpu_memory: int | None = None  # bytes it holds on GPUs
    gpu_util: float | None = None  # percent busy, of the GPU it uses
    peak_rss: int | None = None  # the largest rss sampled
    peak_gpu_memory: int | None = None
    steps: float = 0.0  # what its bars counted, every bar together (its pace: ``pace.py``)
    stepped_at: float = 0.0  # when it made its latest step, by its own clock

    def restart(self, attempt: int) -> "RankState":
        """This rank as the job starts again: what it did belongs to the attempt that ended; its
        output stays in the tail, as in the log."""
        return RankState(self.rank, self.instance, self.local_rank, tail=self.tail, outputs=self.outputs,
                         attempt=attempt)

    @property
    def bar(self) -> Bar | None:
        """The bar that stands for the rank: its outermost open one, else the one that closed last
        (the outer loop of nested bars, the last of bars in sequence)."""
        open_bars = [i for i, b in self.bars.items() if not b.closed]
        if open_bars:
            return self.bars[min(open_bars)]
        return max(self.bars.items(), key=lambda item: (item[1].last_time, item[0]))[1] if self.bars else None

    @property
    def stepping(self) -> bool:
        """Running with steps left: its bar is open and short of its total."""
        bar = self.bar
        return (self.status == "running" and bar is not None and not bar.closed
                and not (bar.total and bar.n >= bar.total))

    @property
    def n(self) -> float:
        return self.bar.n if self.bar else 0.0

    @property
    def total(self) -> float | None:
        return self.bar.total if self.bar else None

    @property
    def fraction(self) -> float | None:
        bar = self.bar
        if self.status == "completed" and (bar is None or not bar.total):
            return 1.0
        if bar is None or not bar.total:
            return None
        return min(1.0, bar.n / bar.total)

    @property
    def rate(self) -> float | None:
        return self.bar.rate if self.bar else None

    @property
    def elapsed(self) -> float | None:
        """Seconds this rank has run (by its own clock), up to its last event."""
        if self.started_at is None:
            return None
        ends = [t for t in (self.ended_at, *(b.last_time for b in self.bars.values())) if t]
        return max(ends, default=self.started_at) - self.started_at

    @property
    def eta(self) -> float | None:
        bar, rate = self.bar, self.rate
        if bar is None or not bar.total or not rate or self.status not in ACTIVE:
            return None
        return max(0.0, (bar.total - bar.n) / rate)


class JobModel:
    """A job as folded from its events: phase, every rank's state, and how the job ended."""

    def __init__(self, name: str, backend: str, world_size: int, procs_per_instance: int,
                 clock: Callable[[], float] = time.monotonic):
        self.name, self.backend, self.world_size = name, backend, world_size
        self.procs_per_instance = procs_per_instance
        self.ranks = [RankState(r, r // procs_per_instance, r % procs_per_instance) for r in range(world_size)]
        self.phase = "packaging"
        self.clock = clock
        self.started_at = clock()
        self.ended_at: float | None = None
        self.last_activity = self.started_at  # when a rank last showed life (events.SIGNS_OF_LIFE), by our clock
        self.version = 0  # bumped on every change, so views redraw only when needed
        self.tail: deque = deque(maxlen=OUTPUT_TAIL)  # (rank, stream, text) of every rank, in order
        self.launcher_tail: deque = deque(maxlen=20)
        self.outputs = 0
        self.notes: list[str] = []  # what the backend reports at the end (FailureReason)
        self.billing: events.Billing | None = None  # the latest, and when it came (by our clock)
        self.billing_at = 0.0
        self.allocation: events.Allocation | None = None  # the scheduler's latest word, and when it came
        self.allocation_at = 0.0
        self.stop_reason: str | None = None
        self.exit: events.LauncherExited | None = None
        self.result_digests: dict[int, str] = {}  # as each rank reported them
        self.unreturned: dict[str, str] = {}
        self.attempt = 1  # 2 and on after the job started again (a spot interruption)
        self.restart_reason = ""  # why it last did ("spot interruption: restarting, attempt 2")
        self.restart_cause = ""  # the same, in a word or two ("spot interruption")
        self.cells = 0  # a session's: cells handed to its ranks
        self.closing = ""  # a session's: the reason rank 0 gave when it ended the session
        self.roll_call = ""  # where every rank was when last asked (at a stall, or on request)
        self.roll_call_for: float | None = None  # the stall it was taken for (``last_activity`` then)
        self.roll_call_at = 0.0  # when the latest was taken, by our clock
        self.roll_call_quiet: float | None = None  # how long the ranks had been quiet then, if taken for that
        # each rank's latest stack sent through the log: (frames, when it arrived, by our clock)
        self.reported_stacks: dict[int, tuple[list, float]] = {}
        self._stacks_news = False  # stacks arrived that no roll-call counts yet
        self.stall_after = WAITING_AFTER  # seconds of quiet that make a stall (%mpirun_config stall_after)
        self.metrics = MetricStore()  # every rank's metric series (``job.metrics``, the charts)
        self.clock_offsets = events.ClockOffsets()  # so ranks' times on different instances compare
        self.pace = Stragglers(world_size)  # which ranks hold the others back
        # sees every event folded but output lines, which the job's logs keep (the job's record)
        self.recorder: Callable[[events.Event], None] | None = None

    @property
    def num_instances(self) -> int:
        return (self.world_size + self.procs_per_instance - 1) // self.procs_per_instance

    @property
    def status(self) -> str:
        """running until the launcher has exited; then stopped, failed or completed."""
        if self.exit is None:
            return "running"
        if self.stop_reason is not None:
            return "stopped"
        return "failed" if self.error() is not None else "completed"

    @property
    def first_failure_at(self) -> float | None:
        """When the first rank still counted as failed failed (by our clock)."""
        times = [s.failed_at for s in self.ranks if s.status == "failed" and s.failed_at is not None]
        return min(times, default=None)

    def fold(self, event: events.Event) -> None:
        """Take in one event: the handler of its type (``_HANDLERS``) changes the state, and says
        whether a view has something new to draw."""
        if self.recorder is not None and type(event) is not events.Output:
            self.recorder(event)
        for kind in type(event).__mro__:  # (an event of a subclass is one of its base: CellEnded, LauncherExited)
            handler = _HANDLERS.get(kind)
            if handler is not None:
                if handler(self, event) is not False:
                    self.version += 1
                    if kind in events.SIGNS_OF_LIFE:
                        self.last_activity = self.clock()
                return

    def fold_lines(self, lines: list[events.Output]) -> None:
        """``fold`` of each of many output lines at once (a flood's): the same, in one loop."""
        output, taken = self._output, 0
        for event in lines:
            if output(event) is not False:
                taken += 1
        if taken:
            self.version += taken
            self.last_activity = self.clock()

    def _progress(self, event: events.Progress) -> bool | None:  # the most frequent event: kept short
        if not 0 <= event.rank < self.world_size:
            return False
        state = self.ranks[event.rank]
        n, stamped = event.n, event.time
        bar = state.bars.get(event.bar)
        if bar is None:
            bar = state.bars[event.bar] = Bar()
        elif stamped < bar.last_time:
            return False  # older than the state shown (a session cell's log catching up with its end record)
        made = n - bar.n
        if made > 0:
            state.steps += made
            state.stepped_at = stamped
        if made < 0 or bar.first is None:  # a new bar, or one restarted (reset), measures its rate anew
            bar.first = (stamped, n)
        bar.n, bar.total, bar.last_time, bar.closed = n, event.total, stamped, event.closed
        now = self.clock()
        if now >= self.pace.due:
            self.pace.assess(now, self.ranks, self.stall_after)
        self.clock_offsets.heard(state.instance, stamped, now)
        if event.desc:
            bar.desc = event.desc
        if state.status == "starting":
            state.status = "running"
        return None

    def _output(self, event: events.Output) -> bool | None:  # a flood's every line: kept short
        rank = event.rank
        if not 0 <= rank < self.world_size:
            return False
        state = self.ranks[rank]
        text = event.text if len(event.text) <= LIVE_LINE else event.text[:LIVE_LINE] + " [...]"
        state.tail.append((event.stream, text))
        state.outputs += 1
        self.tail.append((rank, event.stream, text))
        self.outputs += 1
        if text.strip():
            state.last_line = text
        return None

    def _metrics(self, event: events.Metrics) -> bool | None:
        if not self._valid(event.rank):
            return False
        self.metrics.fold(event.rank, event.points)
        return None

    def _launcher_output(self, event: events.LauncherOutput) -> bool:
        if event.text.strip():
            self.launcher_tail.append(event.text[:LIVE_LINE])
        return False  # not shown live: no redraw needed

    def _rank_started(self, event: events.RankStarted) -> bool | None:
        if not self._valid(event.rank):
            return False
        state = self.ranks[event.rank]
        state.host, state.pid, state.started_at = event.host, event.pid, event.time
        self.clock_offsets.heard(state.instance, event.time, self.clock())
        if state.status == "starting":
            state.status = "running"
        if self.phase in BEFORE_RANKS:
            self.phase = "running"
        return None

    def _rank_finished(self, event: events.RankFinished) -> bool | None:
        if not self._valid(event.rank):
            return False
        self._finished(event)
        return None

    def _rank_gone(self, event: events.RankGone) -> bool | None:
        if not self._valid(event.rank) or self.ranks[event.rank].status not in ACTIVE:
            return False
        self.ranks[event.rank].gone = True
        return None

    def _note(self, event: events.Note) -> None:
        self.notes.append(event.text)

    def _billing(self, event: events.Billing) -> bool | None:
        before, self.billing, self.billing_at = self.billing, event, self.clock()
        if before is not None and before.running and event.running and before.hourly_price == event.hourly_price:
            return False  # the figure moves on by the clock anyway: no redraw (nor text line) for each report
        return None

    def _phase(self, event: events.Phase) -> bool | None:
        if event.name in events.STARTING_PHASES and any(s.status != "starting" for s in self.ranks):
            return False  # read after the ranks started (SageMaker's status is read every 5-30 s): no news
        self.phase = event.name
        if event.name in ENDED:
            self.ended_at = self.ended_at or self.clock()
            self._stop_active()
        return None

    def _allocation(self, event: events.Allocation) -> None:
        self.allocation, self.allocation_at = event, self.clock()
        if event.state == events.QUEUED and self.phase in BEFORE_RANKS:
            self.phase = "queued"
        elif event.state == events.RUNNING and self.phase == "queued":
            self.phase = "starting"

    def _restarted(self, event: events.Restarted) -> None:
        self.attempt, self.phase, self.restart_reason = event.attempt, "restarting", event.reason
        self.restart_cause = event.cause
        self.notes.append(f"{event.cause}: started again as attempt {event.attempt}")  # read after it ended
        self.result_digests.clear()
        self.unreturned.clear()
        self.launcher_tail.clear()  # the ended attempt's launcher said how it ended, not how this one does
        self.reported_stacks.clear()
        self.clock_offsets.clear()  # the attempt runs on new instances, with clocks of their own
        self.ranks = [state.restart(event.attempt) for state in self.ranks]
        self.metrics = MetricStore()
        self.pace = Stragglers(self.world_size)
        self.last_activity = self.clock()

    def _resources_event(self, event: events.Resources) -> bool | None:
        if not self._valid(event.rank):
            return False
        self._resources(event)  # not activity: ranks that only report resources have gone quiet
        return None

    def _rank_ready(self, event: events.RankReady) -> bool | None:
        if not self._valid(event.rank):
            return False
        self.ranks[event.rank].ready_after = event.cell
        return None

    def _session_closing(self, event: events.SessionClosing) -> None:
        self.closing = event.reason

    def _rank_stacks(self, event: events.RankStacks) -> bool:
        if self._valid(event.rank):
            self.reported_stacks[event.rank] = (event.frames, self.clock())
            self._stacks_news = True
        return False  # no sign of life, and nothing to draw until the roll-call made of them

    def _roll_call(self, event: events.RollCall) -> None:
        self.roll_call, self.roll_call_at = event.text, self.clock()
        self.roll_call_quiet = self.roll_call_at - self.last_activity if event.stall else None
        if event.stall:
            self.roll_call_for = self.last_activity

    def _cell_sent(self, event: events.CellSent) -> None:
        self.cells = max(self.cells, event.number)

    def _stop_requested(self, event: events.StopRequested) -> None:
        if self.stop_reason is None:
            self.stop_reason = event.reason

    def _launcher_exited(self, event: events.LauncherExited) -> None:
        if self.exit is None:
            self.exit = event
            self._settle(event)
            self.pace.assess(self.clock(), self.ranks, self.stall_after)  # how each spell ended
            self.pace.end(self.ranks)

    def _finished(self, event: events.RankFinished) -> None:
        state = self.ranks[event.rank]
        self.clock_offsets.heard(state.instance, event.time, self.clock())
        if state.status in ENDED:
            return  # a rank ends once
        state.ended_at, state.gone = event.time, False
        if event.ok:
            state.status = "completed"
            if event.results_digest:
                self.result_digests[event.rank] = event.results_digest
            if event.rank == 0:
                self.unreturned.update(event.unreturned)
        elif event.error_type == "KeyboardInterrupt":  # the launcher or the user stopped it
            state.status = "stopped"
        else:
            state.status = "failed"
            state.failed_at = self.clock()
            state.failure = RankFailure(event.rank, state.instance, state.host, event.error_type,
                                        event.message, event.traceback)
            state.post_mortem, state.post_mortem_lost = event.post_mortem, event.post_mortem_lost

    def _resources(self, event: events.Resources) -> None:
        state = self.ranks[event.rank]
        state.cpu, state.rss, state.gpu_memory, state.gpu_util = event.cpu, event.rss, event.gpu_memory, event.gpu_util
        if event.rss is not None:
            state.peak_rss = max(state.peak_rss or 0, event.rss)
        if event.gpu_memory is not None:
            state.peak_gpu_memory = max(state.peak_gpu_memory or 0, event.gpu_memory)

    def _settle(self, end: events.LauncherExited) -> None:
        """The launcher is gone: every rank still active ended with it."""
        stopped = self.stop_reason is not None
        for state in self.ranks:
            report = end.reports.get(state.rank)
            if state.status in ACTIVE:
                if report and not stopped:
                    state.status, state.failed_at = "failed", self.clock()
                    state.failure = RankFailure(state.rank, state.instance, state.host, message=report)
                else:
                    state.status = "stopped"
            elif state.failure is not None and not state.failure.error_type and report:
                state.failure.message = report  # "exited before the cell finished" -> its exit status

    def failed_first(self) -> list[RankState]:
        """The ranks that failed, the first first: by when each failed by its own clock, corrected
        to ours by its instance's offset (``clock_offsets``); a failure that is a peer's loss after
        the others. Sets each failure's ``at``."""
        failures = [state.failure for state in self.ranks if state.failure is not None]
        for failure in failures:
            state = self.ranks[failure.rank]
            failure.at = self.clock_offsets.ours(failure.instance, state.ended_at or None) or state.failed_at
        return [self.ranks[failure.rank] for failure in first_failed_first(failures)]

    def error(self) -> JobError | None:
        """What the cell raises for how the job ended (None while running, stopped, or all ok)."""
        if self.exit is None or self.stop_reason is not None or all(s.status == "completed" for s in self.ranks):
            return None  # every rank reported success: how the launcher ended does not matter
        failed = [s.failure for s in self.failed_first() if s.failure is not None]
        raised = [f for f in failed if f.error_type]
        if raised:
            return RemoteRankError(raised, self.world_size, [s.rank for s in self.ranks if s.post_mortem])
        if failed:
            return RankExitError(failed)
        unfinished = [s.rank for s in self.ranks if s.status != "completed"]
        if self.exit.reason and not any(s.host for s in self.ranks):  # (a rank says where it runs as it starts)
            return RankExitError([], f"the job ended before its ranks started: {self.exit.reason}")
        if self.exit.reason:  # the backend knows better than the launcher's words
            return RankExitError([], f"ranks {unfinished} stopped before the cell finished: {self.exit.reason}")
        if self.exit.refused:
            return RankExitError([], f"the launcher refused to start the job: {self.exit.refused}")
        tail = "\n".join(self.launcher_tail)
        hosts = list(dict.fromkeys(s.host for s in self.ranks if s.status != "completed" and s.host))
        where = f" on {' and '.join(hosts)}" if hosts else ""
        # Open MPI 5's mpirun exits with 0 when it loses a host: the ranks' own word is what counts
        anyway = " all the same (as Open MPI's does when it loses a host)" if self.exit.returncode == 0 else ""
        return RankExitError([], f"ranks {unfinished}{where} stopped before the cell finished; the launcher exited "
                                 f"with status {self.exit.returncode}{anyway}" + (f":\n{tail}" if tail else ""))

    def _valid(self, rank: int | None) -> bool:
        return rank is not None and 0 <= rank < self.world_size

    def _stop_active(self) -> None:
        for state in self.ranks:
            if state.status in ACTIVE:
                state.status = "stopped"

    # -- what views show ------------------------------------------------------------------

    def elapsed(self) -> float:
        return (self.ended_at or self.clock()) - self.started_at

    def time_left(self) -> float | None:
        """Seconds left of the allocation's time limit, counted down by our clock since the scheduler
        said; math.inf without a limit; None where unknown, before it runs, and after the job ended."""
        allocation = self.allocation
        if allocation is None or allocation.state != events.RUNNING or allocation.time_left is None or \
                self.exit is not None:
            return None
        return max(0.0, allocation.time_left - (self.clock() - self.allocation_at))

    def billable_seconds(self) -> float | None:
        """Instance-seconds billed so far: the backend's latest figure, moved on by our clock while
        the instances run (None for a backend that bills nothing, as the local one)."""
        billing = self.billing
        if billing is None:
            return None
        if not billing.running:
            return billing.instance_seconds
        since = max(0.0, (self.ended_at or self.clock()) - self.billing_at)
        return billing.instance_seconds + billing.instances * since

    def cost(self) -> Cost | None:
        """The estimated cost of ``billable_seconds()``; None when there is no price for it."""
        seconds = self.billable_seconds()
        if seconds is None or self.billing is None:
            return None
        return estimate(self.billing.hourly_price, seconds, self.billing.spot)

    def counts(self) -> dict[str, int]:
        counts = {s: 0 for s in ("starting", "running", "completed", "failed", "stopped")}
        for state in self.ranks:
            counts[state.status] += 1
        return counts

    def progress(self) -> float | None:
        """Mean fraction done over ranks that report one (None when none does)."""
        fractions = [f for f in (s.fraction for s in self.ranks) if f is not None]
        return sum(fractions) / len(fractions) if fractions else None

    def slowest(self, count: int = 5) -> list[RankState]:
        """Running ranks furthest behind, by fraction done."""
        running = [s for s in self.ranks if s.status == "running" and s.fraction is not None]
        return sorted(running, key=lambda s: (s.fraction, s.rank))[:count]

    def stragglers(self) -> list[Slow]:
        """The ranks named as stragglers now: slower than the others, or stopped while they go on
        (``pace.py``), looked at again when due."""
        now = self.clock()
        if self.exit is None and now >= self.pace.due and self.pace.assess(now, self.ranks, self.stall_after):
            self.version += 1
        return sorted(self.pace.named.values(), key=lambda slow: (slow.kind != "stopped", -slow.ratio, slow.rank))

    def straggler_spells(self) -> list[Slow]:
        """What the summary tells: each rank's spell as a straggler that lasted to its end or long
        enough (``pace.NOTABLE``), and those still named, as lasting until now."""
        spells = dict(self.pace.spells)
        for rank, slow in self.pace.named.items():
            spells[rank] = dataclasses.replace(slow, ended_by=ended_by(self.ranks[rank]) or "now")
        return [spells[rank] for rank in sorted(spells)]

    def largest(self, count: int = 5, measure: str = "rss") -> list[RankState]:
        """The ranks that hold the most memory now (``measure``: rss or gpu_memory), largest first."""
        known = [s for s in self.ranks if getattr(s, measure)]
        return sorted(known, key=lambda s: (-getattr(s, measure), s.rank))[:count]

    def by_instance(self) -> list[list[RankState]]:
        return [self.ranks[i:i + self.procs_per_instance] for i in range(0, self.world_size, self.procs_per_instance)]

    def new_reported_stacks(self) -> bool:
        """True once for the stacks that arrived through the log since it was last asked."""
        news, self._stacks_news = self._stacks_news, False
        return news

    def stall_needs_roll_call(self) -> bool:
        """True once the ranks have gone quiet, until a roll-call is taken for this stall."""
        return self.roll_call_for != self.last_activity and self.waiting() is not None

    def stall_roll_call(self) -> str:
        """The roll-call of the stall going on now ("" while output flows, or before it is taken)."""
        return self.roll_call if self.roll_call_for == self.last_activity else ""

    def waiting(self, threshold: float | None = None) -> str | None:
        """Who waits, once no rank has made progress or printed for ``threshold`` seconds
        ("ranks 0, 1, 3 have been waiting 40s; rank 2 finished"): a hint that the job may be
        deadlocked, for the user to interrupt. None while output flows."""
        quiet = self.clock() - self.last_activity
        if self.phase == "queued":  # the scheduler has not started it: nobody waits for another
            return None
        if self.exit is not None or quiet < (self.stall_after if threshold is None else threshold):  # the usual case, asked at every redraw
            return None
        active = [s.rank for s in self.ranks if s.status in ACTIVE and not s.gone]
        if not active:
            return None
        text = f"{ranks_phrase(active)} {'has' if len(active) == 1 else 'have'} been waiting {quiet:.0f}s"
        others: dict[str, list[int]] = {}
        for state in self.ranks:
            if state.status not in ACTIVE or state.gone:
                verb = "exited without reporting" if state.gone else {
                    "completed": "finished", "failed": "failed", "stopped": "stopped"}[state.status]
                others.setdefault(verb, []).append(state.rank)
        return "; ".join([text] + [f"{ranks_phrase(ranks)} {verb}" for verb, ranks in others.items()])


# What each event changes, by its type (an event of another type changes nothing): a new event
# is a new handler, not another branch.
_HANDLERS: dict[type, Callable[[JobModel, Any], bool | None]] = {
    events.Progress: JobModel._progress, events.Output: JobModel._output, events.Metrics: JobModel._metrics,
    events.LauncherOutput: JobModel._launcher_output, events.RankStarted: JobModel._rank_started,
    events.RankFinished: JobModel._rank_finished, events.RankGone: JobModel._rank_gone, events.Note: JobModel._note,
    events.Billing: JobModel._billing, events.Phase: JobModel._phase, events.Allocation: JobModel._allocation,
    events.Restarted: JobModel._restarted, events.Resources: JobModel._resources_event,
    events.RankReady: JobModel._rank_ready, events.SessionClosing: JobModel._session_closing,
    events.RankStacks: JobModel._rank_stacks, events.RollCall: JobModel._roll_call,
    events.CellSent: JobModel._cell_sent, events.StopRequested: JobModel._stop_requested,
    events.LauncherExited: JobModel._launcher_exited,
}
