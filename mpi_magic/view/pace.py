"""Which ranks hold the others back: stragglers, named from the times of each rank's own steps.

What is measured, and why. The ranks send when each progress bar moved (tqdm or
``mpi_magic.progress``), stamped by the rank's own clock. A rank's steps are what its bars
counted, every bar together (``RankState.steps``), and its **step time** is the seconds its own
clock took per step over its last ``STEP_WINDOW`` seconds of steps, pauses included (a rank held
up by its own pauses is slower too). A rank is named when its step time is ``SLOWER`` times the
median of the other ranks' (once at least half of the others with bars are measured; and it stays
named until it falls below ``STILL_SLOWER``, so a figure near the line does not come and go).
Metrics' steps are not used: they are the cell's own numbering (a global step, an epoch) and say
nothing of when a rank is done, which a bar's total does. This is what a collective does
not hide when the ranks meet less often than every step (a sharded loop that meets at its end, an
epoch's last allreduce, periodic averaging): between meetings a slower rank takes longer per step
and the others finish first and wait. It is measured on each rank's own clock alone, so clocks that
differ between instances, ranks that move their bars at different points of a step, that started
their loops at different times, or that have shards of different sizes (different totals) all
measure the same step time: none is named for that. A rank's first step (start-up, compilation)
is left out, and a rank is measured once it has ``MEASURED_AFTER`` seconds of steps (measured
anew after it stopped, below).

What it cannot see, and so does not guess at. A collective at *every* step makes every rank wait
for the slowest, so every rank's step takes as long and no rank is named. Where each rank moves its
bar before the collective, the slow one's update comes last each step; but so does the update of a
rank that moves its bar after the collective (or whose clock runs behind, or a later pipeline
stage): from one time per step the two cannot be told apart, so how late a rank's update comes is
not used. The roll-call (``%mpirun_stacks``) of such a job shows the ranks that wait in the
collective and the one still working.

A rank is also named when its steps stopped while the others' went on: no step for the model's
``stall_after`` seconds (and for at least ``STOPPED_STEPS`` of its own step times), while most of
the other ranks made at least ``MIN_ADVANCE`` steps. When every rank is quiet nobody is named here:
that is a stall, which the model's ``waiting`` reports. A rank whose bars are done (at their total,
or closed) waits for the others and is named for neither.

The work is done at most once every ``ASSESS_EVERY`` seconds, for all ranks at once; an event only
adds to its rank's step count.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .model import RankState

ASSESS_EVERY = 0.5  # seconds (of our clock) between two looks at every rank's steps
STEP_WINDOW = 20.0  # seconds of a rank's latest steps (by its clock) its step time is measured over
MEASURED_AFTER = 2.0  # seconds of steps after its first that a rank needs before its step time counts
MIN_STEPS = 3  # and steps
SLOWER = 1.5  # a rank this many times the others' median step time is named
STILL_SLOWER = 1.3  # and stays named down to this
STOPPED_STEPS = 3  # a rank has stopped after this many of its own step times without a step (and stall_after)
MIN_ADVANCE = 3  # steps the others made meanwhile (their median)
NOTABLE = 10.0  # seconds a spell lasts for the summary to tell it, when it did not last until the end


@dataclass
class Slow:
    """A rank named as a straggler: ``kind`` "slower" (its ``step_time`` against the median
    ``others`` of the ``compared`` other ranks measured, over ``span`` seconds; ``reference``: the
    other rank, where one alone was measured) or "stopped" (no step
    for ``quiet`` seconds while ``movers`` of the ``compared`` others made ``advanced`` steps, their
    median). ``since`` and
    ``until``: the first and latest looks that named it (our clock); ``ended_by``: what ended the
    spell, "" while it lasts or where the rank recovered ("it finished", "the job ended")."""

    rank: int
    kind: str
    since: float
    until: float
    step_time: float = 0.0
    others: float = 0.0
    span: float = 0.0
    quiet: float = 0.0
    advanced: float = 0.0
    movers: int = 0
    compared: int = 0
    reference: int = -1
    ended_by: str = ""

    @property
    def ratio(self) -> float:
        return self.step_time / self.others if self.others else 0.0

    @property
    def began(self) -> float:
        """When the spell began (our clock): when the rank was first named, or made its last step."""
        return self.until - self.quiet if self.kind == "stopped" else self.since

    @property
    def lasted(self) -> float:
        """How long the spell lasted: how long it was named, or how long the rank made no step."""
        return self.quiet if self.kind == "stopped" else self.until - self.since


def ended_by(state: RankState) -> str:
    """What ends a straggler's spell when it is no longer named: "" while the rank has steps left
    (it caught up, or went on), else "it finished" (its steps), "it failed", "it stopped"."""
    if state.stepping:
        return ""
    return "it finished" if state.status in ("running", "completed") else f"it {state.status}"


def _median_without(ordered: list[float], index: int) -> float:
    """The median of ``ordered`` (sorted, at least two values) without its value at ``index``."""
    count = len(ordered) - 1

    def at(k: int) -> float:
        return ordered[k if k < index else k + 1]

    return at(count // 2) if count % 2 else (at(count // 2 - 1) + at(count // 2)) / 2


class Stragglers:
    """Every rank's steps, looked at every ``ASSESS_EVERY`` seconds: who is named now (``named``) and the spells
    worth telling at the end (``spells``: per rank, its longest, or the one that lasted to its end)."""

    def __init__(self, world_size: int) -> None:
        self.due = 0.0  # our clock: when the next look is due
        self.named: dict[int, Slow] = {}
        self.spells: dict[int, Slow] = {}
        # per rank: (its clock, its steps) at each look that saw it move, over its last STEP_WINDOW
        self._samples: list[deque] = [deque() for _ in range(world_size)]
        self._counted = array("d", bytes(8 * world_size))  # its steps at the last look
        self._moved: list[float | None] = [None] * world_size  # our clock: the look that saw it move (or its bar come)
        self._before: list[array | None] = [None] * world_size  # every rank's steps at that look

    def assess(self, now: float, ranks: Sequence[RankState], stall_after: float) -> bool:
        """Look at every rank's steps now; True when who is named changed."""
        self.due = now + ASSESS_EVERY
        steps = array("d", (state.steps for state in ranks))
        for rank, state in enumerate(ranks):
            moved = self._moved[rank]
            if steps[rank] != self._counted[rank] or (moved is None and state.bars):
                if moved is not None and self._had_stopped(rank, now - moved, stall_after):
                    self._samples[rank].clear()  # measured anew, as at its start
                self._counted[rank], self._moved[rank], self._before[rank] = steps[rank], now, steps
                if steps[rank]:
                    self._sample(rank, state.stepped_at, steps[rank])
            elif not state.stepping:
                self._before[rank] = None  # (its steps are over: what the others did since is not asked)
        step_times = self.step_times()
        stepping = [state.rank for state in ranks if state.stepping and self._moved[state.rank] is not None]
        reporting = [rank for rank, moved in enumerate(self._moved) if moved is not None]  # the ranks with bars
        stopped = self._stopped(now, stepping, reporting, steps, step_times, stall_after)
        slower = self._slower(now, [rank for rank in stepping if rank not in stopped], len(reporting), step_times)
        return self._name(now, {**slower, **stopped}, ranks)

    def end(self, ranks: Sequence[RankState]) -> None:
        """The job ended: the spells going on end with it."""
        for slow in self.named.values():
            self._keep(slow, ended_by(ranks[slow.rank]) or "the job ended")
        self.named = {}

    def _sample(self, rank: int, stamp: float, steps: float) -> None:
        samples = self._samples[rank]
        samples.append((stamp, steps))
        # the window: its last STEP_WINDOW seconds, and at least MIN_STEPS steps (a loop of long steps is measured too)
        while len(samples) > 2 and samples[1][0] <= stamp - STEP_WINDOW and steps - samples[1][1] >= MIN_STEPS:
            samples.popleft()  # (the first stays: where the window starts)

    def step_times(self) -> dict[int, tuple[float, float]]:
        """{rank: (seconds a step, over how many seconds)} for the ranks measured long enough."""
        measured = {}
        for rank in range(len(self._samples)):
            found = self._step_time(rank)
            if found is not None:
                measured[rank] = found
        return measured

    def _step_time(self, rank: int) -> tuple[float, float] | None:
        samples = self._samples[rank]
        if len(samples) >= 2:
            (first, first_steps), (last, last_steps) = samples[0], samples[-1]
            if last - first >= MEASURED_AFTER and last_steps - first_steps >= MIN_STEPS:
                return (last - first) / (last_steps - first_steps), last - first
        return None

    def _had_stopped(self, rank: int, quiet: float, stall_after: float) -> bool:
        """Whether a rank quiet for ``quiet`` seconds before its last step had stopped, by the rule that
        names a rank stopped; one not measured yet had not (a loop of steps longer than ``stall_after``
        is measured, not restarted at every step)."""
        measured = self._step_time(rank)
        return measured is not None and quiet >= max(stall_after, STOPPED_STEPS * measured[0])

    def _stopped(self, now: float, stepping: list[int], reporting: list[int], steps: array, step_times: dict,
                 stall_after: float) -> dict[int, Slow]:
        """The ranks with steps left whose steps stopped while most of the others' went on."""
        def quiet(rank: int) -> float:
            return now - self._moved[rank]  # type: ignore[operator]

        silent = [rank for rank in stepping if quiet(rank) >= max(
            stall_after, STOPPED_STEPS * step_times[rank][0] if rank in step_times else 0.0)]
        if not silent or 2 * len(silent) > len(reporting):  # most are quiet: a stall, not a straggler
            return {}
        silent_set = set(silent)
        others = [rank for rank in reporting if rank not in silent_set]
        found = {}
        movers_since: dict[int, list[float]] = {}  # by the look a silent rank last moved at: ranks quiet since share it
        for rank in silent:
            before = self._before[rank]
            if id(before) not in movers_since:
                movers_since[id(before)] = sorted(a for a in (steps[other] - before[other]  # type: ignore[index]
                                                              for other in others) if a > 0)
            movers = movers_since[id(before)]
            if 2 * len(movers) >= len(others) and movers[len(movers) // 2] >= MIN_ADVANCE:
                found[rank] = Slow(rank, "stopped", now, now, quiet=quiet(rank), advanced=movers[len(movers) // 2],
                                   movers=len(movers), compared=len(others))
        return found

    def _slower(self, now: float, candidates: list[int], reporting: int, step_times: dict) -> dict[int, Slow]:
        """The ranks with steps left whose step time is well above the median of the other ranks'
        (once at least half of the ``reporting`` others are measured)."""
        if len(step_times) < 2 or 2 * (len(step_times) - 1) < reporting - 1:
            return {}
        order = sorted(step_times, key=lambda rank: step_times[rank][0])
        ordered = [step_times[rank][0] for rank in order]
        position = {rank: i for i, rank in enumerate(order)}
        found = {}
        for rank in candidates:
            if rank not in step_times:
                continue
            step_time, span = step_times[rank]
            others = _median_without(ordered, position[rank])
            named = self.named.get(rank)
            line = STILL_SLOWER if named is not None and named.kind == "slower" else SLOWER
            if others > 0 and step_time >= line * others:
                reference = order[1 - position[rank]] if len(order) == 2 else -1
                found[rank] = Slow(rank, "slower", now, now, step_time=step_time, others=others, span=span,
                                   compared=len(order) - 1, reference=reference)
        return found

    def _name(self, now: float, found: dict[int, Slow], ranks: Sequence[RankState]) -> bool:
        """``found`` named from now: a spell that goes on keeps its start; one that ended is kept for the summary."""
        for rank, slow in found.items():
            before = self.named.get(rank)
            if before is not None and before.kind == slow.kind:
                slow.since = before.since
            elif before is not None:
                self._keep(before, "")
        for rank, before in self.named.items():
            if rank not in found:
                self._keep(before, ended_by(ranks[rank]))
        changed = {(r, s.kind) for r, s in found.items()} != {(r, s.kind) for r, s in self.named.items()}
        self.named = found
        return changed

    def _keep(self, slow: Slow, ended_by: str) -> None:
        """Keep ``slow`` for the summary if it lasted to its rank's end or long enough, and is the
        rank's most telling spell so far."""
        slow.ended_by = ended_by
        kept = self.spells.get(slow.rank)
        if (ended_by or slow.lasted >= NOTABLE) and (kept is None or ended_by or slow.lasted >= kept.lasted):
            self.spells[slow.rank] = slow
