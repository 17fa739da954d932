"""What the local and the Slurm sessions' ranks share: cells go to rank 0 over the notebook's socket
channel (``shared/channel.py``), events come from the launcher's job, and results are written
straight into the cells' job folders, which the notebook reads where they are."""

from __future__ import annotations

from typing import Iterable, Protocol

from ..shared.channel import SocketChannel, cell_message, stop_message
from ..shared.events import Event
from ..shared.layout import RESULTS


class EventSource(Protocol):
    """The launcher's job, as the session's pump reads it."""

    @property
    def finished(self) -> bool: ...

    def poll(self, timeout: float) -> list[Event]: ...


class ChannelRanks:
    """The delegations both sessions' ranks make; each adds how it sends, interrupts and stops."""

    def __init__(self, job: EventSource, cells: SocketChannel):
        self.job, self.cells = job, cells

    @property
    def finished(self) -> bool:
        return self.job.finished

    def poll(self, timeout: float) -> list[Event]:
        return self.job.poll(timeout)

    def connect(self) -> bool:
        return self.cells.try_accept()

    def send_cell(self, number: int, job_dir: str, digest: str | None) -> None:
        self._new_cell(number)
        self.cells.send(cell_message(number, job_dir, digest))

    def close(self, reason: str) -> None:
        self.cells.send(stop_message(reason))

    def _new_cell(self, number: int) -> None:
        """What the job resets before a cell is sent (its per-cell tally)."""

    def fetch_results(self, job_dir: str, ranks: Iterable[int], kind: str = RESULTS) -> None:
        """The ranks wrote their results into the cell's folder already."""
