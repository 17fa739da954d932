"""Against real AWS: opt in with -m aws and MPI_MAGIC_AWS_ROLE, MPI_MAGIC_AWS_IMAGE,
MPI_MAGIC_AWS_S3_ROOT (and credentials). Skipped otherwise; a skip here proves nothing."""

from __future__ import annotations

import os

import pytest

NEEDED = ("MPI_MAGIC_AWS_ROLE", "MPI_MAGIC_AWS_IMAGE", "MPI_MAGIC_AWS_S3_ROOT")

pytestmark = [
    pytest.mark.aws,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(not all(os.environ.get(n) for n in NEEDED),
                       reason="real AWS is opt-in: set " + ", ".join(NEEDED) + " and AWS credentials"),
]


def test_two_instances_of_a_real_training_job(ip):
    ip.run_cell_magic("mpirun_remote", (
        f"--backend sagemaker -i 2 -g 1 --gather --out job --instance-type ml.m5.xlarge "
        f"--role {os.environ['MPI_MAGIC_AWS_ROLE']} --image-uri {os.environ['MPI_MAGIC_AWS_IMAGE']} "
        f"--s3-root {os.environ['MPI_MAGIC_AWS_S3_ROOT']}"
    ), "import os, socket, mpi_magic\nwhere = (mpi_magic.rank(), mpi_magic.instance(), socket.gethostname())\n")
    where = ip.user_ns["where"]
    assert [(r, i) for r, i, _ in where] == [(0, 0), (1, 1)]
    assert where[0][2] != where[1][2], "the two ranks ran on two machines"
