"""Slurm sessions against the real Slurm cluster on this machine: one allocation whose ranks keep
their state between cells, interrupted and stopped from the notebook, ended by its idle timeout
and by a killed kernel, leaving nothing in ``squeue``."""

from __future__ import annotations

import _thread
import os
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import once, run, wait_until

from mpi_magic.testing import slurm_cluster
from mpi_magic.testing.slurm_cluster import PACKAGES, SlurmCluster

pytestmark = pytest.mark.skipif(bool(slurm_cluster.missing_programs()),
                                reason=f"Slurm is not installed here (apt-get install {PACKAGES}; .ci/run does)")

GONE_WITHIN = 10.0  # seconds after a stop by which squeue must show nothing of the job


@pytest.fixture
def cluster(slurm_cluster):
    return slurm_cluster


@pytest.fixture
def slurm(ip, cluster):
    ip.run_line_magic("mpirun_config", "view=text")
    yield ip
    assert wait_until(lambda: _queue(cluster) == [], GONE_WITHIN), f"a test left a job in the queue: {_queue(cluster)}"


def _queue(cluster: SlurmCluster) -> list[str]:
    """The jobs squeue lists (pending, running, completing), as 'id name state reason'."""
    return [line for line in cluster.run("squeue", "-h", "-o", "%i %j %T %r").stdout.splitlines() if line.strip()]


def _listed(cluster: SlurmCluster, job_name: str) -> bool:
    return any(line.split()[1] == job_name for line in _queue(cluster))


def test_a_session_is_one_allocation_whose_ranks_keep_state_between_cells(slurm, sessions, cluster, capsys):
    slurm.run_line_magic("mpirun_session", "start --backend slurm -i 2 -g 2 --time 30 --out s")
    session = slurm.user_ns["s"]
    assert [line.split()[2] for line in _queue(cluster)] == ["RUNNING"]  # one job holds the allocation
    slurm.user_ns["x"] = 3
    run(slurm, "--quiet", "import os\nfrom mpi4py import MPI\ncount = MPI.COMM_WORLD.allreduce(1)\n"
                          "nodes = MPI.COMM_WORLD.allgather(os.environ['SLURMD_NODENAME'])")
    assert slurm.user_ns["count"] == 4 and slurm.user_ns["nodes"] == ["n1", "n1", "n2", "n2"]
    took = []
    for _ in range(5):
        started = time.monotonic()
        run(slurm, "--quiet", "count += x")
        took.append(time.monotonic() - started)
    assert slurm.user_ns["count"] == 4 + 5 * 3, "the ranks kept count between cells"
    assert sorted(took)[2] < 1.0, took  # (milliseconds here: benchmarks/bench_slurm.py measures them)
    slurm.run_line_magic("mpirun_session", "status")
    status = capsys.readouterr().out
    assert f"Slurm job {session.job_name}: running" in status and "time left: 29:" in status, status
    with once(lambda: session.status == "running", _thread.interrupt_main), pytest.raises(KeyboardInterrupt):
        run(slurm, "", "import time\ntime.sleep(300)")
    run(slurm, "--quiet", "after = count")  # the interrupt reached every rank, and the session is kept
    assert slurm.user_ns["after"] == 19 and session.status == "idle"
    slurm.run_line_magic("mpirun_session", "stop")
    assert wait_until(lambda: _queue(cluster) == [], GONE_WITHIN), _queue(cluster)


def test_a_session_ends_after_its_idle_timeout(slurm, sessions, cluster):
    slurm.run_line_magic("mpirun_session", "start --backend slurm -i 2 -g 1 --idle-timeout 2 --out s")
    session = slurm.user_ns["s"]
    assert wait_until(lambda: session.status == "stopped", 30)
    assert "idle for 2s" in session.ended_reason
    assert wait_until(lambda: _queue(cluster) == [], GONE_WITHIN), _queue(cluster)


def test_a_killed_kernel_ends_its_session(cluster, tmp_path):
    kernel = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""\
        import os, sys, time
        from IPython.core.interactiveshell import InteractiveShell
        os.environ["MPI_MAGIC_CACHE_DIR"] = {str(tmp_path)!r}
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "mpi_magic")
        ip.run_line_magic("mpirun_session", "start --backend slurm -i 2 -g 1 --quiet --out s")
        print(ip.user_ns["s"].name, flush=True)
        time.sleep(300)
        """)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ, **cluster.environ})
    try:
        name = kernel.stdout.readline().strip()
        assert name and _listed(cluster, name), _queue(cluster)
    finally:
        kernel.kill()
        kernel.wait()
        kernel.stdout.close()
    assert wait_until(lambda: not _listed(cluster, name), GONE_WITHIN), _queue(cluster)
