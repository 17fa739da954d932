"""Run a Jupyter cell as MPI ranks: ``%load_ext mpi_magic``, then ``%%mpirun_remote -i 2 -g 4``.

Importing this package costs next to nothing (no IPython, no widgets, no cloud SDKs): every
rank imports it at start-up. Its public names are imported from their modules when first used.
"""

__version__ = "0.1.0"

# Each public name and the module that defines it.
_HOMES = {
    **dict.fromkeys(["BackendSetupError", "CaptureError", "JobError", "JobTimeoutError", "LauncherNotFound",
                     "MpiMagicError", "PayloadError", "RankExitError", "RemoteRankError", "SessionStartError"], "errors"),
    "SageMakerSetupError": "backends.sagemaker.settings",  # (each backend's own kind of BackendSetupError)
    "SlurmSetupError": "backends.slurm.commands",
    "KubernetesSetupError": "backends.kubernetes.cluster",
    **dict.fromkeys(["checkpoint_dir", "instance", "local_rank", "num_instances", "rank", "world_size"], "shared.rankinfo"),
    "progress": "shared.reporting",
    "log": "shared.metrics",
    "Job": "notebook.job",
}
__all__ = sorted([*_HOMES, "load_ipython_extension"])

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .errors import (BackendSetupError, CaptureError, JobError, JobTimeoutError, LauncherNotFound,
                         MpiMagicError, PayloadError, RankExitError, RemoteRankError, SessionStartError)
    from .backends.sagemaker.settings import SageMakerSetupError
    from .backends.slurm.commands import SlurmSetupError
    from .backends.kubernetes.cluster import KubernetesSetupError
    from .shared.rankinfo import checkpoint_dir, instance, local_rank, num_instances, rank, world_size
    from .shared.reporting import progress
    from .shared.metrics import log
    from .notebook.job import Job


def __getattr__(name: str):
    """A public name, imported from its module on first use (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def load_ipython_extension(ipython) -> None:
    """Called by ``%load_ext mpi_magic``: registers %%mpirun_remote, %mpirun_session and the other magics."""
    from .magic import MpiMagics

    ipython.register_magics(MpiMagics(ipython))
