"""Progress as compact lines, for terminals, headless runs and kernels without ipywidgets."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Callable, TextIO

from .model import JobModel
from .summary import Summary, headline, largest_phrase, percent, rate, shares, stragglers_phrase

if TYPE_CHECKING:
    from . import View

QUIET_START = 1.0  # a job done sooner prints only its summary
EVERY = 2.0  # seconds between progress lines
WAITING_EVERY = 30.0  # seconds between lines saying which ranks wait, while none reports


class TextView:
    shows_output = False

    def __init__(self, model: JobModel, stream: TextIO | None = None,
                 show: Callable[[object], None] | None = None, every: float = EVERY):
        self.model = model
        self._stream = stream
        self._show = show
        self._every = every
        self._last_at: float | None = None
        self._seen_version = -1
        self._reported_failures: set[int] = set()
        self._waiting_said_at: float | None = None
        self._roll_call_said = ""
        self._stragglers_said: set[tuple[int, str]] = set()
        self._attempt_said = 1
        self.widget = None

    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stderr

    def _report_failures(self) -> None:
        for state in self.model.ranks:
            if state.failure is not None and state.rank not in self._reported_failures:
                self._reported_failures.add(state.rank)
                self._write(state.failure.headline())

    def update(self) -> None:
        model = self.model
        elapsed = model.elapsed()
        if model.attempt != self._attempt_said:  # said at once, as a failure is
            self._attempt_said, self._reported_failures = model.attempt, set()
            self._write(model.restart_reason)
        self._report_failures()
        waiting = model.waiting()
        if waiting and (self._waiting_said_at is None or elapsed - self._waiting_said_at >= WAITING_EVERY):
            self._waiting_said_at = elapsed
            self._write(waiting)
        roll_call = model.stall_roll_call()
        if roll_call and roll_call != self._roll_call_said:  # once per stall, as soon as it is taken
            self._roll_call_said = roll_call
            self._write(f"where the ranks are: {roll_call}")
        self._report_stragglers()
        if elapsed < QUIET_START or model.version == self._seen_version:
            return
        if self._last_at is not None and elapsed - self._last_at < self._every:
            return
        self._last_at, self._seen_version = elapsed, model.version
        line = headline(model)
        slowest = model.slowest(1)
        if shares(model):
            line += "; " + shares(model)
        elif slowest and model.world_size > 1:
            s = slowest[0]
            line += f"; slowest rank {s.rank} {percent(s.fraction)} at {rate(s.rate)}"
        largest = largest_phrase(model)
        if largest:
            line += "; " + largest
        self._write(line)

    def _report_stragglers(self) -> None:
        """Stragglers as they are named (once each spell: their figures move on every look)."""
        named = {(slow.rank, slow.kind) for slow in self.model.stragglers()}
        if named - self._stragglers_said:
            self._write(f"straggler: {stragglers_phrase(self.model)}")
        self._stragglers_said = named

    def _write(self, line: str) -> None:
        self.stream.write(f"mpi_magic: {line}\n")
        self.stream.flush()

    def close(self) -> None:
        self._report_failures()
        summary = Summary(self.model)
        if self._show is not None:
            self._show(summary)
        else:
            self.stream.write(repr(summary) + "\n")
            self.stream.flush()


if TYPE_CHECKING:  # read by the type checker only
    def _is_view(view: TextView) -> View:
        return view
