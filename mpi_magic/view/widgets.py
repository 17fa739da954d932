"""The live dashboard in ipywidgets 8: a header, an aggregate bar, one row per rank grouped by
instance (a compact coloured grid above ``GRID_ABOVE`` ranks), and a per-rank output pane.

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
from typing import TYPE_CHECKING, Callable

import ipywidgets as w

from .model import JobModel, RankState
from .summary import Summary, count, duration, headline, percent, rate

if TYPE_CHECKING:
    from . import View

GRID_ABOVE = 64
REDRAW_EVERY = 0.1
HEARTBEAT = 1.0  # the header's elapsed time moves on even when no event arrives
QUIET_START = 1.0
PANE_LINES = 200
ALL_RANKS = "all ranks"

_STYLE_OF = {"starting": "info", "running": "", "completed": "success", "failed": "danger", "stopped": "danger"}
_COLOUR_OF = {"starting": "#bbdefb", "completed": "#4caf50", "failed": "#e53935", "stopped": "#e53935"}


def bar_style(state: RankState, current: str) -> str:
    """Running '', unknown total 'info', done 'success', failed or stopped 'danger' (final)."""
    if current == "danger":
        return "danger"
    if state.status == "running" and state.total is None:
        return "info"
    return _STYLE_OF[state.status]


def numbers(state: RankState) -> str:
    """'30/100 · 12.0/s · ETA 5.8s', '30 · 12.0/s', '100/100 · waiting', 'done · 100/100 · 8.1s'."""
    bar = state.bar
    progress = "" if bar is None else count(bar.n) if not bar.total else f"{count(bar.n)}/{count(bar.total)}"
    if state.status == "running":
        if bar is None:
            return "running"
        if bar.total and bar.n >= bar.total:
            return f"{progress} · waiting"
        return " · ".join([progress, rate(state.rate)] + ([f"ETA {duration(state.eta)}"] if bar.total else []))
    label = "done" if state.status == "completed" else state.status
    return " · ".join(part for part in (label, progress, duration(state.elapsed) if state.elapsed else "") if part)


def _ellipsis(text: str, colour: str = "") -> str:
    # width:0 + min-width:100% keeps the div from growing to its text inside the flex row
    style = "overflow:hidden;text-overflow:ellipsis;white-space:nowrap;width:0;min-width:100%" + (
        f";color:{colour}" if colour else "")
    return f"<div style='{style}' title='{html.escape(text, quote=True)}'>{html.escape(text)}</div>"


def _row(label: str) -> tuple[w.HBox, w.FloatProgress, w.Label, w.HTML]:
    bar = w.FloatProgress(value=0.0, min=0.0, max=1.0, bar_style="info", layout=w.Layout(flex="0 0 30%"))
    figures = w.Label("", layout=w.Layout(flex="0 0 220px", margin="0 8px"))
    last = w.HTML("", layout=w.Layout(flex="1 1 0", min_width="0"))
    box = w.HBox([w.Label(label, layout=w.Layout(flex="0 0 70px")), bar, figures, last], layout=w.Layout(width="100%"))
    return box, bar, figures, last


class Dashboard(w.VBox):
    """The dashboard widget; its text form is the job's one-line status."""

    def __init__(self, model: JobModel, **kwargs):
        super().__init__(**kwargs)
        self._model = model

    def __repr__(self) -> str:
        return f"mpi_magic dashboard: {headline(self._model)}"


class RankRow:
    def __init__(self, state: RankState):
        self.box, self.bar, self.numbers, self.last_line = _row(f"rank {state.rank}")

    def draw(self, state: RankState) -> None:
        bar = state.bar
        if bar is not None and bar.total:
            self.bar.max = float(bar.total)
            self.bar.value = float(bar.total if state.status == "completed" else min(bar.n, bar.total))
        else:  # unknown total: an empty bar, the count is in the numbers
            self.bar.max, self.bar.value = 1.0, 1.0 if state.status == "completed" else 0.0
        self.bar.bar_style = bar_style(state, self.bar.bar_style)
        self.numbers.value = numbers(state)
        if state.failure is not None:
            failure = state.failure
            text = f"{failure.error_type}: {failure.message}" if failure.error_type else failure.message
            self.last_line.value = _ellipsis(text, "#c62828")
        else:
            self.last_line.value = _ellipsis(state.last_line[-500:])


class WidgetView:
    def __init__(self, model: JobModel, log_dir: Callable[[], str], display: Callable,
                 quiet_start: float = QUIET_START, redraw_every: float = REDRAW_EVERY):
        self.model = model
        self._log_dir = log_dir
        self._quiet_start = quiet_start
        self._redraw_every = redraw_every
        self._drawn_version = -1
        self._drawn_at: float | None = None
        self._pane_versions: dict[int, int] = {}
        self.widget: Dashboard | None = None
        self.redraws = 0
        # An empty output now, so the dashboard and then the summary appear above printed lines.
        self._slot = display(_Blank(), display_id=True)

    # -- building -------------------------------------------------------------------------

    def _build(self) -> Dashboard:
        model = self.model
        self.header = w.HTML()
        total_box, self.total_bar, self.total_numbers, _ = _row(ALL_RANKS)
        self.compact = model.world_size > GRID_ABOVE
        if self.compact:
            self.grid = w.HTML()
            self.slowest = w.HTML()
            body = [self.grid, self.slowest]
        else:
            self.rows = [RankRow(state) for state in model.ranks]
            body = []
            for index, ranks in enumerate(model.by_instance()):
                body.append(w.HTML(f"<b>instance {index}</b>"))
                body.extend(self.rows[state.rank].box for state in ranks)
        # One pane per choice, switched in the browser: the kernel is busy while the job runs.
        choices = [ALL_RANKS] if self.compact else [ALL_RANKS] + [f"rank {r}" for r in range(model.world_size)]
        self.panes = [w.HTML() for _ in choices]
        self.chooser = w.Dropdown(options=choices, value=ALL_RANKS, layout=w.Layout(width="160px"))
        self.output = w.Stack(self.panes, selected_index=0)
        w.jslink((self.chooser, "index"), (self.output, "selected_index"))
        chooser_row = w.HBox([w.Label("output", layout=w.Layout(flex="0 0 70px")), self.chooser])
        return Dashboard(model, children=[self.header, total_box, *body, chooser_row, self.output])

    # -- drawing --------------------------------------------------------------------------

    def update(self) -> None:
        """Redraw if something changed and the last redraw is old enough."""
        model = self.model
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
        self.redraws += 1
        waiting = model.waiting()
        self.header.value = f"<b>mpi_magic</b> {html.escape(headline(model))}" + (
            f" <span style='color:#b35900'>· {html.escape(waiting)}</span>" if waiting else "")
        self._draw_total()
        if self.compact:
            self.grid.value = self._grid_html()
            slow = model.slowest()
            self.slowest.value = "slowest: " + ", ".join(
                f"rank {s.rank} {percent(s.fraction)} ({rate(s.rate)})" for s in slow) if slow else ""
        else:
            for row, state in zip(self.rows, model.ranks):
                row.draw(state)
        self._draw_panes()

    def _draw_total(self) -> None:
        model = self.model
        progress = model.progress()
        counts = model.counts()
        self.total_bar.value = progress or 0.0
        if counts["failed"] or counts["stopped"]:
            self.total_bar.bar_style = "danger"
        elif self.total_bar.bar_style != "danger":
            done = counts["completed"] == model.world_size
            self.total_bar.bar_style = "success" if done else "info" if progress is None else ""
        parts = [percent(progress)] if progress is not None else []
        parts.append(f"{counts['completed']}/{model.world_size} done")
        if counts["failed"]:
            parts.append(f"{counts['failed']} failed")
        self.total_numbers.value = " · ".join(parts)

    def _grid_html(self) -> str:
        cells = []
        for index, ranks in enumerate(self.model.by_instance()):
            squares = "".join(
                f"<span title='rank {s.rank}: {s.status} {percent(s.fraction)}' style='display:inline-block;"
                f"width:9px;height:9px;margin:1px;background:{_cell_colour(s)}'></span>" for s in ranks)
            cells.append(f"<div><span style='display:inline-block;width:90px'>instance {index}</span>{squares}</div>")
        return "".join(cells)

    def _draw_panes(self) -> None:
        log_dir = self._log_dir()
        for index, pane in enumerate(self.panes):
            state = self.model.ranks[index - 1] if index else None
            version = state.outputs if state else self.model.outputs
            if self._pane_versions.get(index) == version:
                continue  # nothing new for this pane
            self._pane_versions[index] = version
            if state is None:
                lines, name = list(self.model.tail), "all.log"
            else:
                lines, name = [(state.rank, stream, text) for stream, text in state.tail], f"rank-{state.rank}.log"
            pane.value = _pane_html(lines[-PANE_LINES:], os.path.join(log_dir, name) if log_dir else "")

    def close(self) -> None:
        if self.widget is not None:
            self.redraw()
        self._slot.update(Summary(self.model))


def _pane_html(lines: list[tuple[int, str, str]], log_path: str) -> str:
    text = "\n".join(f"[rank {r}]{' [stderr]' if stream == 'stderr' else ''} {line}" for r, stream, line in lines)
    # column-reverse keeps the newest line in view as lines arrive
    body = (f"<div style='display:flex;flex-direction:column-reverse;max-height:240px;overflow:auto'>"
            f"<pre style='margin:0;flex:none'>{html.escape(text)}</pre></div>") if lines else "<i>(no output yet)</i>"
    note = f"<div>full log: <code>{html.escape(log_path)}</code></div>" if log_path else ""
    return body + note


class _Blank:
    """Holds the dashboard's place in the cell's output until there is something to show."""

    def _repr_html_(self) -> str:
        return ""

    def __repr__(self) -> str:
        return ""


def _cell_colour(state: RankState) -> str:
    if state.status == "running":
        fraction = state.fraction
        if fraction is None:
            return "#90caf9"
        shade = int(230 - 140 * fraction)
        return f"rgb({shade},{shade},255)"
    return _COLOUR_OF[state.status]


if TYPE_CHECKING:  # read by the type checker only
    def _is_view(view: WidgetView) -> View:
        return view
