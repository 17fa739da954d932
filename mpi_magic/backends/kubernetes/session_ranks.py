"""A session on Kubernetes: one MPIJob whose ranks wait for cells.

Rank 0 connects to a TCP port this notebook listens on (``shared/channel.py``: it proves the
session's secret, and every message is signed), so a cell reaches the ranks in milliseconds; the
secret goes to the launcher through the session's folder on the shared volume, never through the
API. Payloads and results stay in the cells' job folders, and the ranks' events come through the
launcher's log, as for a one-off job. An interrupt is a message to rank 0, which passes it on to
every rank over MPI. The session ends after ``--max-idle`` without a cell, when the notebook closes
the channel, when the job is deleted, and, if the kernel is killed, by the job's watchdog.

The pods must reach the notebook: a notebook in the cluster (a Kubeflow notebook, a Studio space
on the cluster's network) at its pod's address, by this machine's name, or at the address
``%mpirun_config kubernetes_notebook_host=...`` gives.
"""

from __future__ import annotations

import os
import secrets
from typing import TYPE_CHECKING

from ...shared import jobdir
from ...shared.channel import SocketChannel, interrupt_message
from ..channel_ranks import ChannelRanks, this_host
from ..follow import stop_then_wait
from .bootstrap import SESSION_SECRET

if TYPE_CHECKING:
    from ...options import Config, LaunchOptions
    from ..base import SessionRanks
    from .backend import KubernetesBackend, KubernetesJob

START_LIMIT = 1800.0  # seconds from creating the job until every rank is up: Kueue, the scheduler and image pulls
DELETE_WAIT = 30.0  # seconds a stop waits for the job's end after deleting it


def start(backend: KubernetesBackend, name: str, options: LaunchOptions, config: Config) -> KubernetesSessionRanks:
    """Create the MPIJob; returns once it is created (its rank 0 connects once its pods run)."""
    folder = os.path.join(backend.cache_dir, "kubernetes", name)  # on the shared volume: the secret, stack requests
    jobdir.make_private_dirs(folder)
    secret = secrets.token_hex(32)
    with jobdir.open_private(os.path.join(folder, SESSION_SECRET), "w") as f:
        f.write(secret)
    cells = SocketChannel(None, secret, tcp_host=config.get("kubernetes_notebook_host") or this_host())
    runs = ["--session", cells.address, *(["--idle-timeout", repr(options.max_idle)] if options.max_idle else [])]
    try:
        job = backend.create(folder, name, runs, options)
    except BaseException:
        cells.close()
        raise
    return KubernetesSessionRanks(job, cells)


class KubernetesSessionRanks(ChannelRanks):
    """A session's MPIJob, and the channel to its rank 0."""

    stop_description = "an interrupt to rank 0, which passes it on to every rank"
    latency = 0.0
    released = None  # the job ends with the notebook: no other notebook takes it over
    start_limit = START_LIMIT
    launcher = None  # mpirun runs in the launcher pod
    stacks_dir = None

    job: KubernetesJob

    def __init__(self, job: KubernetesJob, cells: SocketChannel):
        super().__init__(job, cells)
        self.name = job.name
        self._cell = 0  # the cell sent last, which an interrupt is for

    @property
    def job_name(self) -> str:
        return self.job.name

    def _new_cell(self, number: int) -> None:
        self._cell = number
        self.job.new_cell()

    def request_stacks(self) -> bool:
        """As a one-off job's ranks are asked (a file the launcher watches), idle or in a cell."""
        return self.job.request_stacks()

    def interrupt(self, pids: dict[int, int]) -> None:
        """One message: rank 0 interrupts itself and tells the others (``KeyboardInterrupt`` in the cell)."""
        if self._cell:
            self.cells.send(interrupt_message(self._cell))

    def memory(self, pids: dict[int, int]) -> dict[int, int]:
        return {}  # each rank's memory comes with its events (the resources it reports)

    def facts(self) -> list[str]:
        return [f"MPIJob {self.job.namespace}/{self.job.name}: {'ended' if self.job.finished else 'running'}"]

    def let_go(self, reason: str) -> None:
        """A session's job cannot outlive the notebook's hold on it: it is stopped."""
        self.stop(wait=False)

    def stop(self, wait: bool = True) -> None:
        """Close the channel and delete the job, unless it has ended; ranks told that the session ends had
        their moment to leave by themselves before this (``Session.stop``)."""
        self.cells.close()
        stop_then_wait(self.job.cancel, self.job.over.is_set, DELETE_WAIT if wait else 0,
                       lambda: self.job.over.wait(0.05))


if TYPE_CHECKING:  # read by the type checker only
    def _is_session_ranks(ranks: KubernetesSessionRanks) -> SessionRanks:
        return ranks
