"""A session on Slurm: one allocation (one batch job) whose ranks wait for cells.

Rank 0 connects to a TCP port this notebook listens on (``shared/channel.py``: it proves the
session's secret, and every message is signed), so a cell reaches the ranks in milliseconds over
the cluster's network; payloads and results stay in the job folders on the shared filesystem,
and the ranks' events come through the launcher's files there, as for a one-off job. An
interrupt is a message to rank 0, which passes it on to every rank over MPI. The session ends
after ``--max-idle`` without a cell, at the allocation's time limit, when the notebook closes
the channel, and, if the kernel is killed, by the job's watchdog (``scancel``).
"""

from __future__ import annotations

import os
import secrets
from typing import TYPE_CHECKING

from ...shared import envvars, jobdir
from ...shared.channel import SocketChannel, interrupt_message
from .. import launcher as launchers
from ..channel_ranks import ChannelRanks, this_host
from ..follow import stop_then_wait

if TYPE_CHECKING:
    from ...options import Config, LaunchOptions
    from ..base import SessionRanks
    from .backend import SlurmBackend, SlurmJob

START_LIMIT = 1800.0  # seconds from submitting until every rank is up: the queue wait included
CANCEL_WAIT = 30.0  # seconds a stop waits for Slurm to end the job it cancelled


def start(backend: SlurmBackend, name: str, options: LaunchOptions, config: Config) -> SlurmSessionRanks:
    """Submit the allocation; returns once it is submitted (its ranks connect when Slurm starts them)."""
    folder = os.path.join(config.get("cache_dir"), "slurm", name)  # its batch script and launcher's files
    jobdir.make_private_dirs(folder)
    secret = secrets.token_hex(32)
    cells = SocketChannel(None, secret, tcp_host=config.get("notebook_host") or this_host())
    command = launchers.session_command(cells.address, options.max_idle)
    try:
        job = backend.submit_batch(folder, name, command, options, {envvars.SESSION_SECRET: secret})
    except BaseException:
        cells.close()
        raise
    return SlurmSessionRanks(job, cells)


class SlurmSessionRanks(ChannelRanks):
    """A session's batch job, and the channel to its rank 0."""

    stop_description = "an interrupt to rank 0, which passes it on to every rank"
    latency = 0.0
    released = None  # the allocation ends with the notebook: no other notebook takes it over
    start_limit = START_LIMIT
    launcher = None  # the launcher runs on a node of the cluster
    stacks_dir = None

    job: SlurmJob

    def __init__(self, job: SlurmJob, cells: SocketChannel):
        super().__init__(job, cells)
        self.name = job.name
        self._cell = 0  # the cell sent last, which an interrupt is for

    @property
    def job_name(self) -> str:
        return self.job.job_id

    def _new_cell(self, number: int) -> None:
        self._cell = number
        self.job.new_cell()

    def request_stacks(self) -> bool:
        """Through Slurm, as a one-off job's ranks are asked (``scancel --signal``), idle or in a cell."""
        return self.job.request_stacks()

    def interrupt(self, pids: dict[int, int]) -> None:
        """One message: rank 0 interrupts itself and tells the others (``KeyboardInterrupt`` in the cell)."""
        if self._cell:
            self.cells.send(interrupt_message(self._cell))

    def memory(self, pids: dict[int, int]) -> dict[int, int]:
        return {}  # each rank's memory comes with its events (the resources it reports)

    def facts(self) -> list[str]:
        state = "ended" if self.job.over.is_set() else self.job.state.state.lower() if self.job.state else "submitted"
        return [f"Slurm job {self.job.job_id}: {state}"]

    def let_go(self, reason: str) -> None:
        """An allocation cannot outlive the notebook's hold on it: it is stopped."""
        self.stop(wait=False)

    def stop(self, wait: bool = True) -> None:
        """Close the channel and cancel the job (``scancel``), unless it has ended; ranks told that the
        session ends had their moment to leave by themselves before this (``Session.stop``)."""
        self.cells.close()
        stop_then_wait(self.job.cancel, self.job.over.is_set, CANCEL_WAIT if wait else 0,
                       lambda: self.job.over.wait(0.05))


if TYPE_CHECKING:  # read by the type checker only
    def _is_session_ranks(ranks: SlurmSessionRanks) -> SessionRanks:
        return ranks
