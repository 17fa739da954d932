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
from ...shared.channel import SocketChannel
from .. import launcher as launchers
from ..channel_ranks import ClusterSessionRanks, this_host

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


class SlurmSessionRanks(ClusterSessionRanks):
    """A session's batch job, and the channel to its rank 0; its ranks are asked for their stacks through
    Slurm (``scancel --signal``), as a one-off job's are."""

    start_limit = START_LIMIT
    stop_wait = CANCEL_WAIT

    job: SlurmJob

    def __init__(self, job: SlurmJob, cells: SocketChannel):
        super().__init__(job, cells, job.name)

    @property
    def job_name(self) -> str:
        return self.job.job_id

    def facts(self) -> list[str]:
        state = "ended" if self.job.over.is_set() else self.job.state.state.lower() if self.job.state else "submitted"
        return [f"Slurm job {self.job.job_id}: {state}"]


if TYPE_CHECKING:  # read by the type checker only
    def _is_session_ranks(ranks: SlurmSessionRanks) -> SessionRanks:
        return ranks
