"""The end-of-job summary, as HTML (kept in a saved notebook) and as text, and the shared
wording both views use (durations, rates, one-line status)."""

from __future__ import annotations

import html

from .model import JobModel


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}/s" if value < 100 else f"{value:,.0f}/s"


def count(value: float | None) -> str:
    if value is None:
        return "?"
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.0f}%"


def headline(model: JobModel) -> str:
    """'job NAME (local) running 12.3s: 2/4 ranks done, 1 failed, 57%'."""
    counts = model.counts()
    parts = [f"{counts['completed']}/{model.world_size} ranks done"]
    if counts["failed"]:
        parts.append(f"{counts['failed']} failed")
    if counts["stopped"]:
        parts.append(f"{counts['stopped']} stopped")
    progress = model.progress()
    if progress is not None and model.phase not in ("completed",):
        parts.append(percent(progress))
    return f"job {model.name} ({model.backend}, {model.num_instances} x {model.procs_per_instance}) " \
           f"{model.phase} {duration(model.elapsed())}: " + ", ".join(parts)


class Summary:
    """Displayed once when the job ends: HTML in a notebook, text elsewhere."""

    def __init__(self, model: JobModel):
        self.model = model

    def __repr__(self) -> str:
        lines = [f"mpi_magic: {headline(self.model)}"] + [f"  {note}" for note in self.model.notes]
        if self.model.phase == "completed":
            return "\n".join(lines)
        for state in self.model.ranks:
            if state.failure is not None:
                lines.append(f"  {state.failure.headline()}")
            elif state.status != "completed":
                lines.append(f"  rank {state.rank} (instance {state.instance}) {state.status}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        model = self.model
        with_errors = any(state.failure is not None for state in model.ranks)
        columns = ["rank", "instance", "host", "status", "time", "progress"] + (["error"] if with_errors else [])
        cell = "<td style='text-align:left'>{}</td>"
        rows = []
        for state in model.ranks:
            values = [state.rank, state.instance, html.escape(state.host), state.status, duration(state.elapsed),
                      f"{count(state.n)}/{count(state.total)}" if state.bar else "-"]
            if with_errors:
                failure = state.failure
                error = "" if failure is None else f"{failure.error_type}: {failure.message}" if failure.error_type \
                    else failure.message
                values.append(f"<span style='white-space:pre-wrap'>{html.escape(error)}</span>")
            shade = " style='background:#fdecea'" if state.status in ("failed", "stopped") else \
                " style='background:transparent'"
            rows.append(f"<tr class='mpi-magic-{state.status}'{shade}>" + "".join(cell.format(v) for v in values) + "</tr>")
        head = "<tr>" + "".join(f"<th style='text-align:left'>{c}</th>" for c in columns) + "</tr>"
        return (
            f"<div class='mpi-magic-summary'><b>mpi_magic</b> {html.escape(headline(model))}"
            + "".join(f"<div>{html.escape(note)}</div>" for note in model.notes) +
            f"<details{' open' if model.phase != 'completed' else ''}><summary>ranks</summary>"
            f"<table>{head}{''.join(rows)}</table></details></div>"
        )
