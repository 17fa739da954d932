"""Stragglers: the model names a rank slower than the others, or stopped while they go on, from the
times of the ranks' own steps (scripted on a fake clock), and no rank that is only out of phase;
then two real jobs through the magic, one with a slow rank and one whose ranks are out of phase."""

from __future__ import annotations

import html
import io
import random
import re

from helpers import run

from mpi_magic.shared.events import LauncherExited, Progress, RankFinished, RankStarted
from mpi_magic.view.model import JobModel
from mpi_magic.view.summary import Summary, stragglers_phrase
from mpi_magic.view.text import TextView
from mpi_magic.view.widgets import WidgetView

START = 100.0  # the fake clock's start, ours


class Clock:
    def __init__(self):
        self.now = START

    def __call__(self) -> float:
        return self.now


class Slot:
    """Stands in for IPython's display(obj, display_id=True) and the handle it returns."""

    def __call__(self, obj, display_id=False):
        self.current = obj
        return self

    def update(self, obj):
        self.current = obj


def bar_of(rank: int, ends: list[float], total: int | None = None, opened: float = 0.0, skew: float = 0.0,
           every: float = 0.1, arrives=lambda at: at, bar: int = 0) -> list[tuple[float, Progress]]:
    """[(arrival by our clock, event)] of a rank whose bar opened at ``opened`` and made a step at
    each of ``ends`` (seconds after the start, ours), as a rank sends them: at most one update per
    ``every`` seconds, the last always (``reporting.Reporter``), stamped by a clock ``skew``
    seconds ahead of ours, arriving at ``arrives(when sent)``."""
    sent = [(opened, 0)]
    for n, end in enumerate(ends, 1):
        if end >= sent[-1][0] + every or n == len(ends):
            sent.append((end, n))
    return [(START + arrives(at), Progress(rank=rank, n=n, total=total, time=START + at + skew, closed=n == total,
                                           bar=bar)) for at, n in sent]


def play(model: JobModel, *streams, until: float | None = None) -> dict[float, list[str]]:
    """Fold the streams' events in the order they arrive, asking the model for its stragglers as
    a view would (after each event and every half second); {seconds after the start: the ranks
    named then, in words} each time who is named changed."""
    clock = model.clock
    merged = sorted((item for stream in streams for item in stream), key=lambda item: item[0])
    end = START + until if until is not None else merged[-1][0]
    named: dict[float, list[str]] = {}
    seen: list[str] | None = None

    def look() -> None:
        nonlocal seen
        now = [f"rank {s.rank} {s.kind}" for s in model.stragglers()]
        if now != seen:
            named[round(clock.now - START, 1)] = seen = now

    for arrival, event in merged:
        while clock.now + 0.5 < min(arrival, end):  # quiet spells are looked at too
            clock.now += 0.5
            look()
        if arrival > end:
            break
        clock.now = max(clock.now, arrival)
        model.fold(event)
        look()
    while clock.now < end:
        clock.now = min(end, clock.now + 0.5)
        look()
    return named


def started(model: JobModel, skews: dict[int, float] | None = None) -> None:
    for rank in range(model.world_size):
        instance = rank // model.procs_per_instance
        model.fold(RankStarted(rank=rank, instance=instance, local_rank=rank % model.procs_per_instance,
                               world_size=model.world_size, host=f"h{instance}", pid=1000 + rank,
                               time=START + (skews or {}).get(instance, 0.0)))


def finished(model: JobModel, *ranks: int) -> None:
    for rank in ranks:
        model.fold(RankFinished(rank=rank, ok=True, time=model.clock()))


def every(step: float, count: int, first: float = 0.0) -> list[float]:
    """The ends of ``count`` steps of ``step`` seconds, the first ending ``first + step`` seconds in."""
    return [first + step * (i + 1) for i in range(count)]


def test_a_rank_slower_than_the_others_is_named_live_by_both_views_and_in_the_summary():
    clock = Clock()
    model = JobModel("job-1", "local", 4, 2, clock)
    started(model)
    text = io.StringIO()
    texts = TextView(model, text)
    widgets = WidgetView(model, lambda: "", Slot(), quiet_start=0.0)
    # a sharded loop that meets at its end: ranks 0-2 make 200 steps of 0.1 s, rank 3 takes 0.25 s a step
    streams = [bar_of(rank, every(0.1, 200), total=200) for rank in range(3)] + [
        bar_of(3, every(0.25, 200), total=200)]
    named = play(model, *streams, until=10.0)
    assert list(named.values()) == [[], ["rank 3 slower"]], "rank 3 alone, and for good once named"
    first = [at for at, ranks in named.items() if ranks][0]
    assert 2.0 <= first <= 3.5, "named once it has 2 s of steps after its first"
    texts.update()
    widgets.update()
    live = re.compile(r"rank 3: 2\.5x the others' median step time \(250ms vs 100ms\) over the last (\d+\.\d)s")
    assert live.search(text.getvalue()) and "mpi_magic: straggler: rank 3: 2.5x" in text.getvalue()
    header = html.unescape(widgets.header.value)
    assert float(live.search(header).group(1)) >= 8.0 and "⚠ straggler: rank 3: 2.5x the others'" in header
    texts.update()
    assert text.getvalue().count("straggler:") == 1, "said once while its spell lasts"

    named = play(model, *[[item for item in stream if item[0] > clock.now] for stream in streams])
    assert list(named.values()) == [["rank 3 slower"], []]
    assert 50.0 <= list(named)[1] <= 51.0, "named until it finished its steps"
    finished(model, 0, 1, 2, 3)
    model.fold(LauncherExited(0))
    widgets.close()
    summary = repr(Summary(model))
    spell = re.search(r"\n  straggler: rank 3: 2\.5x the others' median step time \(250ms vs 100ms\) for "
                      r"(\d+\.\d)s, until it finished", summary)
    assert spell and 46.0 <= float(spell.group(1)) <= 48.5, summary
    assert spell.group(0).strip() in html.unescape(Summary(model)._repr_html_())


def test_a_rank_that_caught_up_is_told_in_the_summary_from_when_and_for_how_long():
    clock = Clock()
    model = JobModel("job-1", "local", 3, 3, clock)
    started(model)
    # rank 1 takes 0.2 s a step from its 50th to its 150th step (5 s to 25 s), then 0.1 s again
    slow_spell = every(0.1, 50) + every(0.2, 100, first=5.0) + every(0.1, 150, first=25.0)
    named = play(model, bar_of(0, every(0.1, 400)), bar_of(1, slow_spell), bar_of(2, every(0.1, 400)), until=40.0)
    spells = [(at, ranks) for at, ranks in named.items()]
    assert [ranks for _, ranks in spells] == [[], ["rank 1 slower"], []]
    assert 14.0 <= spells[1][0] <= 17.0, "its step time since it began crosses 1.5x some 10 s into the spell"
    assert 35.0 <= spells[2][0] <= 38.0, "and over its last 20 s falls below 1.3x some 10 s after it"
    summary = repr(Summary(model))
    assert re.search(r"\n  straggler: rank 1: 1\.\dx the others' median step time \(1\d\dms vs 100ms\) for "
                     r"\d+\.\ds, from 1\d\.\ds; then it caught up\n", summary), summary


def epochs_of(rank: int, step: float, epochs: int = 8, batches: int = 30) -> list[tuple[float, Progress]]:
    """A rank's nested bars: one over the epochs (bar 0), and a new one over each epoch's batches."""
    ends = every(step, epochs * batches)
    stream = bar_of(rank, ends[batches - 1::batches], total=epochs)
    for epoch in range(epochs):
        stream += bar_of(rank, ends[epoch * batches:(epoch + 1) * batches], total=batches, bar=1 + epoch,
                         opened=epoch * batches * step)
    return stream


def test_steps_are_counted_over_nested_bars_and_a_bar_for_each_epoch():
    clock = Clock()
    model = JobModel("job-1", "local", 3, 3, clock)
    started(model)
    named = play(model, epochs_of(0, 0.1), epochs_of(1, 0.2), epochs_of(2, 0.1), until=20.0)
    assert list(named.values()) == [[], ["rank 1 slower"]]
    assert stragglers_phrase(model).startswith("rank 1: 2.0x the others' median step time"), "every bar's steps count"
    even = JobModel("job-2", "local", 3, 3, Clock())
    started(even)
    assert not any(play(even, *[epochs_of(rank, 0.1) for rank in range(3)]).values())


def test_ranks_only_out_of_phase_are_never_named():
    """Clocks that differ, a late start, bars moved at another point of the step, a smaller shard
    that finishes first, steps that jitter and batches that arrive late: the same step time."""
    clock = Clock()
    model = JobModel("job-1", "sagemaker", 4, 2, clock)
    skew = {0: 0.0, 1: 7.3}  # instance 1's clock runs 7.3 s ahead of ours
    started(model, skew)
    jitter = random.Random(7)

    def steps(count: int, first: float = 0.0) -> list[float]:  # 0.05 s a step on average, each 0.03-0.07 s
        ends, at = [], first
        for _ in range(count):
            at += jitter.uniform(0.03, 0.07)
            ends.append(at)
        return ends

    batches = lambda at: (int(at / 2) + 1) * 2 + 0.5  # noqa: E731 - instance 1's events come every 2 s, late
    streams = [bar_of(0, steps(600), total=600),
               bar_of(1, steps(600, first=3.0), total=600, opened=3.0),  # started 3 s (60 steps) behind
               bar_of(2, [end + 0.025 for end in steps(480)], total=480, skew=7.3, arrives=batches),  # mid-step; smaller shard
               bar_of(3, steps(600), total=600, skew=7.3, arrives=batches)]
    named = play(model, *streams)
    assert not any(named.values()), named
    finished(model, 0, 1, 2, 3)
    model.fold(LauncherExited(0))
    assert "straggler" not in repr(Summary(model))


def test_a_collective_at_every_step_hides_which_rank_the_others_wait_for_so_none_is_named():
    """Each rank moves its bar before the step's allreduce: rank 3's update comes 0.15 s after the
    others' every step, as it would if rank 3 moved its bar after the allreduce and the others
    before it, without being slower. From these times the two cannot be told apart."""
    clock = Clock()
    model = JobModel("job-1", "local", 4, 2, clock)
    started(model)
    step = 0.25  # rank 3 computes 0.25 s, the others 0.1 s, then all meet
    streams = [bar_of(rank, [k * step + (0.24 if rank == 3 else 0.09) for k in range(160)], total=160)
               for rank in range(4)]
    assert not any(play(model, *streams).values())


def test_a_rank_whose_steps_stopped_while_the_others_went_on_is_named_then_told_until_it_went_on():
    clock = Clock()
    model = JobModel("job-1", "local", 4, 2, clock)
    started(model)
    text = io.StringIO()
    texts = TextView(model, text)
    # rank 2 makes no step from 10 s to 50 s (its 100th to 101st); the others go on at 0.1 s a step
    stalled = every(0.1, 100) + every(0.1, 400, first=50.0)
    streams = [bar_of(rank, every(0.1, 800), total=800) for rank in (0, 1, 3)] + [bar_of(2, stalled, total=500)]
    named = play(model, *streams, until=45.0)
    texts.update()
    assert list(named.values()) == [[], ["rank 2 stopped"]]
    at = list(named)[1]
    assert 40.0 <= at <= 41.5, "named once quiet for stall_after (30 s)"
    said = re.search(r"straggler: rank 2: no progress for (\d+\.\d)s while the others advanced (\d+) steps", text.getvalue())
    assert said and 34.0 <= float(said.group(1)) <= 35.5 and 340 <= int(said.group(2)) <= 350, text.getvalue()
    named = play(model, *[[item for item in stream if item[0] > clock.now] for stream in streams])
    assert list(named.values()) == [["rank 2 stopped"], []]
    assert 50.0 <= list(named)[1] <= 50.6, "no longer named once it steps again"
    finished(model, 0, 1, 2, 3)
    model.fold(LauncherExited(0))
    told = re.search(r"\n  straggler: rank 2: no progress for (\d+\.\d)s while the others advanced (\d+) steps, "
                     r"from 1\d\.\ds; then it went on$", repr(Summary(model)), re.MULTILINE)
    assert told and 39.0 <= float(told.group(1)) <= 40.5 and 390 <= int(told.group(2)) <= 405, repr(Summary(model))


def test_a_rank_stopped_until_the_job_was_stopped_is_told_so():
    clock = Clock()
    model = JobModel("job-1", "local", 2, 2, clock)
    started(model)
    model.stall_after = 5.0
    named = play(model, bar_of(0, every(0.1, 200)), bar_of(1, every(0.1, 30)), until=20.0)
    assert list(named.values()) == [[], ["rank 1 stopped"]]
    model.fold(LauncherExited(-2))
    assert re.search(r"\n  straggler: rank 1: no progress for 1\d\.\ds while the other rank advanced 1\d\d steps, "
                     r"until it stopped", repr(Summary(model))), repr(Summary(model))


def test_no_rank_is_named_at_start_up_alone_in_its_job_without_a_bar_or_when_every_rank_is_quiet():
    clock = Clock()
    model = JobModel("job-1", "local", 4, 2, clock)
    started(model)
    # rank 3's first step takes 4 s (it compiles), then it steps as the others do
    streams = [bar_of(rank, every(0.1, 150)) for rank in range(3)] + [bar_of(3, [4.0] + every(0.1, 150, first=4.0))]
    assert not any(play(model, *streams, until=30.0).values())
    assert not any(play(model, until=100.0).values()), "every rank quiet for 70 s or more: a stall, which waiting() tells"
    assert model.waiting().startswith("ranks 0, 1, 2, 3 have been waiting")

    alone = JobModel("job-2", "local", 1, 1, Clock())
    started(alone)
    assert not any(play(alone, bar_of(0, every(0.5, 20) + every(0.1, 20, first=60.0))).values())

    rank_0_only = JobModel("job-3", "local", 4, 2, Clock())  # tqdm(..., disable=rank != 0)
    started(rank_0_only)
    assert not any(play(rank_0_only, bar_of(0, every(0.1, 400))).values())


def test_a_rank_slower_than_the_others_between_collectives_is_named_in_the_summary_of_a_real_job(ip, capsys):
    run(ip, "-i 2 -g 2 --out job", (
        "from mpi4py import MPI\n"
        "from tqdm import tqdm\n"
        "import time\n"
        "comm = MPI.COMM_WORLD\n"
        "done = 0\n"
        "for step in tqdm(range(80)):\n"
        "    time.sleep(0.12 if comm.rank == 3 else 0.04)   # rank 3 is slower at every step\n"
        "    done += 1\n"
        "total = comm.allreduce(done)   # the others wait here for rank 3\n"
    ))
    err = capsys.readouterr().err
    assert ip.user_ns["total"] == 320
    assert re.search(r"\n  straggler: rank 3: (\d\.\d)x the others' median step time \(\d+ms vs \d+ms\) "
                     r"for \d+\.\ds, until it finished\n", err), err
    assert "straggler: rank 0" not in err and "straggler: rank 1" not in err and "straggler: rank 2" not in err


def test_ranks_out_of_phase_in_a_real_job_are_not_named(ip, capsys):
    run(ip, "-i 2 -g 2 --out job", (
        "from mpi4py import MPI\n"
        "from tqdm import tqdm\n"
        "import time\n"
        "comm = MPI.COMM_WORLD\n"
        "comm.Barrier()   # (however late each rank's process started)\n"
        "time.sleep(0.5 * comm.rank)   # each rank starts its loop later than the one before\n"
        "bar = tqdm(total=100 - 20 * (comm.rank % 2))   # odd ranks have 20 steps fewer\n"
        "for step in range(bar.total):\n"
        "    if comm.rank % 2:\n"
        "        bar.update()   # odd ranks move their bar before the step's work, even ranks after\n"
        "    time.sleep(0.04)\n"
        "    if not comm.rank % 2:\n"
        "        bar.update()\n"
        "bar.close()\n"
        "total = comm.allreduce(bar.n)\n"
        "del bar\n"
    ))
    err = capsys.readouterr().err
    assert ip.user_ns["total"] == 360
    job = ip.user_ns["job"]
    opened = [state.bars[0].first[0] for state in job.ranks]
    assert opened[3] - opened[0] > 1.0, "out of phase: rank 3 started its steps about 1.5 s after rank 0"
    assert sorted(job.model.pace.step_times()) == [0, 1, 2, 3], "and every rank's step time was measured"
    assert "straggler" not in err, err


def test_steps_longer_than_the_stall_spell_are_measured_and_a_slower_rank_named():
    """A loop of 40 s steps (an epoch's bar, say) with stall_after 30 s: each step is a wait longer
    than the stall spell, not a stop; rank 3, at 100 s a step, is named."""
    clock = Clock()
    model = JobModel("job-1", "local", 4, 2, clock)
    model.stall_after = 30.0
    started(model)
    streams = [bar_of(rank, every(40.0, 12), total=12) for rank in range(3)] + [bar_of(3, every(100.0, 12), total=12)]
    named = play(model, *streams, until=480.0)
    assert list(named.values()) == [[], ["rank 3 slower"]]
