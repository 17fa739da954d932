"""A local session's ranks: one mpirun on this machine, cells to rank 0 over a private Unix socket."""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING

import psutil

from ..channel_ranks import ChannelRanks
from ..scratch import ScratchFolder

if TYPE_CHECKING:
    from ..base import SessionRanks
    from .backend import LocalJob


class LocalSessionRanks(ChannelRanks):
    """A session's mpirun, and the channel to its rank 0."""

    stop_description = "SIGINT to every rank"
    job_name = None
    latency = 0.0
    released = None  # local ranks end with the notebook: no other notebook takes them over
    start_limit = 300.0

    job: LocalJob

    def __init__(self, job: LocalJob, cells, folder: ScratchFolder):
        super().__init__(job, cells)
        self.folder = folder
        self.name, self.pid, self.started = job.name, job.pid, job.started
        self.stacks_dir = job.stacks_dir

    @property
    def launcher(self) -> tuple[int, float]:
        return self.job.launcher

    def _new_cell(self, number: int) -> None:
        self.job.new_round()

    def request_stacks(self) -> bool:
        return False  # asked through stacks_dir

    def interrupt(self, pids: dict[int, int]) -> None:
        """SIGINT to the given ranks ({rank: pid}): a ``KeyboardInterrupt`` in the cell's code."""
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGINT)
            except OSError:
                pass

    def memory(self, pids: dict[int, int]) -> dict[int, int]:
        resident = {}
        for rank, pid in pids.items():
            try:
                resident[rank] = psutil.Process(pid).memory_info().rss
            except psutil.Error:
                pass
        return resident

    def facts(self) -> list[str]:
        return []

    def let_go(self, reason: str) -> None:
        """Local ranks cannot outlive the notebook's hold on them: they are stopped."""
        self.stop(wait=False)

    def stop(self, wait: bool = True) -> None:
        """Every rank, mpirun and what they started, stopped; the channel closed (at once: ``wait`` changes nothing)."""
        self.cells.close()
        if not self.job.finished:
            self.job.cancel()
        self.folder.remove()


if TYPE_CHECKING:  # read by the type checker only: a SessionRanks
    def _is_session_ranks(ranks: LocalSessionRanks) -> SessionRanks:
        return ranks
