"""Ranks' output in the cell: rank 0's stdout as if the cell ran here, stderr of every rank tagged."""

from __future__ import annotations

import sys
from typing import TextIO

from .. import events


class ConsoleEcho:
    def __init__(self, stdout: TextIO | None = None, stderr: TextIO | None = None):
        self._stdout = stdout
        self._stderr = stderr

    def show(self, event: events.Event) -> None:
        if not isinstance(event, events.Output):
            return
        if event.stream == "stdout" and event.rank == 0:
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
