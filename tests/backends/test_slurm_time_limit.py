"""Slurm's time limit, on a cluster of this test's own (it takes a minute): the job ends, and the
cell says it was Slurm's limit that stopped the ranks."""

from __future__ import annotations

import pytest
from helpers import needs_slurm, run, wait_until

from mpi_magic.errors import RankExitError

pytestmark = needs_slurm()


def test_slurms_time_limit_is_named_as_the_reason_the_ranks_stopped(ip, slurm_cluster):
    """--time 1 ends the job after a minute (plus the cluster's KillWait): Slurm's reason is said."""
    ip.run_line_magic("mpirun_config", "view=text")
    with pytest.raises(RankExitError) as raised:
        run(ip, "--backend slurm -i 2 -g 1 --partition short --time 1 --out job", "import time\ntime.sleep(300)")
    assert str(raised.value).endswith("stopped before the cell finished: the job reached its Slurm time limit (--time)")
    assert wait_until(lambda: not slurm_cluster.run("squeue", "-h").stdout.strip(), 10)
