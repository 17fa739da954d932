"""Where ranks run. A backend submits a job and yields events; it never imports the view."""

from __future__ import annotations

import glob
import os

from ..errors import BackendNotAvailable
from .base import AttachableBackend, Backend, BackendJob, SessionBackend


def get_backend(name: str, config, options) -> Backend:
    """The backend called ``name``, checked to be usable here (raises before anything starts)."""
    if name == "local":
        from .local import LocalBackend

        return LocalBackend(config)
    if name == "sagemaker":
        from .sagemaker.backend import SageMakerBackend
        from .sagemaker.settings import resolve

        settings, aws = resolve(options.cloud)
        return SageMakerBackend(settings, aws, options.requirements, config.get("live_tail"), config.get("stall_after"))
    if name == "slurm":
        from .slurm.batch_job import SlurmBackend

        return SlurmBackend(config, options)
    raise BackendNotAvailable(f"there is no {name!r} backend; use local, sagemaker or slurm")


def get_attachable(name: str, config) -> AttachableBackend:
    """The backend whose jobs another kernel can follow or take over (SageMaker's outlive the kernel)."""
    if name == "sagemaker":
        from .sagemaker.backend import SageMakerJobs

        return SageMakerJobs(config)
    raise BackendNotAvailable(f"the {name} backend's jobs end with the kernel that started them; "
                              "only sagemaker jobs can be attached")


def default_gpus(name: str, settings: dict) -> int:
    """Processes per instance when --gpus is not given: the instance type's accelerators
    (SageMaker; an unknown count is an error), the partition's GPUs per node (Slurm; 1 on a
    partition without them), else this machine's GPUs."""
    if name == "sagemaker":
        from .sagemaker.settings import default_processes

        return default_processes(settings.get("instance_type"))
    if name == "slurm":
        from .slurm.cluster import default_gpus as partition_gpus

        return partition_gpus(settings.get("partition"))
    return local_gpu_count()


def local_gpu_count() -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else the NVIDIA devices present."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    return len(glob.glob("/proc/driver/nvidia/gpus/*"))


__all__ = ["AttachableBackend", "Backend", "BackendJob", "SessionBackend", "default_gpus", "get_attachable",
           "get_backend", "local_gpu_count"]
