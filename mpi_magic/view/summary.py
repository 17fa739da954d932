"""The end-of-job summary, as HTML (kept in a saved notebook) and as text, and the shared
wording both views use (durations, rates, one-line status)."""

from __future__ import annotations

import html
import math
import os
import time

from ..shared.events import QUEUED
from ..shared.payload import size_text
from ..shared.slurmtime import clock
from .model import BEFORE_RANKS, JobModel, RankState
from .pace import Slow
from .plot import charts, metric_lines


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


def memory(n: float | None) -> str:
    return "-" if n is None else size_text(n)


def resources(state: RankState) -> str:
    """'CPU 97% · 1.2 GiB', then 'GPU 3.4 GiB 88%' where the rank has a GPU; '' until it reports."""
    parts = []
    if state.cpu is not None:
        parts.append(f"CPU {state.cpu:.0f}%")
    if state.rss is not None:
        parts.append(memory(state.rss))
    if state.gpu_memory is not None or state.gpu_util is not None:
        parts.append(" ".join(["GPU"] + ([memory(state.gpu_memory)] if state.gpu_memory is not None else [])
                              + ([f"{state.gpu_util:.0f}%"] if state.gpu_util is not None else [])))
    return " · ".join(parts)


def total_resources(model: JobModel) -> str:
    """What all ranks use together ('CPU 380% · 4.8 GiB', 'GPU 13.2 GiB' where known); '' until one reports."""
    ranks = model.ranks
    cpu = [s.cpu for s in ranks if s.cpu is not None]
    rss = [s.rss for s in ranks if s.rss is not None]
    gpu = [s.gpu_memory for s in ranks if s.gpu_memory is not None]
    return " · ".join(([f"CPU {sum(cpu):.0f}%"] if cpu else []) + ([memory(sum(rss))] if rss else [])
                      + ([f"GPU {memory(sum(gpu))}"] if gpu else []))


def largest_phrase(model: JobModel) -> str:
    """'most memory: rank 3 1.2 GiB' (resident, now); '' until a rank reports."""
    largest = model.largest(1)
    return f"most memory: rank {largest[0].rank} {memory(largest[0].rss)}" if largest else ""


NAMED_STRAGGLERS = 5  # stragglers named one by one; the others are counted


def step_time(seconds: float) -> str:
    """'40ms', '1.2s', '2m05s'."""
    return f"{1000 * seconds:.0f}ms" if seconds < 1 else duration(seconds)


def _straggler_words(slow: Slow) -> str:
    """'rank 3: 2.5x the others' median step time (100ms vs 40ms)', 'rank 2: no progress for 45.0s
    while the others advanced 120 steps'."""
    if slow.kind == "stopped":
        others = ("the other rank" if slow.compared == 1 else "the others" if slow.movers == slow.compared
                  else f"{slow.movers} of the other {slow.compared} ranks")
        return (f"rank {slow.rank}: no progress for {duration(slow.quiet)} while {others} advanced "
                f"{count(slow.advanced)} steps")
    others = f"rank {slow.reference}'s step time" if slow.compared == 1 else "the others' median step time"
    return f"rank {slow.rank}: {slow.ratio:.1f}x {others} ({step_time(slow.step_time)} vs {step_time(slow.others)})"


def stragglers_phrase(model: JobModel) -> str:
    """The stragglers named now ("rank 3: 2.5x the others' median step time (100ms vs 40ms) over
    the last 20.0s"; ``pace.py``), '' when none is."""
    named = model.stragglers()
    words = [_straggler_words(slow) + (f" over the last {duration(slow.span)}" if slow.kind == "slower" else "")
             for slow in named[:NAMED_STRAGGLERS]]
    if len(named) > NAMED_STRAGGLERS:
        words.append(f"and {len(named) - NAMED_STRAGGLERS} more")
    return "; ".join(words)


def spell_phrase(slow: Slow, model: JobModel) -> str:
    """A straggler's spell once the job has ended: 'rank 3: 2.5x the others' median step time
    (100ms vs 40ms) for 12.0s, until it finished', or where it caught up '..., from 1m02s; then it
    caught up'."""
    words = _straggler_words(slow) + ("" if slow.kind == "stopped" else f" for {duration(slow.lasted)}")
    if slow.ended_by:
        return f"{words}, until {slow.ended_by}"
    went_on = "then it went on" if slow.kind == "stopped" else "then it caught up"
    return f"{words}, from {duration(slow.began - model.started_at)}; {went_on}"


def peaks_phrase(model: JobModel) -> str:
    """'peak memory: most rank 3 1.2 GiB, least rank 0 310.5 MiB' (the largest resident memory
    sampled on each rank; GPU memory too where ranks held some); '' where no rank reported."""
    parts = []
    for name, attribute in (("peak memory", "peak_rss"), ("peak GPU memory", "peak_gpu_memory")):
        known = sorted((getattr(s, attribute), s.rank) for s in model.ranks if getattr(s, attribute) is not None)
        if not known or (attribute == "peak_gpu_memory" and not known[-1][0]):
            continue
        (low, low_rank), (high, high_rank) = known[0], known[-1]
        if len(known) == 1:
            parts.append(f"{name}: rank {high_rank} {memory(high)}")
        else:
            parts.append(f"{name}: most rank {high_rank} {memory(high)}, least rank {low_rank} {memory(low)}")
    return "; ".join(parts)


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
    billing = billing_phrase(model)
    if billing:
        parts.append(billing)
    allocation = allocation_phrase(model)
    if allocation:
        parts.append(allocation)
    phase = model.phase if model.attempt == 1 else f"{model.phase} (attempt {model.attempt})"
    return f"job {model.name} ({model.backend}, {model.num_instances} x {model.procs_per_instance}) " \
           f"{phase} {duration(model.elapsed())}: " + ", ".join(parts)


def roll_call_phrase(model: JobModel) -> str:
    """The latest roll-call once the job has ended: where the ranks were, if it did not complete;
    if it did, a moment on its way, not a diagnosis ("quiet for 45.0s at 2m45s: ranks 0, 1 at cell
    line 7 in run; then completed")."""
    if model.status != "completed":
        return f"where the ranks were: {model.roll_call}"
    quiet = model.roll_call_quiet
    when = f"quiet for {duration(quiet)} at" if quiet is not None else "asked at"
    return f"{when} {duration(model.roll_call_at - model.started_at)}: {model.roll_call}; then completed"


EACH_RANK_UP_TO = 16  # smaller worlds list every rank's progress


def shares(model: JobModel) -> str:
    """'ranks 0:100% 1:57%' for a world of up to 16 ranks where some rank's tqdm reported; else ''."""
    if model.world_size > EACH_RANK_UP_TO or not any(s.bar for s in model.ranks):
        return ""
    return "ranks " + " ".join(f"{s.rank}:{percent(s.fraction)}" for s in model.ranks)


def allocation_phrase(model: JobModel) -> str:
    """While queued, 'Slurm: Priority, starts about 18:42:10 (in 3m5s)'; while running, 'time left
    59:02' or 'no time limit'; '' for a backend without a scheduler, and once the job has ended."""
    allocation = model.allocation
    if allocation is None or model.exit is not None:
        return ""
    if allocation.state == QUEUED and model.phase in BEFORE_RANKS:
        words = [allocation.reason] if allocation.reason else []
        if allocation.starts:
            wait = allocation.starts - time.time()
            shown = "%H:%M:%S" if wait < 12 * 3600 else "%Y-%m-%d %H:%M"  # (a later day's estimate says its date)
            words.append(f"starts about {time.strftime(shown, time.localtime(allocation.starts))}"
                         + (f" (in {duration(wait)})" if wait > 0 else ""))
        return f"{allocation.queue}: " + (", ".join(words) or "pending")
    if allocation.state == QUEUED:
        return ""  # its ranks started since the scheduler said so
    left = model.time_left()
    if left is None:
        return ""
    return "no time limit" if left == math.inf else f"time left {clock(left)}"


def billing_phrase(model: JobModel) -> str:
    """'billable 1m10s of instance time, about $0.05' ('cost unknown' without a price); '' when
    the backend bills nothing."""
    seconds = model.billable_seconds()
    if seconds is None:
        return ""
    assert model.billing is not None
    if model.billing.training_plan:
        return (f"{duration(seconds)} of instance time on training plan "
                f"{model.billing.training_plan.rpartition('/')[2]}, paid for by the plan")
    cost = model.cost()
    return f"billable {duration(seconds)} of instance time, " + (str(cost) if cost else "cost unknown")


FULL_TABLE_UP_TO = 16  # larger worlds list the failed ranks and count the others; the full table is folded
FAILED_SHOWN = 3  # failed ranks whose last lines and log the summary shows
LAST_LINES = 10
FAILED_ROW = "background:var(--jp-rendermime-error-background, #fdd)"
BAR_COLOUR = {"completed": "var(--jp-success-color1, #388e3c)", "failed": "var(--jp-error-color1, #d32f2f)",
              "stopped": "var(--jp-error-color1, #d32f2f)"}


class Summary:
    """Displayed once when the job ends: HTML in a notebook, text elsewhere. A failed job's
    summary keeps what its dashboard showed: which ranks failed, their last lines, their logs."""

    def __init__(self, model: JobModel, log_dir: str = ""):
        self.model = model
        self.log_dir = log_dir

    def __repr__(self) -> str:
        lines = [f"mpi_magic: {headline(self.model)}"] + [f"  {note}" for note in self.model.notes]
        if shares(self.model):
            lines.append(f"  progress: {shares(self.model)}")
        if self.model.roll_call:
            lines.append(f"  {roll_call_phrase(self.model)}")
        lines += [f"  straggler: {spell_phrase(slow, self.model)}" for slow in self.model.straggler_spells()]
        peaks = peaks_phrase(self.model)
        lines += [f"  {line}" for line in last_metrics(self.model)] + ([f"  {peaks}"] if peaks else [])
        if self.model.phase == "completed":
            return "\n".join(lines)
        lines += [f"  {state.failure.headline()}" for state in self.model.failed_first() if state.failure is not None]
        lines += [f"  rank {state.rank} (instance {state.instance}) {state.status}" for state in self.model.ranks
                  if state.failure is None and state.status != "completed"]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        model = self.model
        peak_words = peaks_phrase(model)
        with_errors = any(state.failure is not None for state in model.ranks)
        peaks = [name for name, attribute in (("peak memory", "peak_rss"), ("peak GPU memory", "peak_gpu_memory"))
                 if any(getattr(state, attribute) is not None for state in model.ranks)]
        columns = ["rank", "instance", "host", "status", "time", "progress"] + peaks + (["error"] if with_errors else [])
        head = "<tr>" + "".join(f"<th style='text-align:left'>{c}</th>" for c in columns) + "</tr>"
        rows = {state.rank: self._row(state, with_errors, peaks) for state in model.ranks}
        if model.world_size <= FULL_TABLE_UP_TO:
            table = (f"<details{' open' if model.phase != 'completed' else ''}><summary>ranks</summary>"
                     f"<table>{head}{''.join(rows.values())}</table></details>")
        else:
            failed = [s.rank for s in model.failed_first()]
            others = {status: n for status, n in model.counts().items() if n and status != "failed"}
            table = (f"<table>{head}{''.join(rows[r] for r in failed)}</table>" if failed else "") + (
                f"<div>{', '.join(f'{n} {status}' for status, n in others.items())}</div>" if failed else "") + (
                f"<details><summary>all {model.world_size} ranks</summary>"
                f"<table>{head}{''.join(rows.values())}</table></details>")
        return (
            f"<div class='mpi-magic-summary mpi-magic-{model.status}'>{self._bar()}"
            f"<b>mpi_magic</b> {html.escape(headline(model))}"
            + "".join(f"<div>{html.escape(note)}</div>" for note in model.notes)
            + (f"<div class='mpi-magic-roll-call'>{html.escape(roll_call_phrase(model))}</div>" if model.roll_call else "")
            + "".join(f"<div class='mpi-magic-straggler'>straggler: {html.escape(spell_phrase(slow, model))}</div>"
                      for slow in model.straggler_spells())
            + charts(model.metrics.by_name())
            + (f"<div class='mpi-magic-peaks'>{html.escape(peak_words)}</div>" if peak_words else "")
            + table + self._failed_html() + "</div>"
        )

    def _bar(self) -> str:
        """The aggregate bar as the dashboard left it: done in green, a failed or stopped job in red."""
        counts = self.model.counts()
        colour = BAR_COLOUR.get(self.model.status, BAR_COLOUR["failed"])
        fraction = self.model.progress()
        width = 100 * (fraction if fraction is not None else counts["completed"] / self.model.world_size)
        return ("<div style='height:6px;margin:2px 0 4px;background:var(--jp-layout-color2, #eee)'>"
                f"<div class='mpi-magic-summary-bar' style='height:100%;width:{width:.1f}%;background:{colour}'>"
                "</div></div>")

    def _row(self, state: RankState, with_errors: bool, peaks: list[str]) -> str:
        values = [str(state.rank), str(state.instance), html.escape(state.host), state.status,
                  duration(state.elapsed), f"{count(state.n)}/{count(state.total)}" if state.bar else "-"]
        if "peak memory" in peaks:
            values.append(memory(state.peak_rss))
        if "peak GPU memory" in peaks:
            values.append(memory(state.peak_gpu_memory))
        if with_errors:
            failure = state.failure
            error = "" if failure is None else f"{failure.error_type}: {failure.message}" if failure.error_type \
                else failure.message
            values.append(f"<span style='white-space:pre-wrap'>{html.escape(error)}</span>")
        shade = f" style='{FAILED_ROW}'" if state.status == "failed" else ""
        return (f"<tr class='mpi-magic-{state.status}'{shade}>"
                + "".join(f"<td style='text-align:left'>{v}</td>" for v in values) + "</tr>")

    def _failed_html(self) -> str:
        """What the failed ranks' panes showed: their last lines and where their logs are."""
        failed = [(s, s.failure) for s in self.model.failed_first() if s.failure is not None]
        parts = []
        for state, failure in failed[:FAILED_SHOWN]:
            lines = [("[stderr] " if stream == "stderr" else "") + text for stream, text in list(state.tail)[-LAST_LINES:]]
            log = os.path.join(self.log_dir, f"rank-{state.rank}.log") if self.log_dir else ""
            parts.append(
                f"<div class='mpi-magic-failed-rank'><div><b>{html.escape(failure.headline())}</b></div>"
                + (f"<div>its last lines:</div><pre style='margin:0 0 0 1em'>{html.escape(chr(10).join(lines))}</pre>"
                   if lines else "<div>it printed nothing</div>")
                + (f"<div>its log: <code>{html.escape(log)}</code></div>" if log else "") + "</div>")
        if len(failed) > FAILED_SHOWN:
            parts.append(f"<div>and {len(failed) - FAILED_SHOWN} more failed ranks (see the table)</div>")
        return "".join(parts)


def last_metrics(model: JobModel) -> list[str]:
    """Each metric's last value per rank, in words ("loss: rank 0 0.12, rank 1 0.15")."""
    store = model.metrics
    return metric_lines({name: store.latest(name) for name in store.names})
