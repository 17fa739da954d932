"""Waits, a job running on the tests' Slurm cluster, to be interrupted by ``test_suite``'s interrupted run;
not a test of the suite's own (not test_*.py)."""

import pytest
from helpers import needs_slurm, run

pytestmark = needs_slurm()


@pytest.mark.timeout(600)
def test_a_job_on_the_slurm_cluster(slurm):
    run(slurm, "--backend slurm -i 2 -g 1 --quiet", "import time\ntime.sleep(600)\n")
