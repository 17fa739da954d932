"""Run a Jupyter cell as MPI ranks: ``%load_ext mpi_magic``, then ``%%mpirun_remote -i 2 -g 4``.

Importing this package stays light (no IPython widgets, no cloud SDKs): it is imported on
every rank too.
"""

from .errors import (
    CaptureError,
    JobError,
    JobTimeoutError,
    LauncherNotFound,
    MpiMagicError,
    PayloadError,
    RankExitError,
    RemoteRankError,
    SageMakerSetupError,
    SessionStartError,
)
from .rankinfo import instance, local_rank, num_instances, rank, world_size
from .reporting import progress

__version__ = "0.1.0"

__all__ = [
    "CaptureError",
    "JobError",
    "JobTimeoutError",
    "LauncherNotFound",
    "MpiMagicError",
    "PayloadError",
    "RankExitError",
    "RemoteRankError",
    "SageMakerSetupError",
    "SessionStartError",
    "instance",
    "load_ipython_extension",
    "local_rank",
    "num_instances",
    "progress",
    "rank",
    "world_size",
]


def load_ipython_extension(ipython) -> None:
    """Called by ``%load_ext mpi_magic``: registers %%mpirun_remote, %mpirun_session and the other magics."""
    from .magic import MpiMagics

    ipython.register_magics(MpiMagics(ipython))
