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
from ...shared.channel import SocketChannel
from ..channel_ranks import ClusterSessionRanks, this_host
from .bootstrap import SESSION_SECRET

if TYPE_CHECKING:
    from ...options import Config, LaunchOptions
    from ..base import SessionRanks
    from .backend import KubernetesBackend, KubernetesJob

START_LIMIT = 1800.0  # seconds from creating the job until every rank is up: Kueue, the scheduler and image pulls


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


class KubernetesSessionRanks(ClusterSessionRanks):
    """A session's MPIJob, and the channel to its rank 0."""

    start_limit = START_LIMIT

    job: KubernetesJob

    def __init__(self, job: KubernetesJob, cells: SocketChannel):
        super().__init__(job, cells, job.name)

    @property
    def job_name(self) -> str:
        return self.job.name

    def facts(self) -> list[str]:
        return [f"MPIJob {self.job.namespace}/{self.job.name}: {'ended' if self.job.finished else 'running'}"]


if TYPE_CHECKING:  # read by the type checker only
    def _is_session_ranks(ranks: KubernetesSessionRanks) -> SessionRanks:
        return ranks
