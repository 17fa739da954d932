"""The Slurm backend, as the registry knows it: its options and settings, checked for form while
the line is parsed (the cluster says whether a partition or account exists, when the backend is made)."""

from __future__ import annotations

import argparse
import re
import shlex
from typing import TYPE_CHECKING

from IPython.core.error import UsageError

from ...options import JOB, Option, Setting, joined_args, split_args, text, yes_no
from ..base import Declaration

if TYPE_CHECKING:
    from ...options import Config, LaunchOptions
    from .backend import SlurmBackend

IDLE_DEFAULT = 1800.0  # seconds an allocation may sit without a cell, unless --max-idle says
_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$|^UNLIMITED$|^INFINITE$", re.IGNORECASE)


def _option(*flags: str, attached: bool = False, **declaration) -> Option:
    return Option(JOB, flags, declaration, only="slurm", attached=attached)


OPTIONS = (
    _option("--partition", default=None, help="slurm: partition (queue) to run in."),
    _option("--time", default=None, metavar="LIMIT",
            help="slurm: the job's time limit, as Slurm takes it: minutes, or [days-]hours:minutes:seconds."),
    _option("--account", default=None, help="slurm: account the job is charged to."),
    _option("--qos", default=None, help="slurm: quality of service."),
    _option("--constraint", default=None, metavar="FEATURES", help="slurm: node features the job needs."),
    _option("--reservation", default=None, metavar="NAME", help="slurm: reservation to run in."),
    _option("--slurm-args", default=None, metavar="ARGS", attached=True,
            help='slurm: extra salloc/sbatch arguments, quoted: --slurm-args "--exclusive --mem=0".'),
    _option("--srun", action="store_true",
            help="slurm: start the ranks with srun --mpi=pmix instead of mpirun inside the allocation."),
    _option("--batch", action="store_true", default=None,
            help="slurm: run the cell as a batch job (sbatch), mpirun on its first node, where the nodes cannot "
                 "reach this machine (by default salloc holds the allocation and mpirun runs here)."),
)

SETTINGS = (
    Setting("partition", None, text, "slurm: partition (default: the cluster's default partition)"),
    Setting("account", None, text, "slurm: account the jobs are charged to"),
    Setting("qos", None, text, "slurm: quality of service"),
    Setting("time", None, text, "slurm: time limit of each job, as Slurm's --time takes it (e.g. 30, 1:00:00)"),
    Setting("slurm_args", "", split_args, "slurm: extra salloc/sbatch arguments for every job"),
    Setting("slurm_batch", False, yes_no, "slurm: run each cell as a batch job (sbatch), as --batch does"),
    Setting("notebook_host", None, text,
            "slurm sessions: the name or address the ranks reach this notebook at (default: this machine's name)"),
)


def values(args: argparse.Namespace, config: Config) -> dict:
    """The job's settings from the cell (and %mpirun_config), checked for form only."""
    time_limit = config.pick("time", args.time)
    if time_limit is not None and not _TIME.match(time_limit):
        raise UsageError(f"--time {time_limit!r} is not a Slurm time limit; write minutes (30), hours:minutes:seconds "
                         "(1:00:00) or days-hours (2-12)")
    extra = joined_args(config.get("slurm_args"), args.slurm_args and config.pick("slurm_args", args.slurm_args))
    return {"partition": config.pick("partition", args.partition), "account": config.pick("account", args.account),
            "qos": config.pick("qos", args.qos), "time": time_limit, "constraint": args.constraint,
            "reservation": args.reservation, "slurm_args": shlex.split(extra), "srun": args.srun,
            "batch": config.pick("slurm_batch", "yes" if args.batch else None)}


def _default_gpus(settings: dict) -> int:
    """The partition's GPUs per node; 1 on a partition without them (the registry's floor)."""
    from .cluster import default_gpus

    return default_gpus(settings.get("partition"))


def _make(config: Config, options: LaunchOptions) -> SlurmBackend:
    from .backend import SlurmBackend

    return SlurmBackend(config, options)


SLURM = Declaration(
    name="slurm", about="a Slurm job", make=_make, default_gpus=_default_gpus,
    max_ranks=65536, why_max="the notebook keeps live state for every rank",
    options=OPTIONS, settings=SETTINGS, values=values, idle_default=IDLE_DEFAULT,
    export_needs="Slurm's commands (`salloc`, `squeue`, `scancel`) reaching the cluster the job ran on, and the "
                 "cache folder (`MPI_MAGIC_CACHE_DIR`) on a file system its nodes share",
    export_launch="the job's script (also `job.sh`) and the salloc line that runs it",
)
