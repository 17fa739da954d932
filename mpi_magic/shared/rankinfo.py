"""Where this process sits in the job: usable inside a cell, and 0 / 1 outside one.

The rank runtime exports these variables before the cell runs, so code that reads
``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` (torch.distributed's ``env://``) works too.
"""

from __future__ import annotations

import os
from . import envvars


NO_CHECKPOINTS = "none"
CHECKPOINTS = "checkpoints"  # the folder's name: beside the notebook, or under SageMaker's /opt/ml


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else default


def rank() -> int:
    """This process's rank in the job (0 outside a job)."""
    return _env_int(envvars.RANK, 0)


def world_size() -> int:
    """How many ranks the job has (1 outside a job)."""
    return _env_int(envvars.WORLD_SIZE, 1)


def local_rank() -> int:
    """This rank's index among the ranks of its instance."""
    return _env_int(envvars.LOCAL_RANK, 0)


def instance() -> int:
    """The 0-based index of the instance this rank runs on."""
    return _env_int(envvars.INSTANCE, 0)


def num_instances() -> int:
    """How many instances the job spans."""
    return _env_int(envvars.INSTANCES, 1)


def checkpoint_dir() -> str:
    """The folder this rank saves checkpoints in, so that a job started again resumes from them.

    On SageMaker it is ``/opt/ml/checkpoints``, which SageMaker keeps in step with the cell's
    ``--checkpoint-s3`` prefix and fills from it when a spot job starts again on new instances
    (every instance syncs to the same prefix: give each rank's files their own names). Locally it
    is ``checkpoints`` in the notebook's folder, so a cell run again finds what the last run saved.
    ``MPI_MAGIC_CHECKPOINT_DIR`` chooses another folder. The folder exists when this returns.
    """
    path = os.environ.get(envvars.CHECKPOINT_DIR)
    sagemaker = os.environ.get(envvars.CHECKPOINT_S3)
    if not path and sagemaker == NO_CHECKPOINTS:
        raise RuntimeError("this SageMaker job keeps no checkpoints: add --checkpoint-s3 s3://bucket/prefix to the "
                           "cell (or to %mpirun_session start) so that what a rank saves there outlives its instance")
    if not path:
        base = os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml") if sagemaker else os.getcwd()
        path = os.path.join(base, CHECKPOINTS)
    os.makedirs(path, exist_ok=True)
    return path
