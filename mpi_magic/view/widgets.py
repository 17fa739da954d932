"""The live dashboard in ipywidgets 8: a header, an aggregate bar, one row per rank grouped by
instance (a compact coloured grid above ``GRID_ABOVE`` ranks, coloured by progress or by memory),
each with what the rank uses (CPU, memory, GPU), the metric charts once a rank logs one, and a
per-rank output pane.

The dashboard takes the place of an empty display made when the job starts, and is itself
replaced by the static summary when the job ends, so printed output stays below it and a
saved notebook keeps the summary, not a widget it can no longer draw. Redraws are coalesced
to at most one per ``REDRAW_EVERY`` seconds and skip what did not change. Nothing is drawn
for a job that ends within ``QUIET_START`` seconds. Choosing a rank's output works while
the kernel is busy running the cell: the choice is linked to the panes in the browser.
"""

from __future__ import annotations

import html
import os
import time
from typing import TYPE_CHECKING, Callable

import ipywidgets as w

from ..errors import compact_ranks
from .model import JobModel, RankState
from .plot import charts
from .summary import (Summary, count, duration, headline, memory, percent, rate, resources, stragglers_phrase,
                      total_resources)

if TYPE_CHECKING:
    from . import View

GRID_ABOVE = 64
NAMED_FAILURES = 5  # failed ranks the compact grid describes one by one
NAMED_LARGEST = 5  # ranks holding the most memory, named below the compact grid
REDRAW_EVERY = 0.1
HEARTBEAT = 1.0  # the header's elapsed time moves on even when no event arrives
QUIET_START = 1.0
PLOT_EVERY = 0.5  # seconds between redraws of the metric charts (longer when drawing them takes long)
PANE_LINES = 200
ALL_RANKS = "all ranks"

_STYLE_OF = {"starting": "info", "running": "", "completed": "success", "failed": "danger", "stopped": "danger"}

# Every colour is one of the front end's theme variables (JupyterLab's --jp-*), with a fallback
# for front ends that define none, so the dashboard reads as well in a dark theme as in a light one.
ERROR_TEXT = "var(--jp-error-color1, #c62828)"
SHADES = ("var(--jp-brand-color3, #bbdefb)", "var(--jp-brand-color2, #64b5f6)",
          "var(--jp-brand-color1, #1976d2)", "var(--jp-brand-color0, #0d47a1)")  # running: <25% .. >=75% done
# memory, as a share of the largest rank's: <25% .. >=75%
MEMORY_SHADES = ("var(--jp-warn-color3, #ffe0b2)", "var(--jp-warn-color2, #ffb74d)",
                 "var(--jp-warn-color1, #f57c00)", "var(--jp-warn-color0, #e65100)")
RESOURCES_WIDTH, RESOURCES_WIDTH_GPU = "150px", "280px"  # room for 'CPU 100% · 12.3 GiB' (and 'GPU 70.1 GiB 100%')
COLOUR_OF = {"starting": "var(--jp-layout-color3, #bdbdbd)", "completed": "var(--jp-success-color1, #388e3c)",
             "failed": "var(--jp-error-color1, #d32f2f)", "stopped": "var(--jp-warn-color1, #f57c00)",
             "unknown": "var(--jp-info-color1, #0288d1)"}
# A bar with no total fills its track with moving stripes: it shows activity, not a fraction.
STYLESHEET = """<style>
.mpi-magic-indeterminate .progress-bar {
  width: 100% !important;
  background-image: linear-gradient(45deg, rgba(255,255,255,.35) 25%, transparent 25%, transparent 50%,
                    rgba(255,255,255,.35) 50%, rgba(255,255,255,.35) 75%, transparent 75%, transparent);
  background-size: 24px 24px;
  animation: mpi-magic-stripes 1s linear infinite;
}
@keyframes mpi-magic-stripes { from { background-position: 24px 0; } to { background-position: 0 0; } }
.mpi-magic-grid .mpi-magic-instance { display: flex; align-items: flex-start; margin: 1px 0; }
.mpi-magic-grid .mpi-magic-label { flex: 0 0 90px; }
.mpi-magic-grid .mpi-magic-cells { flex: 1 1 0; display: flex; flex-wrap: wrap; gap: 2px; padding-top: 3px; }
.mpi-magic-cell { display: inline-block; width: 10px; height: 10px; }
.mpi-magic-legend { display: inline-flex; align-items: center; margin-right: 12px; }
.mpi-magic-legend .mpi-magic-cell { margin-right: 4px; }
</style>"""


def bar_style(state: RankState, current: str) -> str:
    """Running '', unknown total 'info', done or done and waiting for the others 'success',
    failed or stopped 'danger' (final)."""
    if current == "danger":
        return "danger"
    if state.status == "running":
        bar = state.bar
        if bar is not None and bar.total is None:
            return "info"
        if bar is not None and bar.total and bar.n >= bar.total:
            return "success"
    return _STYLE_OF[state.status]


def numbers(state: RankState, queued: bool = False) -> str:
    """'30/100 · 12.0/s · ETA 5.8s', '30 · 12.0/s', '12/12 · done, waiting for others', 'done · 100/100 · 8.1s';
    'queued' for a rank of a job the scheduler has not started (``queued``)."""
    bar = state.bar
    progress = "" if bar is None else count(bar.n) if not bar.total else f"{count(bar.n)}/{count(bar.total)}"
    if state.status == "running":
        if bar is None:
            return "running"
        if bar.total and bar.n >= bar.total:
            return f"{progress} · done, waiting for others"
        return " · ".join([progress, rate(state.rate)] + ([f"ETA {duration(state.eta)}"] if bar.total else []))
    label = "done" if state.status == "completed" else "queued" if queued and state.status == "starting" else state.status
    return " · ".join(part for part in (label, progress, duration(state.elapsed) if state.elapsed else "") if part)


def _ellipsis(text: str, colour: str = "") -> str:
    # width:0 + min-width:100% keeps the div from growing to its text inside the flex row
    style = "overflow:hidden;text-overflow:ellipsis;white-space:nowrap;width:0;min-width:100%" + (
        f";color:{colour}" if colour else "")
    return f"<div style='{style}' title='{html.escape(text, quote=True)}'>{html.escape(text)}</div>"


def _indeterminate(bar: w.FloatProgress, on: bool) -> None:
    """Moving stripes on a bar whose total is unknown (see ``STYLESHEET``)."""
    if on:
        bar.add_class("mpi-magic-indeterminate")
    else:
        bar.remove_class("mpi-magic-indeterminate")


def _row(label: str) -> tuple[w.HBox, w.FloatProgress, w.Label, w.Label, w.HTML]:
    """label, bar, figures, resources ('CPU 97% · 1.2 GiB'), last line."""
    bar = w.FloatProgress(value=0.0, min=0.0, max=1.0, bar_style="info", layout=w.Layout(flex="0 0 30%"))
    figures = w.Label("", layout=w.Layout(flex="0 0 220px", margin="0 8px"))
    used = w.Label("", layout=w.Layout(flex=f"0 0 {RESOURCES_WIDTH}", margin="0 8px 0 0"))
    used.add_class("mpi-magic-resources")
    last = w.HTML("", layout=w.Layout(flex="1 1 0", min_width="0"))
    box = w.HBox([w.Label(label, layout=w.Layout(flex="0 0 70px")), bar, figures, used, last],
                 layout=w.Layout(width="100%"))
    box.add_class("mpi-magic-row")
    return box, bar, figures, used, last


class Dashboard(w.VBox):
    """The dashboard widget; its text form is the job's one-line status."""

    def __init__(self, model: JobModel, **kwargs):
        super().__init__(**kwargs)
        self._model = model

    def __repr__(self) -> str:
        return f"mpi_magic dashboard: {headline(self._model)}"


class RankRow:
    def __init__(self, state: RankState):
        self.box, self.bar, self.numbers, self.resources, self.last_line = _row(f"rank {state.rank}")
        self._attempt = state.attempt

    def draw(self, state: RankState, queued: bool = False) -> None:
        bar = state.bar
        if bar is not None and bar.total:
            self.bar.max = float(bar.total)
            self.bar.value = float(bar.total if state.status == "completed" else min(bar.n, bar.total))
        else:  # unknown total: a full, moving bar; the count and rate are in the numbers
            self.bar.max, self.bar.value = 1.0, 1.0 if state.status in ("running", "completed") else 0.0
        # red is final within an attempt; a job started again starts its bars afresh
        self.bar.bar_style = bar_style(state, self.bar.bar_style if state.attempt == self._attempt else "")
        self._attempt = state.attempt
        _indeterminate(self.bar, self.bar.bar_style == "info" and bar is not None)
        self.numbers.value = numbers(state, queued)
        self.resources.value = resources(state)
        if state.failure is not None:
            failure = state.failure
            text = f"{failure.error_type}: {failure.message}" if failure.error_type else failure.message
            self.last_line.value = _ellipsis(text, ERROR_TEXT)
        else:
            self.last_line.value = _ellipsis(state.last_line[-500:])


class WidgetView:
    shows_output = True  # the output pane

    def __init__(self, model: JobModel, log_dir: Callable[[], str], display: Callable,
                 quiet_start: float = QUIET_START, redraw_every: float = REDRAW_EVERY):
        self.model = model
        self._log_dir = log_dir
        self._quiet_start = quiet_start
        self._redraw_every = redraw_every
        self._drawn_version = -1
        self._drawn_attempt = 1
        self._drawn_at: float | None = None
        # by the model's clock: until then ``update`` would not redraw (the job's time passes no
        # faster than that clock, and stops at the job's end)
        self._calm_until = model.started_at + quiet_start
        self._pane_versions: dict[int, object] = {}
        self.widget: Dashboard | None = None
        self.redraws = 0
        # An empty output now, so the dashboard and then the summary appear above printed lines.
        self._slot = display(_Blank(), display_id=True)

    # -- building -------------------------------------------------------------------------

    def _build(self) -> Dashboard:
        model = self.model
        self.header = w.HTML()
        total_box, self.total_bar, self.total_numbers, self.total_resources, _ = _row(ALL_RANKS)
        self._gpu_width = False  # the resource columns widened for GPU figures
        total_box.add_class("mpi-magic-total")
        self.compact = model.world_size > GRID_ABOVE
        if self.compact:
            self.grid = w.HTML()
            self.grid.add_class("mpi-magic-grid")
            # the same grid coloured by memory, chosen in the browser (the kernel is busy while the job runs)
            self.memory_grid = w.HTML()
            self.memory_grid.add_class("mpi-magic-grid")
            self.memory_legend = w.HTML()
            self.colour_by = w.Dropdown(options=["progress", "memory"], value="progress", layout=w.Layout(width="160px"))
            self.grids = w.Stack([w.VBox([w.HTML(_legend()), self.grid]), w.VBox([self.memory_legend, self.memory_grid])],
                                 selected_index=0)
            w.jslink((self.colour_by, "index"), (self.grids, "selected_index"))
            self.slowest = w.HTML()  # the ranks that failed or stopped, by name, the slowest, the largest
            self.slowest.add_class("mpi-magic-named")
            colour_row = w.HBox([w.Label("colour by", layout=w.Layout(flex="0 0 70px")), self.colour_by])
            body = [colour_row, self.grids, self.slowest]
        else:
            self.rows = [RankRow(state) for state in model.ranks]
            body = []
            for index, ranks in enumerate(model.by_instance()):
                body.append(w.HTML(f"<b>instance {index}</b>"))
                body.extend(self.rows[state.rank].box for state in ranks)
        # One pane per choice, switched in the browser: the kernel is busy while the job runs.
        choices = [ALL_RANKS] if self.compact else [ALL_RANKS] + [f"rank {r}" for r in range(model.world_size)]
        self.panes = [w.HTML() for _ in choices]
        for pane in self.panes:
            pane.add_class("mpi-magic-pane")
        self.chooser = w.Dropdown(options=choices, value=ALL_RANKS, layout=w.Layout(width="160px"))
        self.output = w.Stack(self.panes, selected_index=0)
        w.jslink((self.chooser, "index"), (self.output, "selected_index"))
        chooser_row = w.HBox([w.Label("output", layout=w.Layout(flex="0 0 70px")), self.chooser])
        self.plots = MetricCharts()
        dashboard = Dashboard(model, children=[w.HTML(STYLESHEET), self.header, total_box, *body, self.plots.html,
                                               chooser_row, self.output])
        dashboard.add_class("mpi-magic-dashboard")
        return dashboard

    # -- drawing --------------------------------------------------------------------------

    def update(self) -> None:
        """Redraw if something changed and the last redraw is old enough."""
        model = self.model
        if model.clock() < self._calm_until:  # called after every read of events: the usual answer is one clock read
            return
        elapsed = model.elapsed()
        if self.widget is None:
            if elapsed < self._quiet_start:
                return
            self.widget = self._build()
            self._slot.update(self.widget)
        since = elapsed - self._drawn_at if self._drawn_at is not None else None
        if since is not None and since < (self._redraw_every if model.version != self._drawn_version else HEARTBEAT):
            return
        self.redraw()

    def redraw(self) -> None:
        model = self.model
        self._drawn_version, self._drawn_at = model.version, model.elapsed()
        self._calm_until = model.started_at + self._drawn_at + self._redraw_every
        self.redraws += 1
        waiting = model.waiting()
        restarting = model.restart_cause if model.phase == "restarting" else ""  # the headline says "restarting"
        roll_call = model.stall_roll_call() if waiting else ""
        stragglers = stragglers_phrase(model)
        self.header.value = f"<b>mpi_magic</b> {html.escape(headline(model))}" + "".join(
            f" <b>· ⚠ {html.escape(text)}</b>" for text in (restarting, waiting) if text) + (  # the theme's text colour
            f"<div class='mpi-magic-roll-call'>where the ranks are: {html.escape(roll_call)}</div>" if roll_call else "") + (
            f"<div class='mpi-magic-straggler'>⚠ straggler: {html.escape(stragglers)}</div>" if stragglers else "")
        self._draw_total()
        if self.compact:
            titles = [_cell_title(state) for state in model.ranks]  # what hovering over a square says, in both grids
            self.grid.value = self._grid_html(titles)
            self.memory_legend.value, self.memory_grid.value = self._memory_grid_html(titles)
            self.slowest.value = self._named_html()
        else:
            for row, state in zip(self.rows, model.ranks):
                row.draw(state, model.phase == "queued")
            self._widen_for_gpus()
        self.plots.draw(model)
        self._draw_panes()

    def _draw_total(self) -> None:
        model = self.model
        progress = model.progress()
        counts = model.counts()
        active = counts["running"] + counts["starting"]
        if counts["failed"] or counts["stopped"]:
            self.total_bar.bar_style = "danger"
        elif self.total_bar.bar_style != "danger" or self._drawn_attempt != model.attempt:  # red stays in an attempt
            done = counts["completed"] == model.world_size or progress == 1.0
            self.total_bar.bar_style = "success" if done else "info" if progress is None else ""
        moving = self.total_bar.bar_style == "info" and bool(active)  # no rank says how far it is
        self.total_bar.value = 1.0 if moving else progress or 0.0
        _indeterminate(self.total_bar, moving)
        parts = [percent(progress)] if progress is not None else []
        parts.append(f"{counts['completed']}/{model.world_size} done")
        if counts["failed"]:
            parts.append(f"{counts['failed']} failed")
        self.total_numbers.value = " · ".join(parts)
        self.total_resources.value = total_resources(model)
        self._drawn_attempt = model.attempt

    def _widen_for_gpus(self) -> None:
        """Room for the GPU figures in every row, once a rank reports any."""
        if self._gpu_width or not any(s.gpu_memory is not None or s.gpu_util is not None for s in self.model.ranks):
            return
        self._gpu_width = True
        for label in [self.total_resources] + [row.resources for row in self.rows]:
            label.layout.flex = f"0 0 {RESOURCES_WIDTH_GPU}"

    def _grid_html(self, titles: list[str]) -> str:
        return _grid(self.model, _cell_colour, titles)

    def _memory_grid_html(self, titles: list[str]) -> tuple[str, str]:
        """(legend, grid) of the ranks coloured by resident memory, as a share of the largest rank's."""
        largest = max((s.rss for s in self.model.ranks if s.rss is not None), default=None)
        if not largest:
            return "<i>no rank has reported its memory yet (each samples it about once a second)</i>", ""
        return _memory_legend(largest), _grid(self.model, lambda s: _memory_colour(s, largest), titles)

    def _named_html(self) -> str:
        """Failed and stopped ranks by name (a red square alone says nothing to a reader), then the slowest."""
        lines = []
        failed = [s for s in self.model.failed_first() if s.status == "failed"]  # the first failure first
        for state in failed[:NAMED_FAILURES]:
            failure = state.failure
            what = (f"{failure.error_type}: {failure.message}" if failure.error_type else failure.message) \
                if failure else "failed"
            lines.append(f"<div style='color:{ERROR_TEXT}'>rank {state.rank} (instance {state.instance}) failed: "
                         f"{html.escape(what)}</div>")
        if len(failed) > NAMED_FAILURES:
            lines.append(f"<div>failed too: {compact_ranks([s.rank for s in failed[NAMED_FAILURES:]])}</div>")
        stopped = [s.rank for s in self.model.ranks if s.status == "stopped"]
        if stopped:
            lines.append(f"<div>stopped: {'rank' if len(stopped) == 1 else 'ranks'} {compact_ranks(stopped)}</div>")
        slow = self.model.slowest()
        if slow:
            lines.append("<div>slowest: " + ", ".join(
                f"rank {s.rank} {percent(s.fraction)} ({rate(s.rate)})" for s in slow) + "</div>")
        largest = self.model.largest(NAMED_LARGEST)
        if largest:
            lines.append("<div>most memory: " + ", ".join(
                f"rank {s.rank} {memory(s.rss)}" + (f" (CPU {s.cpu:.0f}%)" if s.cpu is not None else "")
                for s in largest) + "</div>")
        largest_gpu = self.model.largest(NAMED_LARGEST, "gpu_memory")
        if largest_gpu:
            lines.append("<div>most GPU memory: " + ", ".join(
                f"rank {s.rank} {memory(s.gpu_memory)}" + (f" ({s.gpu_util:.0f}% busy)" if s.gpu_util is not None else "")
                for s in largest_gpu) + "</div>")
        return f"<div style='line-height:1.5'>{''.join(lines)}</div>"

    def _draw_panes(self) -> None:
        log_dir = self._log_dir()
        for index, pane in enumerate(self.panes):
            state = self.model.ranks[index - 1] if index else None
            version = (state.outputs, state.failure is not None) if state else self.model.outputs
            if self._pane_versions.get(index) == version:
                continue  # nothing new for this pane
            self._pane_versions[index] = version
            if state is None:
                lines, name = list(self.model.tail), "all.log"
            else:
                lines, name = [(state.rank, stream, text) for stream, text in state.tail], f"rank-{state.rank}.log"
            trace = state.failure.traceback if state is not None and state.failure is not None else ""
            pane.value = _pane_html(lines[-PANE_LINES:], os.path.join(log_dir, name) if log_dir else "", trace)

    def close(self) -> None:
        if self.widget is not None:
            self.redraw()
        self._slot.update(Summary(self.model, self._log_dir()))


def _pane_html(lines: list[tuple[int, str, str]], log_path: str, trace: str = "") -> str:
    text = "\n".join(f"[rank {r}]{' [stderr]' if stream == 'stderr' else ''} {line}" for r, stream, line in lines)
    if trace:  # a failed rank's pane ends with its traceback
        text = (text + "\n" if text else "") + trace.rstrip("\n")
    # column-reverse keeps the newest line in view as lines arrive
    body = (f"<div style='display:flex;flex-direction:column-reverse;max-height:240px;overflow:auto'>"
            f"<pre style='margin:0;flex:none'>{html.escape(text)}</pre></div>") if text else "<i>(no output yet)</i>"
    # the widget's own line height (a control's) would leave a wrapped path far apart
    note = f"<div style='line-height:1.5'>full log: <code>{html.escape(log_path)}</code></div>" if log_path else ""
    return body + note


class MetricCharts:
    """The metric charts (``plot.charts``): hidden until a rank reports a metric, redrawn when one
    did, at most every ``PLOT_EVERY`` seconds of the job, or ten times as long as the last drawing
    took (a thousand ranks' series take a while to fold into a band)."""

    def __init__(self, every: float = PLOT_EVERY):
        self.html = w.HTML(layout=w.Layout(display="none"))
        self.html.add_class("mpi-magic-plots")
        self._every = every
        self._drawn: tuple[object, int] | None = None  # (the model's store, its version) drawn last
        self._due_at = 0.0  # by the job's elapsed time
        self.draws = 0

    def draw(self, model: JobModel) -> None:
        store = model.metrics
        if self._drawn == (store, store.version):
            return
        elapsed = model.elapsed()
        ended = model.exit is not None
        if elapsed < self._due_at and not ended:  # the job's end is drawn at once: the summary follows
            return
        began = time.perf_counter()
        self.html.value = charts(store.by_name())
        self.html.layout.display = "" if self.html.value else "none"
        self._drawn, self.draws = (store, store.version), self.draws + 1
        self._due_at = elapsed + max(self._every, 10 * (time.perf_counter() - began))


class _Blank:
    """Holds the dashboard's place in the cell's output until there is something to show."""

    def _repr_html_(self) -> str:
        return ""

    def __repr__(self) -> str:
        return ""


def _cell_colour(state: RankState) -> str:
    """Running ranks in four distinct shades by quarter done; other states in their own colour."""
    if state.status == "running":
        fraction = state.fraction
        if fraction is None:
            return COLOUR_OF["unknown"]
        return SHADES[min(len(SHADES) - 1, int(fraction * len(SHADES)))]
    return COLOUR_OF[state.status]


def _grid(model: JobModel, colour: Callable[[RankState], str], titles: list[str]) -> str:
    """A square per rank in a block per instance, each of ``colour(rank)``, titled ``titles[rank]``
    (words and figures of ours, with nothing to escape)."""
    blocks = []
    for index, ranks in enumerate(model.by_instance()):
        cells = "".join(f"<span class='mpi-magic-cell mpi-magic-{s.status}' title='rank {s.rank}: {titles[s.rank]}' "
                        f"style='background:{colour(s)}'></span>" for s in ranks)
        blocks.append(f"<div class='mpi-magic-instance'><span class='mpi-magic-label'>instance {index}</span>"
                      f"<span class='mpi-magic-cells'>{cells}</span></div>")
    return "".join(blocks)


def _cell_title(state: RankState) -> str:
    """'running 40% · CPU 97% · 1.2 GiB': what hovering over a rank's square says."""
    return " · ".join(part for part in (f"{state.status} {percent(state.fraction)}", resources(state)) if part)


def _memory_colour(state: RankState, largest: int) -> str:
    """Four shades by the rank's share of the largest rank's resident memory; grey before it reports."""
    if state.rss is None:
        return COLOUR_OF["starting"]
    return MEMORY_SHADES[min(len(MEMORY_SHADES) - 1, int(state.rss / largest * len(MEMORY_SHADES)))]


def _memory_legend(largest: int) -> str:
    keys = [(MEMORY_SHADES[i], f"{25 * i}-{25 * (i + 1)}%") for i in range(len(MEMORY_SHADES))] + [
        (COLOUR_OF["starting"], "not reported yet")]
    return (f"<span class='mpi-magic-legend'>memory, as a share of the largest rank's {memory(largest)}:</span>"
            + "".join(f"<span class='mpi-magic-legend'><span class='mpi-magic-cell' style='background:{colour}'></span>"
                      f"{label}</span>" for colour, label in keys))


def _legend() -> str:
    keys = [(SHADES[i], f"{25 * i}-{25 * (i + 1)}%") for i in range(len(SHADES))] + [
        (COLOUR_OF["unknown"], "running, no total"), (COLOUR_OF["starting"], "starting"), (COLOUR_OF["completed"], "done"),
        (COLOUR_OF["failed"], "failed"), (COLOUR_OF["stopped"], "stopped")]
    return "".join(f"<span class='mpi-magic-legend'><span class='mpi-magic-cell' style='background:{colour}'></span>"
                   f"{label}</span>" for colour, label in keys)


if TYPE_CHECKING:  # read by the type checker only
    def _is_view(view: WidgetView) -> View:
        return view
