"""--backend slurm on a cluster whose nodes are test hosts (``mpi_magic.testing.hosts``), meeting the
faults real clusters have: a node lost mid-cell, a node cut off from the others, a slow link, and a
session that loses a node. Each test leaves node n2 as it was: its link mended and at full speed, its
slurmd started again where it was lost (as a node that rebooted)."""

from __future__ import annotations

import socket
import textwrap
import time

import pytest
from helpers import BUSY_CELL, SLURM_GONE_WITHIN, needs_hosts, needs_slurm, once, once_running, run, slurm_queue, \
    start_session, wait_until

from mpi_magic.errors import MpiMagicError, RankExitError

pytestmark = [needs_slurm(), needs_hosts()]

# every process of a node killed, the node still on the network: mpirun's connection to its daemon there
# ends at once, and its words name the node; a cell's mpirun runs here, in the allocation salloc holds, and
# a session's on the first node of its batch job
LOST = f"node n2 stopped answering mpirun on {socket.gethostname()} (lost, or cut off)"
SESSION_LOST = "node n2 stopped answering mpirun on n1 (lost, or cut off)"
# a node that goes silent (its link down, or the machine gone) is noticed by Slurm once it has not
# answered for SlurmdTimeout: mpirun's daemon and the ranks wait on
SILENT = "node n2 of the job failed (NODE_FAIL; Slurm's reason: Not responding)"


def _running_in(cluster, node: str) -> list[str]:
    """The command lines of what runs in ``node``'s host."""
    commands = []
    for pid in cluster.bed.pids(node):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                commands.append(f.read().replace(b"\0", b" ").decode().strip())
        except OSError:  # ended meanwhile
            continue
    return commands


def _left_in(cluster, node: str) -> list[str]:
    """What runs in ``node``'s host besides its slurmd: a job's step daemon, mpirun's daemon, ranks."""
    return [command for command in _running_in(cluster, node) if not command.startswith("slurmd ")]


@pytest.fixture
def faults(slurm, slurm_cluster):
    """The shell on the module's cluster; after the test, node n2 as it was, idle, and no job in the queue."""
    yield slurm
    bed = slurm_cluster.bed
    bed.mend("n2")
    if not any(command.startswith("slurmd ") for command in _running_in(slurm_cluster, "n2")):
        slurm_cluster.boot("n2")  # (it was lost: it reboots)
    idle = lambda: slurm_cluster.run("sinfo", "-h", "-N", "-p", "debug", "-o", "%t").stdout.split() == ["idle"] * 4  # noqa: E731
    assert wait_until(idle, 30), slurm_cluster.run("sinfo", "-N", "-o", "%N %t %E").stdout
    assert wait_until(lambda: slurm_queue(slurm_cluster) == [], SLURM_GONE_WITHIN), slurm_queue(slurm_cluster)


def _fault_mid_cell(ip, fault):
    """Run the busy cell on 2 nodes x 2 and do ``fault("n2")`` once it runs: (seconds from the fault
    until the cell ended, what it raised)."""
    done = {}

    def strike():
        fault("n2")
        done["at"] = time.monotonic()

    with once_running(ip, strike), pytest.raises(RankExitError) as raised:
        run(ip, "--backend slurm -i 2 -g 2 --out job", BUSY_CELL)
    return time.monotonic() - done["at"], raised


def test_a_node_lost_mid_cell_ends_the_cell_within_10s_naming_it_and_it_is_never_done(faults, slurm_cluster):
    """Open MPI 5's mpirun exits with status 0 when it loses a node: its own words name the node."""
    ended_after, raised = _fault_mid_cell(faults, slurm_cluster.bed.kill_all)
    job = faults.user_ns["job"]
    assert ended_after < 10, f"the cell ended {ended_after:.1f}s after n2 was lost"
    assert str(raised.value) == f"ranks [0, 1, 2, 3] stopped before the cell finished: {LOST}"
    assert job.status == "failed" and [r.host for r in job.ranks] == ["n1", "n1", "n2", "n2"]
    assert wait_until(lambda: _left_in(slurm_cluster, "n1") == [], 10), _left_in(slurm_cluster, "n1")


def test_a_node_cut_off_mid_cell_ends_the_cell_within_30s_naming_it_and_leaves_nothing_once_mended(
        faults, slurm_cluster):
    """Nobody in the job notices a link that went down (mpirun's daemon and the ranks wait on): Slurm
    does, once the node has not answered for SlurmdTimeout, and ends the job (NODE_FAIL)."""
    ended_after, raised = _fault_mid_cell(faults, slurm_cluster.bed.cut)
    assert ended_after < 30, f"the cell ended {ended_after:.1f}s after n2 was cut off"
    assert str(raised.value) == f"ranks [0, 1, 2, 3] stopped before the cell finished: {SILENT}"
    assert faults.user_ns["job"].status == "failed"
    assert _left_in(slurm_cluster, "n2"), "cut off, the job's processes there run on"
    slurm_cluster.bed.mend("n2")
    assert wait_until(lambda: _left_in(slurm_cluster, "n2") == [], 20), _left_in(slurm_cluster, "n2")


def test_a_cell_over_a_slow_link_completes_and_its_progress_stays_live(faults, slurm_cluster):
    """n2 sends at 20 Mbit/s: 20 allreduces of 256 KiB take seconds, and each step shows as it comes."""
    bed = slurm_cluster.bed
    bed.slow("n2", "20mbit")
    seen: dict[int, float] = {}  # rank 3's progress (on n2), when the notebook first showed it

    def watch():
        job = faults.user_ns.get("job")
        while job is None or job.status in ("queued", "running"):
            if job is not None and job.ranks and job.ranks[3].n is not None:
                seen.setdefault(job.ranks[3].n, time.monotonic())
            time.sleep(0.05)
            job = faults.user_ns.get("job")

    sent = bed.bytes_sent("n2")
    with once(lambda: True, watch, pause=0):
        run(faults, "--backend slurm -i 2 -g 2 --out job", textwrap.dedent("""\
            import numpy as np
            import mpi_magic
            from mpi4py import MPI
            data, total = np.ones(1 << 15), np.zeros(1 << 15)
            for step in mpi_magic.progress(range(20)):
                MPI.COMM_WORLD.Allreduce(data, total)
            """))
    assert faults.user_ns["job"].status == "completed"
    assert bed.bytes_sent("n2") - sent > 20 * (256 << 10)
    shown = sorted(seen)
    assert len([n for n in shown if 0 < n < 20]) >= 10, f"rank 3's steps as shown while it ran: {shown}"
    # each step sends at least its 256 KiB out of n2, at 2.5 MB/s (the first step waits for MPI's connections too)
    first = min(n for n in shown if n >= 1)  # the notebook may show step 2 first: it looks every 50 ms
    steps = shown[-1] - first
    assert seen[shown[-1]] - seen[first] > 0.8 * steps * (256 << 10) / 2.5e6, "the link was not slowed"
    times = sorted(at for n, at in seen.items() if n >= 1)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert max(gaps) < 3, f"the longest wait for rank 3's next step to show: {max(gaps):.1f}s"


def test_a_session_that_loses_a_node_under_a_cell_ends_with_a_sentence_naming_it(faults, sessions, slurm_cluster):
    s = start_session(faults, "--backend slurm -i 2 -g 2")
    with once(lambda: s.status == "running", lambda: slurm_cluster.bed.kill_all("n2"), pause=1), \
            pytest.raises(MpiMagicError) as raised:
        run(faults, "--quiet", BUSY_CELL)
    assert s.status == "stopped" and s.ended_reason == SESSION_LOST
    assert f"session {s.name} ended: {SESSION_LOST}; every rank was stopped" in str(raised.value)
    assert wait_until(lambda: _left_in(slurm_cluster, "n1") == [], 10), _left_in(slurm_cluster, "n1")


def test_a_session_that_loses_a_node_between_cells_says_so_at_the_next_cell(faults, sessions, slurm_cluster, capsys):
    s = start_session(faults, "--backend slurm -i 2 -g 2")
    run(faults, "--quiet", "kept = 1")
    slurm_cluster.bed.kill_all("n2")
    assert wait_until(lambda: s.status == "stopped", 20), s.status
    capsys.readouterr()
    run(faults, "--backend slurm -i 1 -g 2 --quiet", "kept = 2")  # (as a one-off job)
    said = capsys.readouterr()
    assert f"session {s.name} ended ({SESSION_LOST}); this cell runs as a one-off job" in said.out + said.err
    assert faults.user_ns["kept"] == 2
    assert wait_until(lambda: _left_in(slurm_cluster, "n1") == [], 10), _left_in(slurm_cluster, "n1")
