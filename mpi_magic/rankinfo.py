"""Where this process sits in the job: usable inside a cell, and 0 / 1 outside one.

The rank runtime exports these variables before the cell runs, so code that reads
``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` (torch.distributed's ``env://``) works too.
"""

from __future__ import annotations

import os


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else default


def rank() -> int:
    """This process's rank in the job (0 outside a job)."""
    return _env_int("MPI_MAGIC_RANK", 0)


def world_size() -> int:
    """How many ranks the job has (1 outside a job)."""
    return _env_int("MPI_MAGIC_WORLD_SIZE", 1)


def local_rank() -> int:
    """This rank's index among the ranks of its instance."""
    return _env_int("MPI_MAGIC_LOCAL_RANK", 0)


def instance() -> int:
    """The 0-based index of the instance this rank runs on."""
    return _env_int("MPI_MAGIC_INSTANCE", 0)


def num_instances() -> int:
    """How many instances the job spans."""
    return _env_int("MPI_MAGIC_INSTANCES", 1)
