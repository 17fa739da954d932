"""The model and both views, driven by scripted event streams; widgets are checked by value."""

from __future__ import annotations

import dataclasses
import io

import pytest

from mpi_magic.shared.events import (CellEnded, LauncherExited, Output, Phase, Progress, RankFinished, RankStarted, Resources,
                                      Restarted, StreamDecoder, encode)
from mpi_magic.view.model import JobModel
from mpi_magic.view.summary import Summary
from mpi_magic.view.text import TextView
from mpi_magic.view.widgets import GRID_ABOVE, WidgetView

TOKEN = "0123456789abcdef"  # the job's marker token


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Slot:
    """Stands in for IPython's display(obj, display_id=True) and the handle it returns."""

    def __init__(self):
        self.history = []

    def __call__(self, obj, display_id=False):
        self.history.append(obj)
        return self

    def update(self, obj):
        self.history.append(obj)

    @property
    def current(self):
        return self.history[-1]


def wire(model: JobModel, decoder: StreamDecoder, *events_) -> None:
    """Send events as the ranks would: tagged wire lines through the decoder."""
    for event in events_:
        for decoded in decoder.feed(f"[1,{event.rank}]<stdout>: {encode(event, TOKEN)}"):
            model.fold(decoded)


def started(rank, per_instance=2, seq=0):
    return RankStarted(rank=rank, instance=rank // per_instance, local_rank=rank % per_instance, world_size=4,
                       host="h", pid=1000 + rank, seq=seq, time=10.0)


@pytest.fixture
def world():
    clock = Clock()
    model = JobModel("job-1", "local", 4, 2, clock)
    slot = Slot()
    view = WidgetView(model, lambda: "/jobs/job-1/logs", slot)
    return clock, model, view, slot, StreamDecoder(TOKEN)


def test_model_folds_progress_duplicates_gaps_and_a_failure(world):
    clock, model, view, slot, decoder = world
    model.fold(Phase("starting"))
    wire(model, decoder, *[started(r) for r in range(4)])
    assert model.phase == "running" and model.counts()["running"] == 4
    wire(model, decoder, Progress(rank=0, n=10, total=100, desc="epoch", seq=1, time=11.0),
         Progress(rank=0, n=30, total=100, desc="epoch", seq=2, time=12.0))
    wire(model, decoder, Progress(rank=0, n=30, total=100, desc="epoch", seq=2, time=12.0))  # duplicate
    wire(model, decoder, Progress(rank=1, n=50, total=100, seq=5, time=12.0))  # seq 1-4 lost
    wire(model, decoder, Progress(rank=1, n=40, total=100, seq=4, time=11.5))  # late: older than what is shown
    wire(model, decoder, RankFinished(rank=3, ok=False, error_type="ValueError", message="bad", traceback="tb", seq=1, time=13.0))
    r0 = model.ranks[0]
    assert (r0.n, r0.total, r0.bar.desc) == (30, 100, "epoch")
    assert r0.rate == pytest.approx(20.0) and r0.eta == pytest.approx(3.5)
    assert decoder.duplicates == 1 and decoder.gaps == {1: 3}
    assert model.ranks[1].n == 50, "a late event does not undo the newer state"
    assert model.ranks[3].status == "failed" and model.ranks[3].failure.error_type == "ValueError"
    assert model.progress() == pytest.approx((0.3 + 0.5) / 2)
    assert [s.rank for s in model.slowest()] == [0, 1]


def test_a_sessions_cell_end_is_folded_as_the_launchers_exit_it_is(world):
    """CellEnded is a LauncherExited (every rank back, the launcher running on): the ranks still
    active end with it, as they would with the launcher (one it reports on has failed)."""
    clock, model, view, slot, decoder = world
    for rank in range(4):
        model.fold(started(rank))
    model.fold(RankFinished(rank=0, ok=True))
    before = model.version
    model.fold(CellEnded(0, reports={2: "exited with status 3"}))
    assert model.exit is not None and model.version > before
    assert [s.status for s in model.ranks] == ["completed", "stopped", "failed", "stopped"]
    assert model.ranks[2].failure.message == "exited with status 3"


def test_widgets_show_rows_by_instance_with_values_and_styles(world):
    clock, model, view, slot, decoder = world
    wire(model, decoder, *[started(r) for r in range(4)])
    view.update()
    assert view.widget is None and repr(slot.current) == "", "no dashboard for a job younger than a second"
    clock.now += 1.5
    wire(model, decoder, Progress(rank=0, n=25, total=100, seq=1, time=11.0),
         Progress(rank=1, n=7, total=None, seq=1, time=11.0),
         RankFinished(rank=2, ok=True, seq=1, time=12.0),
         RankFinished(rank=3, ok=False, error_type="KeyError", message="'k'", seq=1, time=12.0))
    model.fold(Output(1, "stdout", "loading shard 3"))
    view.update()
    assert slot.current is view.widget
    rows = view.rows
    assert len(rows) == 4
    assert (rows[0].bar.value, rows[0].bar.max, rows[0].bar.bar_style) == (25.0, 100.0, "")
    assert rows[0].numbers.value == "25/100 · - · ETA -"  # one update: no rate yet
    assert (rows[1].bar.bar_style, rows[1].bar.value) == ("info", 1.0) and rows[1].numbers.value == "7 · -"
    assert "mpi-magic-indeterminate" in rows[1].bar._dom_classes, "an unknown total shows activity"
    assert "mpi-magic-indeterminate" not in rows[0].bar._dom_classes
    assert rows[2].bar.bar_style == "success" and rows[2].bar.value == rows[2].bar.max
    assert rows[2].numbers.value == "done · 2.0s"
    assert rows[3].bar.bar_style == "danger" and "KeyError: &#x27;k&#x27;" in rows[3].last_line.value
    assert "title='loading shard 3'" in rows[1].last_line.value
    assert view.total_numbers.value == "62% · 1/4 done · 1 failed"  # mean of 25% and 100%
    titles = [c.value for c in view.widget.children if str(getattr(c, "value", "")).startswith("<b>instance")]
    assert titles == ["<b>instance 0</b>", "<b>instance 1</b>"]
    assert "1/4 ranks done, 1 failed" in view.header.value
    assert view.total_bar.bar_style == "danger"
    assert "mpi_magic dashboard: job job-1" in repr(view.widget)


def test_danger_is_never_overwritten(world):
    clock, model, view, slot, decoder = world
    clock.now += 2
    wire(model, decoder, started(0), RankFinished(rank=0, ok=False, error_type="E", seq=1, time=11.0))
    view.update()
    model.ranks[0].status = "completed"  # even if a later event claimed otherwise
    model.version += 1
    clock.now += 1
    view.update()
    assert view.rows[0].bar.bar_style == "danger"


def test_redraws_are_coalesced(world):
    clock, model, view, slot, decoder = world
    clock.now += 2
    wire(model, decoder, started(0))
    for i in range(1, 1001):
        wire(model, decoder, Progress(rank=0, n=i, total=1000, seq=i, time=10.0 + i / 1000))
        clock.now += 0.001  # 1000 events within one second
        view.update()
    assert 5 <= view.redraws <= 12
    view.close()
    assert view.rows[0].bar.value == 1000.0
    assert isinstance(slot.current, Summary), "the summary takes the dashboard's place"


def test_the_header_keeps_time_while_nothing_happens(world):
    clock, model, view, slot, decoder = world
    wire(model, decoder, started(0))
    clock.now += 2
    view.update()
    first = view.header.value
    clock.now += 0.5
    view.update()
    assert view.header.value == first, "no redraw without news within a second"
    clock.now += 1
    view.update()
    assert view.header.value != first and "running 3.5s" in view.header.value


def test_output_pane_shows_one_rank_or_all_and_names_the_log_file(world):
    clock, model, view, slot, decoder = world
    clock.now += 2
    wire(model, decoder, started(0), started(1))
    view.update()
    assert "(no output yet)" in view.panes[0].value
    model.fold(Output(0, "stdout", "zero says hi"))
    model.fold(Output(1, "stderr", "one <warns>"))
    clock.now += 1
    view.update()
    everything, rank_1 = view.panes[0].value, view.panes[2].value
    assert "[rank 0] zero says hi" in everything and "[rank 1] [stderr] one &lt;warns&gt;" in everything
    assert "zero" not in rank_1 and "one &lt;warns&gt;" in rank_1
    assert "/jobs/job-1/logs/all.log" in everything and "/jobs/job-1/logs/rank-1.log" in rank_1
    assert view.chooser.options[2] == "rank 1" and view.output.selected_index == 0


def test_progress_at_its_total_while_running_reads_done_and_waiting_in_green(world):
    clock, model, view, slot, decoder = world
    clock.now += 2
    wire(model, decoder, started(0), Progress(rank=0, n=12, total=12, seq=1, time=11.0))
    view.update()
    assert view.rows[0].numbers.value == "12/12 · done, waiting for others"
    assert view.rows[0].bar.bar_style == "success"


def wide_world(world_size: int, *per_rank) -> tuple[Clock, JobModel, WidgetView, StreamDecoder]:
    """A job of ``world_size`` ranks, 8 to an instance, every rank started (then ``per_rank(r)``'s
    events), its widget view not drawn yet."""
    clock = Clock()
    model = JobModel("big", "local", world_size, 8, clock)
    view = WidgetView(model, lambda: "", Slot())
    decoder = StreamDecoder(TOKEN)
    clock.now += 2
    for r in range(world_size):
        wire(model, decoder, RankStarted(rank=r, instance=r // 8, local_rank=r % 8, world_size=world_size, seq=0,
                                         time=1.0), *(event(r) for event in per_rank))
    return clock, model, view, decoder


def test_a_1024_rank_world_uses_the_compact_grid():
    import time

    clock, model, view, decoder = wide_world(1024, lambda r: Progress(rank=r, n=r % 100, total=100, seq=1, time=2.0))
    wire(model, decoder, RankFinished(rank=5, ok=False, error_type="E", seq=2, time=3.0))
    start = time.perf_counter()
    view.update()
    assert time.perf_counter() - start < 2.0
    assert model.world_size > GRID_ABOVE and view.compact
    assert not hasattr(view, "rows")
    assert view.grid.value.count(" title='rank ") == 1024
    assert view.grid.value.count("instance ") == 128
    assert "title='rank 5: failed" in view.grid.value
    assert view.grid.value.count("class='mpi-magic-instance'") == 128
    assert view.slowest.value.startswith("<div style='line-height:1.5'><div style='color:var(--jp-error-color1, #c62828)'>rank 5 (instance 0) failed: E")
    assert "<div>slowest: rank 0 0%" in view.slowest.value
    assert len(view.widget.children) < 10


def test_summary_html_lists_every_rank_with_status_time_progress_and_error(world):
    clock, model, view, slot, decoder = world
    wire(model, decoder, *[started(r) for r in range(4)])
    wire(model, decoder, Progress(rank=0, n=5, total=5, seq=1, time=11.0), RankFinished(rank=0, ok=True, seq=2, time=14.0),
         RankFinished(rank=1, ok=False, error_type="ValueError", message="x < 0", seq=1, time=12.0))
    model.fold(Phase("failed"))
    view.close()
    assert view.widget is None, "a job that ended within a second draws no dashboard"
    summary = slot.current
    assert isinstance(summary, Summary) and len(slot.history) == 2  # the empty slot, then the summary
    page = summary._repr_html_().replace(" style='text-align:left'", "")
    assert page.count("<tr class=") == 4
    assert "<td>0</td><td>0</td><td>h</td><td>completed</td><td>4.0s</td><td>5/5</td><td><span" in page
    assert "ValueError: x &lt; 0" in page
    assert page.count("<tr class='mpi-magic-stopped'>") == 2, "only failed rows are marked"
    assert page.count("<tr class='mpi-magic-failed' style='background:var(--jp-rendermime-error-background") == 1
    assert repr(summary).splitlines()[1:] == [
        "  progress: ranks 0:100% 1:- 2:- 3:-", "  rank 1 (instance 0, h) raised ValueError: x < 0", "  rank 2 (instance 1) stopped", "  rank 3 (instance 1) stopped"]


def test_text_view_prints_compact_lines_at_a_sane_rate_and_the_summary():
    clock = Clock()
    model = JobModel("job-2", "local", 2, 1, clock)
    out = io.StringIO()
    view = TextView(model, stream=out, every=2.0)
    decoder = StreamDecoder(TOKEN)
    wire(model, decoder, started(0, 1), started(1, 1))
    view.update()
    assert out.getvalue() == "", "nothing during the first second"
    for step in range(1, 51):
        clock.now += 0.1
        wire(model, decoder, Progress(rank=0, n=step, total=50, seq=step, time=10 + step / 10),
             Progress(rank=1, n=step / 2, total=50, seq=step, time=10 + step / 10))
        view.update()
    lines = out.getvalue().splitlines()
    assert 3 <= len(lines) <= 4
    assert lines[-1].startswith("mpi_magic: job job-2 (local, 2 x 1) running ")
    import re

    each = re.search(r"; ranks 0:(\d+)% 1:(\d+)%$", lines[-1])
    assert each and int(each.group(1)) == 2 * int(each.group(2)), "rank 1 runs at half rank 0's pace"
    assert re.fullmatch(r"mpi_magic: straggler: rank 1: 2\.0x rank 0's step time \(200ms vs 100ms\) over the last "
                        r"\d\.\ds", lines[1]), "which is said once"
    wire(model, decoder, RankFinished(rank=1, ok=False, error_type="OSError", message="disk", seq=99, time=20.0))
    view.update()
    assert out.getvalue().splitlines()[-1] == "mpi_magic: rank 1 (instance 1, h) raised OSError: disk"
    model.fold(Phase("failed"))
    view.close()
    summary = out.getvalue().splitlines()[-5:]
    assert summary[0].startswith("mpi_magic: job job-2 (local, 2 x 1) failed")
    assert summary[1] == "  progress: ranks 0:100% 1:50%", "where each rank's bar ended, kept after the job"
    assert re.fullmatch(r"  straggler: rank 1: 2\.0x rank 0's step time \(200ms vs 100ms\) for \d\.\ds, until it failed",
                        summary[2])
    assert summary[3:] == ["  rank 1 (instance 1, h) raised OSError: disk", "  rank 0 (instance 0) stopped"], \
        "the failures first, then the ranks that did not complete"


def test_when_no_rank_reports_the_views_say_who_waits(world):
    clock, model, view, slot, decoder = world
    wire(model, decoder, *[started(r) for r in range(4)])
    wire(model, decoder, RankFinished(rank=2, ok=True, seq=1, time=11.0))
    clock.now += 10
    view.update()
    assert model.waiting() is None and "waiting" not in view.header.value, "quiet for 10s is not yet a hint"
    clock.now += 30
    assert model.waiting() == "ranks 0, 1, 3 have been waiting 40s; rank 2 finished"
    view.redraw()
    assert "ranks 0, 1, 3 have been waiting 40s" in view.header.value
    text = io.StringIO()
    TextView(model, text).update()
    assert "mpi_magic: ranks 0, 1, 3 have been waiting 40s; rank 2 finished" in text.getvalue()
    wire(model, decoder, Progress(rank=0, n=1, total=2, seq=1, time=50.0))
    assert model.waiting() is None, "progress from any rank ends the hint"


def test_a_roll_call_taken_while_a_job_that_then_completed_was_quiet_reads_as_a_quiet_spell(world):
    from mpi_magic.shared.events import LauncherExited, RollCall

    clock, model, view, slot, decoder = world
    wire(model, decoder, *[started(r) for r in range(4)])
    clock.now += 120
    model.fold(Output(0, "stderr", "testAllgather (test_cco_obj.TestCCOObjSelf) ... ok"))
    clock.now += 45  # quiet for longer than stall_after: the follower takes the roll-call
    where = "ranks 0, 1, 2, 3 at cell line 7 in run"
    model.fold(RollCall(where, stall=True))
    clock.now += 2
    text = io.StringIO()
    TextView(model, text).update()
    assert f"mpi_magic: where the ranks are: {where}" in text.getvalue(), "while quiet, the roll-call says so"
    wire(model, decoder, *[RankFinished(rank=r, ok=True, seq=1, time=170.0) for r in range(4)])
    model.fold(LauncherExited(0))
    model.fold(Phase("completed"))
    summary = Summary(model)
    spell = f"quiet for 45.0s at 2m45s: {where}; then completed"
    assert repr(summary).splitlines()[1] == f"  {spell}"
    assert f"<div class='mpi-magic-roll-call'>{spell}</div>" in summary._repr_html_()
    assert "where the ranks were" not in repr(summary) + summary._repr_html_(), "no diagnosis of a job that succeeded"


def test_a_large_failed_summary_lists_the_failed_ranks_counts_the_others_and_keeps_their_last_lines():
    clock = Clock()
    model = JobModel("big", "local", 80, 8, clock)
    decoder = StreamDecoder(TOKEN)
    for r in range(80):
        wire(model, decoder, RankStarted(rank=r, instance=r // 8, local_rank=r % 8, world_size=80, seq=0, time=1.0))
    for r in range(3):
        wire(model, decoder, RankFinished(rank=r, ok=True, seq=1, time=2.0))
    model.fold(Output(41, "stdout", "about to divide"))
    wire(model, decoder, RankFinished(rank=41, ok=False, error_type="ZeroDivisionError", message="division by zero",
                                      traceback="Traceback ...", seq=1, time=3.0))
    model.fold(Phase("failed"))
    page = Summary(model, "/jobs/big/logs")._repr_html_()
    listed, folded = page.split("<details>")
    assert listed.count("<tr class=") == 1 and "<td style='text-align:left'>41</td>" in listed
    assert "<div>3 completed, 76 stopped</div>" in listed
    assert folded.count("<tr class=") == 80 and "<details open" not in page
    assert "its last lines:</div><pre style='margin:0 0 0 1em'>about to divide</pre>" in page
    assert "its log: <code>/jobs/big/logs/rank-41.log</code>" in page


def test_a_failed_ranks_pane_ends_with_its_traceback(world):
    clock, model, view, slot, decoder = world
    clock.now += 2
    wire(model, decoder, started(1))
    model.fold(Output(1, "stdout", "step 3"))
    view.update()
    wire(model, decoder, RankFinished(rank=1, ok=False, error_type="ValueError", message="bad",
                                      traceback="Traceback (most recent call last):\nValueError: bad\n", seq=1, time=12.0))
    clock.now += 1
    view.update()
    assert "[rank 1] step 3\nTraceback (most recent call last):\nValueError: bad</pre>" in view.panes[2].value


def test_while_a_view_shows_the_output_rank_0s_prints_wait_for_the_end_in_order():
    from mpi_magic.view.console import ConsoleEcho

    out, err = io.StringIO(), io.StringIO()
    echo = ConsoleEcho(out, err)
    echo.hold()
    for event in (Output(0, "stdout", "one"), Output(1, "stdout", "elsewhere"), Output(2, "stderr", "warned"),
                  Output(0, "stdout", "two")):
        echo.show(event)
    assert out.getvalue() == "" and err.getvalue() == "[rank 2] warned\n", "stderr is not held"
    echo.release()
    echo.show(Output(0, "stdout", "three"))
    assert out.getvalue() == "one\ntwo\nthree\n"


def test_billable_time_and_cost_move_on_while_the_instances_run_and_both_views_show_them():
    import html

    from mpi_magic.shared.cost import Cost
    from mpi_magic.shared.events import Billing
    from mpi_magic.view.summary import billing_phrase, duration

    clock = Clock()
    model = JobModel("job-3", "sagemaker", 4, 2, clock)
    out = io.StringIO()
    text, widgets = TextView(model, stream=out, every=0.0), WidgetView(model, lambda: "/jobs/job-3/logs", Slot())
    assert model.billable_seconds() is None and billing_phrase(model) == "", "nothing billed before training"
    hourly = 3.6
    model.fold(Billing(instances=2, instance_seconds=10.0, running=True, hourly_price=hourly))
    clock.now += 5
    assert model.billable_seconds() == 10.0 + 2 * 5
    assert model.cost() == Cost(hourly * (10.0 + 2 * 5) / 3600)
    phrase = f"billable {duration(20.0)} of instance time, about $0.02"
    assert billing_phrase(model) == phrase
    text.update()
    widgets.update()
    assert phrase in out.getvalue().splitlines()[-1] and html.escape(phrase) in widgets.header.value

    model.fold(Billing(instances=2, instance_seconds=31.0, running=False, hourly_price=hourly))  # the final figure
    model.fold(Phase("completed"))
    clock.now += 100
    assert model.billable_seconds() == 31.0 and model.cost() == Cost(hourly * 31.0 / 3600)
    text.close()
    assert billing_phrase(model) in out.getvalue().splitlines()[-1] and billing_phrase(model) in Summary(model)._repr_html_()

    model.fold(Billing(instances=2, instance_seconds=31.0, running=False, hourly_price=hourly, spot=True))
    assert billing_phrase(model).endswith(", at most $0.03")
    model.fold(Billing(instances=2, instance_seconds=31.0, running=False, hourly_price=None))
    assert billing_phrase(model).endswith(", cost unknown")


def test_a_running_jobs_billing_reports_cause_no_redraw_of_their_own():
    """The figure moves on by the clock; a new report only re-anchors it (a quiet job prints no lines)."""
    from mpi_magic.shared.events import Billing

    clock = Clock()
    model = JobModel("job-4", "sagemaker", 2, 1, clock)
    model.fold(Billing(instances=2, instance_seconds=0.0, running=True, hourly_price=1.0))
    version = model.version
    clock.now += 3
    model.fold(Billing(instances=2, instance_seconds=5.0, running=True, hourly_price=1.0))
    assert model.version == version and model.billable_seconds() == 5.0
    clock.now += 1
    assert model.billable_seconds() == 5.0 + 2 * 1
    model.fold(Billing(instances=2, instance_seconds=8.0, running=False, hourly_price=1.0))
    assert model.version == version + 1 and model.billable_seconds() == 8.0


def test_a_job_started_again_resets_every_rank_and_both_views_say_so(world):
    from mpi_magic.shared.events import Restarted

    clock, model, view, slot, decoder = world
    clock.now += 2
    wire(model, decoder, *[started(r) for r in range(4)], Progress(rank=0, n=3, total=10, seq=1, time=11.0),
         RankFinished(rank=1, ok=True, results_digest="ab", seq=1, time=11.0),
         RankFinished(rank=2, ok=False, error_type="KeyboardInterrupt", seq=1, time=11.0))
    model.fold(Output(0, "stdout", "epoch 3"))
    view.update()
    assert view.rows[2].bar.bar_style == "danger" and model.result_digests == {1: "ab"}
    text = io.StringIO()
    text_view = TextView(model, text)
    model.fold(Restarted(2, "spot interruption", "spot interruption: restarting, attempt 2"))
    assert [(s.status, s.bar, s.failure, s.started_at) for s in model.ranks] == [("starting", None, None, None)] * 4
    assert model.result_digests == {} and model.ranks[0].tail[-1] == ("stdout", "epoch 3"), "the output stays"
    clock.now += 2
    view.update()
    text_view.update()
    assert "restarting (attempt 2)" in view.header.value and "⚠ spot interruption</b>" in view.header.value
    assert text.getvalue().startswith("mpi_magic: spot interruption: restarting, attempt 2\n")
    # the new attempt's events count from the start again, through a decoder of its own
    wire(model, StreamDecoder(TOKEN), *[started(r) for r in range(4)],
         *[RankFinished(rank=r, ok=True, seq=1, time=20.0) for r in range(4)])
    clock.now += 2
    view.update()
    assert [row.bar.bar_style for row in view.rows] == ["success"] * 4, "red was the attempt that ended"
    assert model.counts()["completed"] == 4 and view.total_bar.bar_style == "success"
    assert "running (attempt 2)" in view.header.value
    model.fold(Phase("completed"))
    assert "spot interruption: started again as attempt 2" in Summary(model)._repr_html_(), "said as past"


def test_a_starting_phase_read_after_the_ranks_started_is_news_no_more(world):
    """SageMaker's status is read every 5-30 s: "Downloading" can arrive while the ranks run."""
    clock, model, view, slot, decoder = world
    model.fold(Phase("Downloading", "SageMaker: Downloading"))
    assert model.phase == "Downloading", "before the ranks, it is the news"
    wire(model, decoder, started(0))
    model.fold(Phase("Downloading", "SageMaker: Downloading"))
    assert model.phase == "running"
    model.fold(Phase("Uploading", "SageMaker: Uploading"))
    assert model.phase == "Uploading", "what comes after the ranks is news"


def test_metric_charts_appear_once_a_metric_arrives_redraw_a_few_times_a_second_and_stay_in_the_summary(world):
    from mpi_magic.shared.events import LauncherExited, Metrics

    clock, model, view, slot, decoder = world
    wire(model, decoder, *[started(r) for r in range(4)])
    clock.now += 1.5
    view.update()
    charts = view.plots.html
    assert (charts.layout.display, charts.value) == ("none", ""), "no charts before a metric"
    seq = {r: 1 for r in range(4)}
    for i in range(400):  # 400 reports within two seconds
        rank = i % 4
        wire(model, decoder, Metrics(rank=rank, points={"loss": [[i // 4, 1 / (i + 1) + rank]]}, seq=seq[rank],
                                     time=11.0))
        seq[rank] += 1
        clock.now += 0.005
        view.update()
    assert charts.layout.display == "" and charts.value.count("<polyline") == 4
    assert 3 <= view.plots.draws <= 6, "the charts are redrawn a few times a second, not for every report"
    assert clock.now - model.last_activity < 0.01, "a rank that logs is not stalled"
    wire(model, decoder, *[RankFinished(rank=r, ok=True, seq=seq[r], time=12.0) for r in range(4)])
    model.fold(LauncherExited(0))
    view.close()
    assert "rank 3: 3.0025 at step 99" in charts.value, "the end is drawn at once"
    summary = slot.current
    assert isinstance(summary, Summary) and summary._repr_html_().count("<polyline") == 4
    assert "  loss: rank 0 0.002519, rank 1 1.003, rank 2 2.003, rank 3 3.002" in repr(summary).splitlines()


def test_a_restarted_job_draws_the_new_attempts_metrics_only(world):
    from mpi_magic.shared.events import Metrics, Restarted

    clock, model, view, slot, decoder = world
    clock.now += 2
    wire(model, decoder, started(0), Metrics(rank=0, points={"loss": [[0, 5.0]]}, seq=1, time=11.0))
    view.update()
    assert "<polyline" in view.plots.html.value
    model.fold(Restarted(2, "spot interruption", "spot interruption: restarting, attempt 2"))
    clock.now += 2
    view.update()
    assert view.plots.html.layout.display == "none" and model.metrics.as_dict() == {}


GIB, MIB = 1 << 30, 1 << 20


def test_the_model_keeps_each_ranks_resources_and_their_peak_without_counting_them_as_activity(world):
    clock, model, view, slot, decoder = world
    wire(model, decoder, *[started(r) for r in range(4)])
    assert [(s.cpu, s.rss, s.gpu_memory, s.gpu_util, s.peak_rss) for s in model.ranks] == [(None,) * 5] * 4
    before = model.version
    wire(model, decoder, Resources(rank=1, cpu=97.0, rss=3 * GIB, seq=1, time=11.0),
         Resources(rank=1, cpu=12.5, rss=GIB, seq=2, time=12.0),
         Resources(rank=2, cpu=100.0, rss=200 * MIB, gpu_memory=5 * GIB, gpu_util=88.0, seq=1, time=11.0))
    assert model.version == before + 3, "each sample redraws the views"
    one, two = model.ranks[1], model.ranks[2]
    assert (one.cpu, one.rss, one.peak_rss, one.gpu_memory, one.gpu_util) == (12.5, GIB, 3 * GIB, None, None)
    assert (two.gpu_memory, two.peak_gpu_memory, two.gpu_util) == (5 * GIB, 5 * GIB, 88.0)
    assert [s.rank for s in model.largest()] == [1, 2] and [s.rank for s in model.largest(measure="gpu_memory")] == [2]
    model.fold(Resources(rank=7, cpu=1.0, rss=1))  # no such rank (the decoder lets only a tag's rank through)
    clock.now += 40
    wire(model, decoder, Resources(rank=0, cpu=100.0, rss=GIB, seq=1, time=50.0))
    assert model.waiting() is not None, "ranks that only report what they use are still waiting (a stall)"
    wire(model, decoder, RankFinished(rank=1, ok=True, seq=3, time=51.0),
         Resources(rank=1, cpu=0.0, rss=GIB, seq=4, time=51.5))  # sampled as the rank ended
    assert (one.status, one.cpu) == ("completed", 0.0), "a late sample changes the figures, not the status"


def test_a_job_started_again_forgets_what_its_ranks_used(world):
    from mpi_magic.shared.events import Restarted

    clock, model, view, slot, decoder = world
    wire(model, decoder, started(0), Resources(rank=0, cpu=50.0, rss=GIB, seq=1, time=11.0))
    model.fold(Restarted(2, "spot interruption", "restarting"))
    assert (model.ranks[0].rss, model.ranks[0].peak_rss) == (None, None)


def test_each_row_shows_what_its_rank_uses_and_the_aggregate_the_sum(world):
    clock, model, view, slot, decoder = world
    clock.now += 2
    wire(model, decoder, *[started(r) for r in range(4)],
         Resources(rank=0, cpu=97.4, rss=int(1.2 * GIB), seq=1, time=11.0),
         Resources(rank=1, cpu=3.0, rss=300 * MIB, seq=1, time=11.0))
    view.update()
    rows = view.rows
    assert [row.resources.value for row in rows] == ["CPU 97% · 1.2 GiB", "CPU 3% · 300.0 MiB", "", ""]
    assert rows[0].box.children[3] is rows[0].resources and rows[0].box.children[2] is rows[0].numbers
    assert view.total_resources.value == "CPU 100% · 1.5 GiB"
    assert rows[0].resources.layout.flex == "0 0 150px"
    clock.now += 1
    wire(model, decoder, Resources(rank=2, cpu=101.0, rss=2 * GIB, gpu_memory=int(40.5 * GIB), gpu_util=88.0, seq=1,
                                   time=12.0))
    view.update()
    assert rows[2].resources.value == "CPU 101% · 2.0 GiB · GPU 40.5 GiB 88%"
    assert view.total_resources.value == "CPU 201% · 3.5 GiB · GPU 40.5 GiB"
    assert {row.resources.layout.flex for row in rows} == {view.total_resources.layout.flex} == {"0 0 280px"}, \
        "every row makes room for GPU figures once a rank has them"


def test_the_compact_grid_can_colour_the_ranks_by_memory_and_names_the_largest():
    from mpi_magic.view.widgets import MEMORY_SHADES

    clock, model, view, decoder = wide_world(128)
    view.update()
    assert view.grids.selected_index == 0 and view.colour_by.options == ("progress", "memory")
    assert "no rank has reported its memory yet" in view.memory_legend.value and view.memory_grid.value == ""
    for r in range(120):  # 8 ranks have not reported yet
        wire(model, decoder, Resources(rank=r, cpu=99.0, rss=(8 if r == 77 else 6 if r == 5 else 1) * GIB, seq=1,
                                       time=2.0))
    clock.now += 1
    view.update()
    grid = view.memory_grid.value
    assert grid.count(" title='rank ") == 128
    cell = "title='rank 77: running - · CPU 99% · 8.0 GiB' style='background:" + MEMORY_SHADES[3]
    assert cell in grid, "the largest rank in the darkest shade"
    assert "title='rank 5: running - · CPU 99% · 6.0 GiB' style='background:" + MEMORY_SHADES[3] in grid
    assert grid.count("background:" + MEMORY_SHADES[0]) == 118 and grid.count("var(--jp-layout-color3") == 8
    assert "largest rank's 8.0 GiB" in view.memory_legend.value and "not reported yet" in view.memory_legend.value
    assert "title='rank 77: running - · CPU 99% · 8.0 GiB' style='background:var(--jp-info-color1" in view.grid.value, \
        "the progress grid keeps its colours, and its squares say what the rank uses"
    named = view.slowest.value
    assert "<div>most memory: rank 77 8.0 GiB (CPU 99%), rank 5 6.0 GiB (CPU 99%), rank 0 1.0 GiB (CPU 99%)," in named
    assert "GPU" not in named
    wire(model, decoder, Resources(rank=9, cpu=99.0, rss=GIB, gpu_memory=30 * GIB, gpu_util=97.0, seq=2, time=3.0))
    clock.now += 1
    view.update()
    assert "<div>most GPU memory: rank 9 30.0 GiB (97% busy)</div>" in view.slowest.value


def test_the_summary_keeps_each_ranks_peak_memory(world):
    clock, model, view, slot, decoder = world
    wire(model, decoder, *[started(r) for r in range(4)],
         Resources(rank=0, cpu=90.0, rss=3 * GIB, seq=1, time=11.0), Resources(rank=0, cpu=90.0, rss=GIB, seq=2, time=12.0),
         Resources(rank=1, cpu=90.0, rss=512 * MIB, seq=1, time=11.0),
         *[RankFinished(rank=r, ok=True, seq=3, time=13.0) for r in range(4)])
    model.fold(Phase("completed"))
    view.close()
    summary = slot.current
    page = summary._repr_html_().replace(" style='text-align:left'", "")
    assert "<th>progress</th><th>peak memory</th></tr>" in page and "<th>peak GPU memory</th>" not in page
    assert "<td>0</td><td>0</td><td>h</td><td>completed</td><td>3.0s</td><td>-</td><td>3.0 GiB</td></tr>" in page
    assert "<td>2</td><td>1</td><td>h</td><td>completed</td><td>3.0s</td><td>-</td><td>-</td></tr>" in page, \
        "rank 2 never reported"
    assert "peak memory: most rank 0 3.0 GiB, least rank 1 512.0 MiB" in page
    assert repr(summary).splitlines()[1] == "  peak memory: most rank 0 3.0 GiB, least rank 1 512.0 MiB"


def test_the_text_view_names_the_rank_with_the_most_memory():
    clock = Clock()
    model = JobModel("job-3", "local", 2, 1, clock)
    out = io.StringIO()
    view = TextView(model, stream=out)
    decoder = StreamDecoder(TOKEN)
    wire(model, decoder, started(0, 1), started(1, 1), Resources(rank=1, cpu=99.0, rss=2 * GIB, seq=1, time=11.0),
         Resources(rank=0, cpu=99.0, rss=GIB, seq=1, time=11.0))
    clock.now += 2
    view.update()
    assert out.getvalue().splitlines()[-1].endswith("; most memory: rank 1 2.0 GiB")


def test_the_schedulers_word_shows_in_the_headline_while_queued_and_the_time_left_counts_down():
    import time

    from mpi_magic.shared.events import QUEUED, RUNNING, Allocation, LauncherExited
    from mpi_magic.view.summary import headline

    clock = Clock()
    model = JobModel("j", "slurm", 2, 1, clock)
    view = WidgetView(model, lambda: "", Slot())
    model.fold(Phase("starting"))
    in_two_days = time.time() + 2 * 86400
    model.fold(Allocation(QUEUED, "Priority", in_two_days, queue="Slurm"))
    assert model.phase == "queued" and model.waiting(threshold=0) is None  # nobody waits for another rank yet
    assert f"Slurm: Priority, starts about {time.strftime('%Y-%m-%d %H:%M', time.localtime(in_two_days))} (in 47h59m)" \
        in headline(model)  # (a later day's estimate says its date)
    clock.now += 2  # (a dashboard shows from a job's second second)
    view.update()
    assert [row.numbers.value for row in view.rows] == ["queued", "queued"], "not 'starting' while Slurm holds them"
    model.fold(Allocation(RUNNING, "", None, 300.0))
    assert model.phase == "starting" and "time left 5:00" in headline(model)
    clock.now += 1  # (the next redraw)
    view.update()
    assert [row.numbers.value for row in view.rows] == ["starting", "starting"]
    clock.now += 64
    assert "time left 3:55" in headline(model)
    model.fold(RankStarted(0, 0, 0, 2, "n1", 11, time=1.0))
    model.fold(LauncherExited(0))
    assert "time left" not in headline(model), "an ended job has no time left"


def test_a_job_without_a_time_limit_says_so_rather_than_counting_down_slurms_year():
    """squeue's figures for a job on a partition with MaxTime=INFINITE and no --time: a year, counting down."""
    from mpi_magic.backends.slurm.queue import parse
    from mpi_magic.view.summary import headline

    model = JobModel("j", "slurm", 2, 1, Clock())
    (running,) = parse("9|RUNNING|None|2026-12-05T18:40:00|365-00:00:00|364-23:59:52|n[1-2]\n").values()
    model.fold(running.allocation())
    assert "no time limit" in headline(model) and "time left" not in headline(model), headline(model)


def failed(rank, error_type, message, at, seq=1):
    return RankFinished(rank=rank, ok=False, error_type=error_type, message=message, traceback=f"tb of {rank}",
                        seq=seq, time=at)


def test_the_rank_that_failed_first_by_its_own_clock_is_named_though_its_report_came_last(world):
    clock, model, view, slot, decoder = world
    wire(model, decoder, *[started(r) for r in range(4)])  # every rank's clock: 90 s behind the notebook's
    clock.now += 1.0
    for rank in (0, 1, 3):  # their reports arrive first
        clock.now += 0.1
        wire(model, decoder, failed(rank, "RuntimeError", "collateral: peer went away", 10.5 + rank / 10))
    clock.now += 0.5
    wire(model, decoder, failed(2, "ValueError", "root cause on rank 2", 10.2))
    model.fold(LauncherExited(1))
    error = model.error()
    assert (error.rank, error.error_type, error.remote_traceback) == (2, "ValueError", "tb of 2")
    assert str(error) == "rank 2 (instance 1, h) raised ValueError: root cause on rank 2 " \
                         "(then ranks 0, 1, 3 of 4 failed within 0.6 s)"
    assert "then ranks 0, 1, 3 raised RuntimeError: collateral: peer went away" in error._render_traceback_()
    assert [s.rank for s in model.failed_first()] == [2, 0, 1, 3]
    assert repr(Summary(model, "")).splitlines()[-4] == "  rank 2 (instance 1, h) raised ValueError: root cause on rank 2"


def test_a_peers_loss_never_outranks_the_root_cause_even_when_its_clock_says_it_came_first(world):
    clock, model, view, slot, decoder = world
    wire(model, decoder, *[started(r) for r in range(4)])
    clock.now += 0.1
    wire(model, decoder, failed(1, "RuntimeError", "[gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                                                   "[127.0.0.1]:4242", 10.0))
    clock.now += 0.1
    wire(model, decoder, failed(3, "RuntimeError", "NCCL communicator was aborted on rank 3", 10.05))
    clock.now += 0.1
    wire(model, decoder, failed(2, "ValueError", "root cause on rank 2", 10.3))
    model.fold(LauncherExited(1))
    error = model.error()
    assert error.rank == 2
    lines = error._render_traceback_()
    assert "then rank 1 lost a peer: RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer " \
           "[127.0.0.1]:4242" in lines
    assert "then rank 3 lost a peer: RuntimeError: NCCL communicator was aborted on rank 3" in lines


def test_clocks_of_instances_that_differ_are_corrected_by_how_their_events_arrive():
    clock = Clock()
    model = JobModel("job-1", "local", 4, 2, clock)
    decoder = StreamDecoder(TOKEN)
    ahead = {0: 0.0, 1: 30.0}  # instance 1's clock runs 30 s ahead of instance 0's
    for rank in range(4):
        wire(model, decoder, RankStarted(rank=rank, instance=rank // 2, local_rank=rank % 2, world_size=4, host="h",
                                         pid=1000 + rank, seq=0, time=50.0 + ahead[rank // 2]))
    clock.now += 1.0  # rank 2 (instance 1) fails first; instance 0's ranks 0.4 s later, though by their clock 29.6 s earlier
    wire(model, decoder, failed(2, "ValueError", "root cause on rank 2", 81.0))
    clock.now += 0.4
    wire(model, decoder, failed(0, "RuntimeError", "collateral", 51.4), failed(1, "RuntimeError", "collateral", 51.4))
    model.fold(LauncherExited(1))
    error = model.error()
    assert error.rank == 2 and str(error).endswith("(then ranks 0, 1 of 4 failed within 0.4 s)")


def test_instances_started_again_have_their_clocks_measured_anew():
    clock = Clock()
    model = JobModel("job-1", "sagemaker", 4, 2, clock)
    decoder = StreamDecoder(TOKEN)
    wire(model, decoder, *[started(r) for r in range(4)])  # the first attempt's instances: 90 s behind ours
    model.fold(Restarted(2, "spot interruption", "restarting"))
    clock.now += 10.0  # the new instance 0's clock is 105 s behind ours, instance 1's 90 s
    for rank in range(4):
        wire(model, decoder, RankStarted(rank=rank, instance=rank // 2, local_rank=rank % 2, world_size=4, host="h",
                                         pid=2000 + rank, seq=100, time=5.0 if rank < 2 else 20.0))
    clock.now += 1.0  # rank 2 fails first; ranks 0 and 1 0.4 s later
    wire(model, decoder, failed(2, "ValueError", "root cause on rank 2", 21.0, seq=101))
    clock.now += 0.4
    wire(model, decoder, failed(0, "RuntimeError", "collateral", 6.4, seq=101),
         failed(1, "RuntimeError", "collateral", 6.4, seq=101))
    model.fold(LauncherExited(1))
    assert model.error().rank == 2 and str(model.error()).endswith("(then ranks 0, 1 of 4 failed within 0.4 s)")


def test_ranks_read_one_by_one_until_there_are_too_many_then_by_spans():
    from mpi_magic.errors import ranks_phrase

    assert ranks_phrase([3, 1, 0]) == "ranks 0, 1, 3"
    assert ranks_phrase([5]) == "rank 5"
    assert ranks_phrase(list(range(64))) == "ranks 0-63", "a whole job reads as one span"
    assert ranks_phrase([r for r in range(64) if r != 40]) == "ranks 0-39, 41-63"
    assert ranks_phrase(list(range(0, 80, 2))) == "ranks 0, 2, 4, 6, 8, 10, 12, 14, ... (40 in all)"


def test_ranks_that_never_finished_are_named_with_their_host_though_the_launcher_exited_with_0(world):
    """Open MPI 5's mpirun exits with 0 when it loses a host: the cell is not done, and the host is named."""
    clock, model, view, slot, decoder = world
    wire(model, decoder, *[dataclasses.replace(started(r), host=f"algo-{r // 2 + 1}") for r in range(4)])
    clock.now += 1.0
    wire(model, decoder, *[RankFinished(rank=r, ok=True, seq=1, time=11.0) for r in (0, 1)])
    model.fold(LauncherExited(0))
    assert str(model.error()) == ("ranks [2, 3] on algo-2 stopped before the cell finished; the launcher exited "
                                  "with status 0 all the same (as Open MPI's does when it loses a host)")
