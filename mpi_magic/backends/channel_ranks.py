"""What the local and the Slurm sessions' ranks share: cells go to rank 0 over the notebook's socket
channel (``shared/channel.py``), events come from the launcher's job, and results are written
straight into the cells' job folders, which the notebook reads where they are."""

from __future__ import annotations

from typing import Iterable, Protocol

from ..shared.channel import SocketChannel
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

    def fetch_results(self, job_dir: str, ranks: Iterable[int], kind: str = RESULTS) -> None:
        """The ranks wrote their results into the cell's folder already."""
