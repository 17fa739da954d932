"""What a SageMaker session's rank wrote during a cell: its event lines and the tail of its output,
for the cell's end record (``cell_loop.S3Cells``), so that the notebook learns how the cell ended,
and sees its last lines, from S3 in a fraction of a second instead of from CloudWatch seconds later.

Output is taken where the cell's Python writes it (``sys.stdout``, ``sys.stderr``); what a
subprocess or C code writes to the file descriptors themselves reaches the notebook with the log only.
"""

from __future__ import annotations

import sys
from collections import deque

EVENTS_KEPT = 200  # a rank's last event lines in a record (the log brings any before them)
LINES_KEPT = 200  # a rank's last output lines per stream in a record
LINE_LIMIT = 4096  # characters of one line kept in a record (a longer line waits for the log)


class Transcript:
    """One rank's cell so far: ``events`` (wire lines), ``output[stream]`` (complete lines, the last
    ``LINES_KEPT``) and ``dropped[stream]`` (lines before those). ``begin`` starts a cell's."""

    def __init__(self) -> None:
        self.events: deque[str] = deque(maxlen=EVENTS_KEPT)
        self.output: dict[str, deque[str]] = {name: deque(maxlen=LINES_KEPT) for name in ("stdout", "stderr")}
        self.dropped = {"stdout": 0, "stderr": 0}
        self.long_line = False  # a line over LINE_LIMIT was written: the record's output is not the whole tail
        self._partial = {"stdout": "", "stderr": ""}

    def install(self, emitter) -> None:
        """Keep what the rank writes from now on: its events (through ``emitter``) and its output."""
        emitter.tap = self.events.append
        sys.stdout = _Tee(sys.stdout, "stdout", self)
        sys.stderr = _Tee(sys.stderr, "stderr", self)

    def begin(self) -> None:
        self.events.clear()
        for name, lines in self.output.items():
            lines.clear()
            self.dropped[name] = 0
            self._partial[name] = ""
        self.long_line = False

    def wrote(self, stream: str, text: str) -> None:
        pieces = (self._partial[stream] + text).split("\n")
        self._partial[stream] = pieces.pop()[:LINE_LIMIT + 1]  # (a longer line is cut, and marked, when it ends)
        lines = self.output[stream]
        for line in pieces:
            if len(line) > LINE_LIMIT:
                self.long_line, line = True, line[:LINE_LIMIT]
            if len(lines) == LINES_KEPT:
                self.dropped[stream] += 1
            lines.append(line)

    def record(self) -> dict:
        """This rank's part of the cell's end record (a line still unfinished is the log's to bring)."""
        return {"events": list(self.events), "output": {name: list(lines) for name, lines in self.output.items()},
                "dropped": dict(self.dropped), "whole": not self.long_line}


class _Tee:
    """A text stream that also hands what is written to a transcript."""

    def __init__(self, stream, name: str, transcript: Transcript):
        self._stream, self._name, self._transcript = stream, name, transcript

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        self._transcript.wrote(self._name, text)
        return written

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)
