"""A real Slurm cluster on this machine (Debian's slurmctld, slurmd and munge), on test hosts of their
own where they can be made: it runs a job of mpirun over two nodes, and stopping it leaves no daemon,
no job's process and nothing of its hosts behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import psutil
import pytest
from helpers import command_of, needs_slurm

from mpi_magic.testing import hosts
from mpi_magic.testing.slurm_cluster import SlurmCluster

pytestmark = needs_slurm()


def _root() -> str:
    """Short, as munge's Unix socket path must be (pytest's tmp_path can be too long)."""
    return tempfile.mkdtemp(prefix="mpi_magic_slurm_")


def _cluster_processes(root: str) -> list[psutil.Process]:
    conf = os.path.join(root, "slurm.conf")
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            # the environment read raw: a step daemon's title overwrites the start of it, where psutil stops reading
            with open(f"/proc/{process.pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            if conf in " ".join(process.info["cmdline"] or []) or f"SLURM_CONF={conf}".encode() in environ:
                found.append(process)
        except (OSError, psutil.Error):
            continue
    return [p for p in found if p.pid != os.getpid() and _running(p)]


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except (OSError, psutil.Error):  # (it ended while it was looked at)
        return False


def _bed_left(number: int) -> list[str]:
    """What this machine still shows of bed ``number``: its namespaces and its login link."""
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in namespaces + links if f"mm{number}-" in line]


def _wait_gone(cluster: SlurmCluster, job: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while cluster.run("squeue", "-h", "-j", job).stdout.strip():
        assert time.monotonic() < deadline, cluster.run("squeue").stdout
        time.sleep(0.2)


def test_a_four_node_cluster_runs_mpirun_over_two_nodes_and_stops_without_a_trace():
    root = _root()
    cluster = SlurmCluster(root, nodes=4)
    try:
        cluster.start()
        shown = cluster.run("sinfo", "-h", "-N", "-o", "%N %t %P").stdout.split("\n")
        assert [line for line in shown if line.endswith("debug*")] == [f"n{n} idle debug*" for n in range(1, 5)]
        script = os.path.join(root, "allreduce.sh")
        with open(script, "w") as f:
            f.write(textwrap.dedent(f"""\
                #!/bin/sh
                #SBATCH --nodes=2 --ntasks-per-node=2 --output={root}/allreduce-%j.out
                export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
                echo "nodes $SLURM_JOB_NODELIST tasks $SLURM_NTASKS"
                {os.path.dirname(sys.executable)}/mpirun {sys.executable} -c \\
                    "import os, socket; from mpi4py import MPI; print('sum', MPI.COMM_WORLD.allreduce(1), 'yield', \\
                    os.environ.get('OMPI_MCA_mpi_yield_when_idle'), 'on', socket.gethostname(), flush=True)"
                """))
        job = cluster.run("sbatch", "--parsable", script).stdout.strip()
        assert job.isdigit()
        _wait_gone(cluster, job)
        with open(os.path.join(root, f"allreduce-{job}.out")) as f:
            out = f.read()
        # four nodes of this machine's cores: Open MPI's ranks are told to yield, not to busy-poll
        assert out.startswith("nodes n[1-2] tasks 4\n") and out.count("sum 4 yield 1 on ") == 4, out
        # mpirun read the allocation: two ranks on each node, each node a host of its own where it can be
        where = sorted(line.rsplit(" ", 1)[1] for line in out.splitlines()[1:])
        assert where == (["n1", "n1", "n2", "n2"] if cluster.bed else [socket.gethostname()] * 4), out
        own = cluster.run("srun", "-N", "2", "printenv", "OMPI_MCA_mpi_yield_when_idle",
                          env={"OMPI_MCA_mpi_yield_when_idle": "0"})
        assert own.stdout == "0\n0\n", "a job's own value stays"
        long = cluster.run("sbatch", "--parsable", "--nodes=3", f"--output={root}/long-%j.out", "--wrap",
                           "sleep 300").stdout.strip()
        deadline = time.monotonic() + 30
        while cluster.run("squeue", "-h", "-j", long, "-o", "%T").stdout.strip() != "RUNNING":
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        stopping = time.monotonic()
        cluster.stop(remove=True)
    took = time.monotonic() - stopping
    assert _cluster_processes(root) == [], "no daemon, step or job process is left"
    assert not os.path.exists(root)
    assert cluster.bed is None or _bed_left(cluster.bed.number) == []
    # (waiting out the SIGKILL grace, 5 s after SIGTERM's 1 s, would take 6 s and more)
    assert took < 5.5, f"the stop took {took:.1f}s: does it wait out SIGTERM's grace for daemons that have ended?"


@pytest.mark.parametrize("stand_in", [False, True], ids=["hosts", "stand-in"])
def test_the_command_line_starts_a_cluster_says_where_prints_its_variables_and_stops_it(stand_in):
    """On test hosts where this machine can make them, unless --stand-in puts every node on this host."""
    root = _root()
    command = [sys.executable, "-m", "mpi_magic.testing.slurm_cluster"]
    on_hosts = not stand_in and hosts.missing() is None
    try:
        started = subprocess.run([*command, "start", "--nodes", "2", "--root", root] + ["--stand-in"] * stand_in,
                                 capture_output=True, text=True, timeout=120)
        assert started.returncode == 0, started.stderr
        said, *exports = started.stdout.splitlines()
        if on_hosts:
            assert said.startswith("# nodes n1..n2 on test hosts of their own (10.213."), said
            login = said.rsplit(" ", 1)[1]
            assert exports == [f"export SLURM_CONF={root}/slurm.conf", f"export MPI_MAGIC_NOTEBOOK_HOST={login}"]
        else:
            assert said == "# nodes n1..n2 all on this host (test hosts are not used: " + (
                "asked for (--stand-in))" if stand_in else f"{hosts.missing()})")
            assert exports == [f"export SLURM_CONF={root}/slurm.conf"]
        client = {**os.environ, "SLURM_CONF": f"{root}/slurm.conf"}
        shown = subprocess.run(["srun", "-N", "2", "hostname"], capture_output=True, text=True, env=client, timeout=60)
        assert sorted(shown.stdout.split()) == (["n1", "n2"] if on_hosts else [socket.gethostname()] * 2), shown
        again = subprocess.run([*command, "start", "--nodes", "2", "--root", root], capture_output=True, text=True,
                               timeout=120)
        assert again.returncode == 1 and f"a cluster runs under {root} already: stop it first" in again.stderr
        assert len(_cluster_processes(root)) >= 4  # munged, slurmctld and a slurmd per node
    finally:
        stopped = subprocess.run([*command, "stop", "--root", root], capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    assert _cluster_processes(root) == [] and not os.path.exists(root)
    if on_hosts:
        assert _bed_left(int(login.split(".")[2])) == []


def test_a_cluster_whose_python_is_killed_is_stopped_all_the_same():
    """As a test worker killed before its fixtures' teardown (xdist kills one that takes over 10 s to end):
    the cluster it started, with a job running, is stopped by its keeper, its test hosts brought down, and its
    folder removed."""
    root = _root()
    script = textwrap.dedent(f"""\
        import sys, time
        from mpi_magic.testing.slurm_cluster import SlurmCluster
        cluster = SlurmCluster({root!r}, nodes=2).start()
        job = cluster.run("sbatch", "--parsable", "--nodes=2", "--output=/dev/null", "--wrap", "sleep 300")
        print(job.stdout.strip(), cluster.bed.number if cluster.bed else "", flush=True)
        time.sleep(600)
        """)
    started = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        job, *bed = started.stdout.readline().split()
        assert job.isdigit()
        deadline = time.monotonic() + 30
        while not any("sleep 300" in command_of(p) for p in _cluster_processes(root)):
            assert time.monotonic() < deadline, "the job never ran"
            time.sleep(0.2)
    finally:
        started.kill()
        started.wait()
        started.stdout.close()
    deadline = time.monotonic() + 60
    while _cluster_processes(root) or os.path.exists(root) or (bed and _bed_left(int(bed[0]))):
        assert time.monotonic() < deadline, [command_of(p) for p in _cluster_processes(root)] + _bed_left(int(bed[0]))
        time.sleep(0.2)
    assert bed or hosts.missing(), "where test hosts can be made, the cluster runs on them"


def test_a_folder_too_long_for_the_daemons_sockets_is_refused_before_anything_starts(tmp_path):
    parent = _root()
    root = os.path.join(parent, "x" * 80)
    try:
        SlurmCluster(root, nodes=2).start()
    except Exception as refusal:  # noqa: BLE001 - the refusal is what is checked
        said = str(refusal)
    else:
        raise AssertionError("a cluster whose sockets cannot be made was started")
    assert said.startswith(f"the cluster's folder {root} is too long a path for the Unix sockets") and \
        said.endswith("choose a shorter --root"), said
    assert not _cluster_processes(root) and not os.path.exists(root), "nothing made, nothing started"
    os.rmdir(parent)
