"""Waits, a job running on the SageMaker emulator (moto, the emulator, each instance's Open MPI daemons),
to be interrupted by ``test_suite``'s interrupted run; not a test of the suite's own (not test_*.py)."""

import pytest
from helpers import run


@pytest.mark.timeout(600)
def test_a_job_on_the_rehearsal_cloud(ip, cloud):
    run(ip, "-i 2 -g 1 --quiet", "import time\ntime.sleep(600)\n")
