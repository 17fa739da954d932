"""Metrics from the ranks: mpi_magic.log and tqdm's set_postfix, their rate limit and bounds, the
decoder's checks on what arrives, and the series the notebook keeps."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import run, start_session

import mpi_magic
from mpi_magic.shared import metrics, reporting
from mpi_magic.shared.events import Metrics, Output, StreamDecoder, encode
from mpi_magic.shared.metrics import BATCH_POINTS, MAX_NAMES, MetricLog, MetricStore, Thinned
from mpi_magic.shared.reporting import Reporter
from mpi_magic.shared.wire import Emitter, marker
from mpi_magic.view.model import JobModel
from mpi_magic.view.summary import Summary

TOKEN = "0123456789abcdef"
MARKER = marker(TOKEN)


class Clock:
    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def decoded(lines: list[str], rank: int = 0) -> list[Metrics]:
    decoder = StreamDecoder(TOKEN)
    found = [e for line in lines for e in decoder.feed(f"[1,{rank}]<stdout>: {line}")]
    assert decoder.rejected == 0 and all(isinstance(e, Metrics) for e in found)
    return found  # type: ignore[return-value]


@pytest.fixture
def on_a_rank():
    """A rank's reporter on a fake clock, installed as the runtime installs it; (lines, clock, reporter)."""
    lines: list[str] = []
    clock = Clock()
    reporter = Reporter(Emitter(0, lines.append, TOKEN), clock=clock)
    reporting.install(reporter)
    yield lines, clock, reporter
    reporting.install(None)


# -- the thinning rule ------------------------------------------------------------------------

def test_a_thinned_series_holds_its_capacity_plus_the_latest_however_many_points_come():
    series = Thinned(1000)
    for i in range(1_000_000):
        series.add(i, -i)
        assert len(series) <= 1001
    points = series.points()
    assert points[0] == (0, 0) and points[-1] == (999_999, -999_999), "the first and the latest are kept"
    steps = [s for s, _ in points[:-1]]
    assert len(steps) > 490 and len({b - a for a, b in zip(steps, steps[1:])}) == 1, "evenly spread"
    assert series.stride == 1024 and all(s % series.stride == 0 for s in steps)


def test_a_short_series_keeps_every_point():
    series = Thinned(1000)
    for i in range(10):
        series.add(i, i / 10)
    assert series.points() == [(i, i / 10) for i in range(10)] and series.latest() == (9, 0.9)


# -- on the rank ------------------------------------------------------------------------------

def test_a_tight_loop_of_logs_sends_a_few_events_and_the_last_value_of_every_series(on_a_rank):
    lines, clock, reporter = on_a_rank
    for i in range(200_000):
        clock.now = i * 5e-6  # 200,000 calls in one second
        mpi_magic.log(loss=1 / (i + 1), acc=i)
    reporter.flush()  # the cell ended
    events = decoded(lines)
    assert len(events) <= metrics.BURST + metrics.MAX_RATE + 2
    assert all(len(points) <= BATCH_POINTS for e in events for points in e.points.values())
    assert events[-1].points["loss"][-1] == [199_999, 1 / 200_000] and events[-1].points["acc"][-1] == [199_999, 199_999]
    steps = [step for e in events for step, _ in e.points["loss"]]
    assert steps == sorted(steps) and steps[0] == 0, "default steps count the calls of each name"


def test_an_event_stays_a_short_line_however_many_names_share_it(on_a_rank):
    lines, clock, reporter = on_a_rank
    clock.now = 100.0
    for i in range(metrics.BURST):  # the burst is spent
        mpi_magic.log(a_rather_long_metric_name_00=1.0)
    for i in range(1000):
        mpi_magic.log(**{f"a_rather_long_metric_name_{n:02d}": 1 / (i + 3 + n) for n in range(MAX_NAMES)})
    clock.now = 101.0
    mpi_magic.log(a_rather_long_metric_name_00=2.0)
    event = decoded(lines)[-1]
    assert sum(len(points) for points in event.points.values()) <= metrics.EVENT_POINTS
    assert event.points["a_rather_long_metric_name_31"][-1] == [999, 1 / (999 + 3 + 31)], "the last value goes"
    assert len(lines[-1]) < 12_000


def test_two_calls_in_a_row_after_a_quiet_spell_both_go_out_at_once(on_a_rank):
    lines, clock, reporter = on_a_rank
    clock.now = 100.0
    mpi_magic.log(loss=0.5)
    mpi_magic.log(acc=0.75)
    assert [e.points for e in decoded(lines)] == [{"loss": [[0, 0.5]]}, {"acc": [[0, 0.75]]}]


def test_steps_count_per_name_an_explicit_step_moves_the_count_and_each_cell_counts_from_0(on_a_rank):
    lines, clock, reporter = on_a_rank
    mpi_magic.log(loss=1.0)
    mpi_magic.log(loss=2.0, acc=0.5)
    mpi_magic.log(step=10, loss=3.0)
    mpi_magic.log(loss=4.0, acc=float("nan"))  # not finite: not sent, but its step counts
    mpi_magic.log(acc=0.25)
    reporter.flush()
    mpi_magic.log(loss=5.0)  # the next cell
    reporter.flush()
    store = MetricStore()
    for event in decoded(lines):
        store.fold(0, event.points)
    assert store.as_dict()[0] == {"loss": [(0, 1.0), (1, 2.0), (10, 3.0), (11, 4.0), (0, 5.0)],
                                  "acc": [(0, 0.5), (2, 0.25)]}


def test_log_takes_numbers_only_and_says_so_in_a_sentence():
    class Tensor:
        def __float__(self):
            return 1.0

    for value, kind in [("0.3", "str"), (True, "bool"), (None, "NoneType"), (Tensor(), "Tensor"), ([1.0], "list"),
                        (np.bool_(True), type(np.bool_(True)).__name__), (1 + 2j, "complex")]:
        with pytest.raises(TypeError) as raised:
            mpi_magic.log(loss=value)
        assert str(raised.value) == (f"mpi_magic.log takes int or float values, and loss is a {kind}: pass "
                                     "float(loss) (or loss.item() for a tensor)")
    with pytest.raises(TypeError, match="step is a str"):
        mpi_magic.log(step="3", loss=1.0)
    with pytest.raises(ValueError, match="step must be finite"):
        mpi_magic.log(step=float("inf"), loss=1.0)
    with pytest.raises(ValueError, match=r"^metric names are identifiers of at most 64 characters, not 'val loss'$"):
        mpi_magic.log(**{"val loss": 1.0})
    with pytest.raises(ValueError, match="identifiers"):
        mpi_magic.log(**{"x" * 65: 1.0})
    # numbers of every kind are fine, and outside a job nothing is kept
    mpi_magic.log(step=np.int64(3), a=np.float32(0.5), b=np.int8(2), c=2**80, d=float("nan"), e=10**400)
    assert metrics.current_log() is None


def test_a_rank_logs_at_most_32_names_in_a_cell(on_a_rank):
    lines, clock, reporter = on_a_rank
    mpi_magic.log(**{f"m{i}": i for i in range(MAX_NAMES)})
    with pytest.raises(ValueError, match=r"^a rank logs at most 32 metric names in a cell, and extra would be one more$"):
        mpi_magic.log(extra=1.0)
    mpi_magic.log(m0=1.0)  # the names it has still work
    metrics.log_postfix({"other": 1.0, "m1": 2.0})  # tqdm's extra names are only shown by tqdm
    reporter.flush()
    reporter.flush()  # a new cell: 32 new names may come
    mpi_magic.log(extra=1.0)
    names = [set(e.points) for e in decoded(lines)]
    assert set().union(*names[:-1]) == {f"m{i}" for i in range(MAX_NAMES)} and names[-1] == {"extra"}


def test_set_postfix_values_that_are_numbers_are_logged_the_others_only_shown(on_a_rank):
    lines, clock, reporter = on_a_rank
    metrics.log_postfix({"loss": np.float64(0.25), "acc": "0.875", "lr": "1e-4", "phase": "warmup", "gpu": "3/4",
                         "bad name": 1.0, "tensor": object(), "flag": True, "nan": "nan"})
    assert decoded(lines)[0].points == {"loss": [[0, 0.25]], "acc": [[0, 0.875]], "lr": [[0, 1e-4]]}


def test_metrics_before_a_flush_are_held_not_lost(on_a_rank):
    lines, clock, reporter = on_a_rank
    metric_log = MetricLog(reporter.emitter, max_rate=1, burst=1, clock=clock)
    metric_log.add(None, {"loss": 1.0})  # sent: the bucket was full
    for i in range(5):
        metric_log.add(None, {"loss": 2.0 + i})  # held: no token left within the second
    assert len(lines) == 1
    clock.now = 2.0
    metric_log.add(None, {"loss": 9.0})  # due again: the held ones go with it
    assert [e.points for e in decoded(lines)] == [{"loss": [[0, 1.0]]},
                                                   {"loss": [[1, 2.0], [2, 3.0], [3, 4.0], [4, 5.0], [5, 6.0], [6, 9.0]]}]


# -- in the notebook: what the decoder believes -----------------------------------------------

def test_metrics_round_trip_through_tagged_lines():
    sent = Metrics(rank=2, points={"loss": [[0, 0.5], [1, 0.25]], "lr": [[-3, 1e-5], [2.5, 2]]}, seq=0, time=1.5)
    assert StreamDecoder(TOKEN).feed(f"[1,2]<stdout>: {encode(sent, TOKEN)}") == [sent]


HOSTILE_POINTS = [
    {},  # no name
    {"val loss": [[0, 1.0]]},  # not an identifier
    {"x" * 65: [[0, 1.0]]},
    {"": [[0, 1.0]]},
    {f"m{i}": [[0, 1.0]] for i in range(MAX_NAMES + 1)},  # too many names
    {"loss": []},
    {"loss": [[i, 1.0] for i in range(4 * BATCH_POINTS + 1)]},  # too many points
    {"loss": [[0, "0.5"]]},
    {"loss": [[0, True]]},
    {"loss": [[False, 1.0]]},
    {"loss": [[0, None]]},
    {"loss": [[0, 1.0, 2.0]]},
    {"loss": [[0]]},
    {"loss": [0, 1.0]},
    {"loss": {"0": 1.0}},
    {"loss": [[0, [1.0]]]},
    {"loss": [[0, 10 ** 400]]},
    {"loss": [[1 << 53, 1.0]]},
    {"loss": [[0, {"v": 1}]]},
    [["loss", [[0, 1.0]]]],
    "loss=0.5",
]


@pytest.mark.parametrize("points", HOSTILE_POINTS, ids=range(len(HOSTILE_POINTS)))
def test_hostile_metrics_are_dropped_and_counted(points):
    decoder = StreamDecoder(TOKEN)
    text = MARKER + json.dumps({"v": 2, "k": "metrics", "rank": 1, "seq": 0, "time": 1.0, "points": points})
    assert decoder.feed(f"[1,1]<stdout>: {text}") == [Output(1, "stdout", text)] and decoder.rejected == 1


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_numbers_json_allows_but_a_metric_may_not_be_are_rejected(number):
    decoder = StreamDecoder(TOKEN)
    text = MARKER + '{"v":2,"k":"metrics","rank":0,"seq":0,"time":1.0,"points":{"loss":[[0,%s]]}}' % number
    assert decoder.feed(f"[1,0]<stdout>: {text}")[0].__class__ is Output and decoder.rejected == 1


def test_metrics_of_another_rank_or_a_foreign_token_are_not_believed():
    decoder = StreamDecoder(TOKEN)
    claimed = encode(Metrics(rank=3, points={"loss": [[0, 1.0]]}), TOKEN)
    assert decoder.feed(f"[1,1]<stdout>: {claimed}")[0].__class__ is Output and decoder.rejected == 1
    forged = encode(Metrics(rank=1, points={"loss": [[0, 1.0]]}), "f" * 16)
    assert decoder.feed(f"[1,1]<stdout>: {forged}") == [Output(1, "stdout", forged)]


def test_a_huge_metrics_line_is_rejected():
    decoder = StreamDecoder(TOKEN)
    text = MARKER + '{"v":2,"k":"metrics","rank":0,"seq":0,"time":1.0,"points":{"loss":[' + "[0,1.0]," * 250_000 + "[0,1.0]]}}"
    assert decoder.feed(f"[1,0]<stdout>: {text}")[0].__class__ is Output and decoder.rejected == 1


# -- in the notebook: what the model keeps ----------------------------------------------------

def test_the_model_keeps_bounded_series_per_rank_and_at_most_32_names_a_rank():
    model = JobModel("j", "local", 2, 2)
    for seq in range(200):
        points = {f"m{i}": [[seq * 16 + j, float(j)] for j in range(16)] for i in range(MAX_NAMES)}
        model.fold(Metrics(rank=1, points=points, seq=seq, time=float(seq)))
    model.fold(Metrics(rank=1, points={"one_more": [[0, 1.0]]}, seq=200))
    model.fold(Metrics(rank=7, points={"loss": [[0, 1.0]]}, seq=0))  # no such rank
    series = model.metrics.as_dict()
    assert list(series) == [1] and len(series[1]) == MAX_NAMES and model.metrics.dropped == 1
    assert all(len(points) <= 1001 for points in series[1].values())
    assert series[1]["m0"][-1] == (3199, 15.0) and series[1]["m0"][0] == (0, 0.0)


# -- real ranks -------------------------------------------------------------------------------

def test_tqdm_postfix_and_log_reach_job_metrics_per_rank(ip):
    run(ip, "-i 2 -g 2 --quiet --out job", (
        "import mpi_magic\n"
        "from tqdm import tqdm\n"
        "r = mpi_magic.rank()\n"
        "with tqdm(range(300), desc='train') as bar:\n"
        "    for i in bar:\n"
        "        bar.set_postfix(loss=1.0 / (i + 1) + r, phase='warm')\n"
        "        if i % 100 == 99:\n"
        "            mpi_magic.log(acc=i / 300 + r / 10)\n"
        "print(bar.postfix)\n"
        "del bar  # a tqdm bar does not come back well\n"
    ))
    job = ip.user_ns["job"]
    assert job.status == "completed" and sorted(job.metrics) == [0, 1, 2, 3]
    for rank, series in job.metrics.items():
        assert set(series) == {"loss", "acc"}
        assert series["loss"][0] == (0, 1.0 + rank) and series["loss"][-1] == (299, pytest.approx(1 / 300 + rank))
        assert series["acc"] == [(0, 99 / 300 + rank / 10), (1, 199 / 300 + rank / 10), (2, 299 / 300 + rank / 10)]
        assert [s for s, _ in series["loss"]] == sorted(s for s, _ in series["loss"])
    (postfix,) = job.logs(rank=3).splitlines()
    assert postfix.startswith("loss=3") and postfix.endswith(", phase=warm"), "tqdm shows what it always showed"
    assert "  loss: rank 0 0.003333, rank 1 1.003, rank 2 2.003, rank 3 3.003" in repr(Summary(job.model)).splitlines()


def test_each_session_cell_has_metrics_of_its_own(sessions):
    ip = sessions
    start_session(ip, "-i 1 -g 2")
    run(ip, "--quiet --out first", "import mpi_magic\nfor i in range(5):\n    mpi_magic.log(loss=i + mpi_magic.rank())\n")
    run(ip, "--quiet --out second", "mpi_magic.log(acc=0.5)\n")
    assert ip.user_ns["first"].metrics == {r: {"loss": [(i, float(i + r)) for i in range(5)]} for r in (0, 1)}
    assert ip.user_ns["second"].metrics == {r: {"acc": [(0, 0.5)]} for r in (0, 1)}, "steps count from 0 again"

