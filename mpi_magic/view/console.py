"""Ranks' output in the cell: rank 0's stdout as if the cell ran here, stderr of every rank tagged.

While a view shows the ranks' output itself (the dashboard's pane), rank 0's stdout is held
and written when the job ends, so it is on the page once and the saved cell keeps it."""

from __future__ import annotations

import sys
from typing import TextIO

from ..shared import events


class ConsoleEcho:
    def __init__(self, stdout: TextIO | None = None, stderr: TextIO | None = None, every_rank: bool = False):
        self._stdout = stdout
        self._stderr = stderr
        self._held: list[str] | None = None
        self.every_rank = every_rank  # every rank's stdout too, tagged (a terminal's run of an exported cell)

    def hold(self) -> None:
        """Keep rank 0's stdout until ``release``."""
        if self._held is None:
            self._held = []

    def release(self) -> None:
        """Write what was held, in order, and stop holding."""
        held, self._held = self._held, None
        if held:
            out = self._stdout or sys.stdout
            out.write("".join(held))
            out.flush()

    def show(self, event: events.Event) -> None:
        if not isinstance(event, events.Output):
            return
        if self.every_rank:
            out = (self._stdout or sys.stdout) if event.stream == "stdout" else (self._stderr or sys.stderr)
            out.write(f"[rank {event.rank}] {event.text}\n")
        elif event.stream == "stdout" and event.rank == 0:
            if self._held is not None:
                self._held.append(event.text + "\n")
                return
            out = self._stdout or sys.stdout
            out.write(event.text + "\n")
        elif event.stream == "stderr":
            out = self._stderr or sys.stderr
            out.write(f"[rank {event.rank}] {event.text}\n")
        else:
            return
        out.flush()

    def say(self, text: str) -> None:
        """A message from mpi_magic itself (stopping, values that could not come back)."""
        err = self._stderr or sys.stderr
        err.write(f"mpi_magic: {text}\n")
        err.flush()
