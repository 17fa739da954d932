"""The local backend, as the registry knows it: ranks on this machine, no options of its own."""

from __future__ import annotations

import glob
import os
from typing import TYPE_CHECKING

from ..base import Declaration

if TYPE_CHECKING:
    from ...options import Config, LaunchOptions
    from .backend import LocalBackend


def gpu_count(settings: dict | None = None) -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else the NVIDIA devices present."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    return len(glob.glob("/proc/driver/nvidia/gpus/*"))


def _make(config: Config, options: LaunchOptions) -> LocalBackend:
    from .backend import LocalBackend

    return LocalBackend(config)


LOCAL = Declaration(
    name="local", about="this machine", make=_make, default_gpus=gpu_count,
    one_host=True, max_ranks=1024, why_max="each rank is a Python process on this machine, about 32 MiB each",
    export_needs="`mpirun` (Open MPI or MPICH) on this machine, or the one named by `%mpirun_config mpirun=...` "
                 "(`MPI_MAGIC_MPIRUN`)",
    export_launch="the mpirun line",
)
