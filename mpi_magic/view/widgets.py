"""The live dashboard in ipywidgets 8: a header, an aggregate bar, one row per rank grouped by
instance (a compact coloured grid above ``GRID_ABOVE`` ranks), and a per-rank output pane.

Redraws are coalesced to at most one per ``REDRAW_EVERY`` seconds and skip what did not
change, so a flood of events never floods the browser. Nothing is drawn for a job that ends
within ``QUIET_START`` seconds; every job ends with the static summary.
"""

from __future__ import annotations

import html
import os
from typing import Callable

import ipywidgets as w

from .model import JobModel, RankState
from .summary import Summary, count, duration, headline, percent, rate

GRID_ABOVE = 64
REDRAW_EVERY = 0.1
HEARTBEAT = 1.0  # the header's elapsed time moves on even when no event arrives
QUIET_START = 1.0
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


class Dashboard(w.VBox):
    """The dashboard widget; its text form is the job's one-line status."""

    def __init__(self, model: JobModel, **kwargs):
        super().__init__(**kwargs)
        self._model = model

    def __repr__(self) -> str:
        return f"mpi_magic dashboard: {headline(self._model)}"


class RankRow:
    def __init__(self, state: RankState):
        self.label = w.Label(f"rank {state.rank}", layout=w.Layout(width="70px"))
        self.bar = w.FloatProgress(value=0.0, min=0.0, max=1.0, bar_style="info", layout=w.Layout(width="35%"))
        self.numbers = w.Label("", layout=w.Layout(width="260px"))
        self.last_line = w.Label("", layout=w.Layout(width="35%"))
        self.box = w.HBox([self.label, self.bar, self.numbers, self.last_line])

    def draw(self, state: RankState) -> None:
        bar = state.bar
        if bar is not None and bar.total:
            self.bar.max = float(bar.total)
            self.bar.value = float(min(bar.n, bar.total))
        elif state.status == "completed":
            self.bar.max, self.bar.value = 1.0, 1.0
        elif bar is None or not bar.total:
            self.bar.max, self.bar.value = 1.0, 1.0 if state.status == "running" else 0.0
        self.bar.bar_style = bar_style(state, self.bar.bar_style)
        numbers = f"{count(state.n)}/{count(state.total)} · {rate(state.rate)} · ETA {duration(state.eta)}" if bar else state.status
        if state.status not in ("running", "starting"):
            numbers = f"{state.status} · {numbers}" if bar else state.status
        self.numbers.value = numbers
        self.last_line.value = state.failure.headline() if state.failure else state.last_line[-200:]


class WidgetView:
    def __init__(self, model: JobModel, log_dir: Callable[[], str], show: Callable[[object], None],
                 quiet_start: float = QUIET_START, redraw_every: float = REDRAW_EVERY):
        self.model = model
        self._log_dir = log_dir
        self._show = show
        self._quiet_start = quiet_start
        self._redraw_every = redraw_every
        self._drawn_version = -1
        self._drawn_at: float | None = None
        self.widget: Dashboard | None = None
        self.redraws = 0

    # -- building -------------------------------------------------------------------------

    def _build(self) -> Dashboard:
        model = self.model
        self.header = w.HTML()
        self.total_bar = w.FloatProgress(value=0.0, min=0.0, max=1.0, description="all ranks", bar_style="info")
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
        self.chooser = w.Dropdown(options=[ALL_RANKS] + [f"rank {r}" for r in range(model.world_size)],
                                  value=ALL_RANKS, description="output")
        self.output = w.HTML()
        self.log_note = w.HTML()
        self.chooser.observe(lambda change: self._draw_output(), names="value")
        return Dashboard(model, children=[self.header, self.total_bar, *body, self.chooser, self.output, self.log_note])

    # -- drawing --------------------------------------------------------------------------

    def update(self) -> None:
        """Redraw if something changed and the last redraw is old enough."""
        model = self.model
        elapsed = model.elapsed()
        if self.widget is None:
            if elapsed < self._quiet_start:
                return
            self.widget = self._build()
            self._show(self.widget)
        since = elapsed - self._drawn_at if self._drawn_at is not None else None
        if since is not None and since < (self._redraw_every if model.version != self._drawn_version else HEARTBEAT):
            return
        self.redraw()

    def redraw(self) -> None:
        model = self.model
        self._drawn_version, self._drawn_at = model.version, model.elapsed()
        self.redraws += 1
        self.header.value = f"<b>mpi_magic</b> {html.escape(headline(model))}"
        progress = model.progress()
        self.total_bar.value = progress or 0.0
        counts = model.counts()
        if counts["failed"] or counts["stopped"]:
            self.total_bar.bar_style = "danger"
        elif self.total_bar.bar_style != "danger":
            self.total_bar.bar_style = "success" if counts["completed"] == model.world_size else (
                "info" if progress is None else "")
        if self.compact:
            self.grid.value = self._grid_html()
            slow = model.slowest()
            self.slowest.value = "slowest: " + ", ".join(
                f"rank {s.rank} {percent(s.fraction)} ({rate(s.rate)})" for s in slow) if slow else ""
        else:
            for row, state in zip(self.rows, model.ranks):
                row.draw(state)
        self._draw_output()

    def _grid_html(self) -> str:
        cells = []
        for index, ranks in enumerate(self.model.by_instance()):
            squares = "".join(
                f"<span title='rank {s.rank}: {s.status} {percent(s.fraction)}' style='display:inline-block;"
                f"width:9px;height:9px;margin:1px;background:{_cell_colour(s)}'></span>" for s in ranks)
            cells.append(f"<div><span style='display:inline-block;width:90px'>instance {index}</span>{squares}</div>")
        return "".join(cells)

    def _draw_output(self) -> None:
        choice = self.chooser.value
        if choice == ALL_RANKS:
            lines = list(self.model.tail)
        else:
            state = self.model.ranks[int(choice.split()[1])]
            lines = [(state.rank, stream, text) for stream, text in state.tail]
        text = "\n".join(f"[rank {r}]{' [stderr]' if stream == 'stderr' else ''} {line}" for r, stream, line in lines)
        self.output.value = f"<pre style='max-height:240px;overflow:auto'>{html.escape(text)}</pre>"
        log_dir = self._log_dir()
        if log_dir:
            name = "all.log" if choice == ALL_RANKS else f"rank-{choice.split()[1]}.log"
            self.log_note.value = f"full log: <code>{html.escape(os.path.join(log_dir, name))}</code>"

    def close(self) -> None:
        if self.widget is not None:
            self.redraw()
        self._show(Summary(self.model))


def _cell_colour(state: RankState) -> str:
    if state.status == "running":
        fraction = state.fraction
        if fraction is None:
            return "#90caf9"
        shade = int(230 - 140 * fraction)
        return f"rgb({shade},{shade},255)"
    return _COLOUR_OF[state.status]
