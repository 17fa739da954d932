"""What the sessions' ranks share where cells go to rank 0 over the notebook's socket channel
(``shared/channel.py``: locally, on Slurm and on Kubernetes): events come from the launcher's job,
results are written straight into the cells' job folders, which the notebook reads where they are,
and a cluster's rank 0 finds the notebook by this machine's name (``this_host``)."""

from __future__ import annotations

import ipaddress
import socket
from typing import Iterable, Protocol

from ..shared.channel import SocketChannel, cell_message, interrupt_message, stop_message
from ..shared.events import Event
from ..shared.layout import RESULTS
from .follow import stop_then_wait


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


class ClusterJob(EventSource, Protocol):
    """A cluster's job that holds a session's ranks (a Slurm allocation, an MPIJob)."""

    @property
    def over(self): ...  # a threading.Event, set once the job's end is known

    def new_cell(self) -> None: ...

    def request_stacks(self) -> bool: ...

    def cancel(self) -> None: ...


class ClusterSessionRanks(ChannelRanks):
    """A session whose ranks run as one job of a cluster, its rank 0 reaching the notebook over TCP:
    an interrupt is a message to rank 0, which passes it on to every rank over MPI; the ranks are asked
    for their stacks as the job's one-off ranks are; a stop closes the channel and ends the job."""

    stop_description = "an interrupt to rank 0, which passes it on to every rank"
    latency = 0.0
    released = None  # the job ends with the notebook: no other notebook takes it over
    launcher = None  # the launcher runs in the cluster
    stacks_dir = None
    stop_wait = 30.0  # seconds a stop waits for the cluster to end the job

    job: ClusterJob

    def __init__(self, job: ClusterJob, cells: SocketChannel, name: str):
        super().__init__(job, cells)
        self.name = name
        self._cell = 0  # the cell sent last, which an interrupt is for

    def _new_cell(self, number: int) -> None:
        self._cell = number
        self.job.new_cell()

    def request_stacks(self) -> bool:
        """As the job's one-off ranks are asked, idle or in a cell."""
        return self.job.request_stacks()

    def interrupt(self, pids: dict[int, int]) -> None:
        """One message: rank 0 interrupts itself and tells the others (``KeyboardInterrupt`` in the cell)."""
        if self._cell:
            self.cells.send(interrupt_message(self._cell))

    def memory(self, pids: dict[int, int]) -> dict[int, int]:
        return {}  # each rank's memory comes with its events (the resources it reports)

    def let_go(self, reason: str) -> None:
        """A cluster's job cannot outlive the notebook's hold on it: it is stopped."""
        self.stop(wait=False)

    def stop(self, wait: bool = True) -> None:
        """Close the channel and end the job, unless it has ended; ranks told that the session ends had
        their moment to leave by themselves before this (``Session.stop``)."""
        self.cells.close()
        stop_then_wait(self.job.cancel, self.job.over.is_set, self.stop_wait if wait else 0,
                       lambda: self.job.over.wait(0.05))


def this_host() -> str:
    """This machine's name as the nodes would look it up: its fully qualified name, else its short
    name, the first that resolves to an address other than loopback, else the first that resolves;
    where neither does, only nodes on this machine could reach it. A fully qualified name that is not
    this machine's is passed over: ``socket.getfqdn()`` says "localhost" where /etc/hosts gives the
    machine's name 127.0.0.1 after localhost, and on a node that names the node."""
    short, full = socket.gethostname(), socket.getfqdn()
    names = [full, short] if full == short or full.startswith(short + ".") else [short]
    resolved = {}
    for name in names:
        try:
            resolved[name] = {info[4][0] for info in socket.getaddrinfo(name, None)}
        except OSError:
            continue
    for name, addresses in resolved.items():
        if any(not ipaddress.ip_address(address).is_loopback for address in addresses):
            return name
    return next(iter(resolved), "127.0.0.1")
