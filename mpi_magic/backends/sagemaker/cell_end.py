"""A SageMaker session cell's end from its end record in S3, beside the log that brings the same
lines seconds later: each event and each output line is passed on once, whichever brings it first.

Events carry their rank's sequence numbers, so the job's decoder drops the copies the log brings
after the record. Output lines carry none: the lines the log brought during the cell are matched
against the record's tail of each rank's stream, the rest is shown from the record, and those
lines are then expected from the log, and dropped when they come. A record whose tail does not
reach back to what the log has shown (a rank printed more than the record keeps, or a line longer
than it keeps) is not used: the cell's end then comes from the log, as without a record.
"""

from __future__ import annotations

import base64
import os
from collections import defaultdict, deque

from ...shared import jobdir
from ...shared.events import Event, Output
from ...shared.layout import result_path

STREAMS = ("stdout", "stderr")


class CellEnds:
    """What the log brought of the running cell, and what an end record showed before the log did."""

    def __init__(self) -> None:
        self._seen: dict[tuple[int, str], list[str]] = defaultdict(list)  # the running cell's lines from the log
        self._expected: dict[tuple[int, str], deque[str]] = defaultdict(deque)  # shown from a record, not yet logged
        self.record: dict | None = None  # the running cell's end record, once read
        self.applied = False

    def begin(self) -> None:
        """A cell was sent: its lines count from now."""
        self._seen.clear()
        self.record, self.applied = None, False

    def from_log(self, events: list[Event]) -> list[Event]:
        """The log's events less the output lines a record showed already."""
        kept = []
        for event in events:
            if isinstance(event, Output):
                key = (event.rank, event.stream)
                expected = self._expected.get(key)
                if expected and expected[0] == event.text:
                    expected.popleft()
                    continue
                if not self.applied:
                    self._seen[key].append(event.text)
            kept.append(event)
        return kept

    def apply(self, decode) -> list[Event] | None:
        """The events of the record (output first, then each rank's events, decoded by ``decode(rank,
        lines)``); None while it cannot be used yet (or at all)."""
        record = self.record
        if record is None or self.applied:
            return None
        shown: list[tuple[tuple[int, str], list[str]]] = []
        for part in record["ranks"]:
            if not part.get("whole", False):
                return None
            for stream in STREAMS:
                key = (int(part["rank"]), stream)
                lines, dropped = list(part["output"].get(stream, ())), int(part["dropped"].get(stream, 0))
                seen = self._seen.get(key, [])
                if len(seen) < dropped:  # lines before the record's tail have not come yet: the log brings all
                    return None
                shown.append((key, lines[_already_seen(seen[dropped:], lines):]))
        self.applied = True
        events: list[Event] = []
        for key, lines in shown:
            events += [Output(key[0], key[1], text) for text in lines]
            self._expected[key].extend(lines)
        for part in record["ranks"]:
            events += decode(int(part["rank"]), list(part["events"]))
        return events

    def fetch_results(self, job_dir: str, ranks, kind: str) -> list[int]:
        """Write the record's results of ``ranks`` into ``job_dir``; the ranks whose results it lacks."""
        held = {int(part["rank"]): part.get("results", {}) for part in (self.record or {}).get("ranks", ())}
        missing = []
        for rank in ranks:
            data = held.get(rank, {}).get(kind)
            if data is None:
                missing.append(rank)
                continue
            path = result_path(job_dir, rank, kind)
            jobdir.make_private_dirs(os.path.dirname(path))
            partial = f"{path}.{os.getpid()}.part"
            with jobdir.open_private(partial, "wb") as f:
                f.write(base64.b64decode(data))
            os.replace(partial, path)  # a result file is whole or absent, as fetch_each leaves it
        return missing


def _already_seen(seen: list[str], lines: list[str]) -> int:
    """How many of ``lines`` (a rank's last lines) the log has brought, ``seen`` being what it brought
    from the same point on: the longest start of ``lines`` that ``seen`` ends with."""
    for count in range(min(len(seen), len(lines)), 0, -1):
        if seen[len(seen) - count:] == lines[:count]:
            return count
    return 0
