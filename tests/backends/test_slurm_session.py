"""Slurm sessions against the real Slurm cluster on this machine: one allocation whose ranks keep
their state between cells, interrupted and stopped from the notebook, leaving nothing in ``squeue``
(what every backend's sessions do is in ``tests/backends/contract``)."""

from __future__ import annotations

import _thread
import os
import subprocess
import sys
import time

import pytest
from helpers import (SLURM_GONE_WITHIN, needs_hosts, needs_slurm, node_down, once, ranks_running, run, slurm_queue,
                     wait_until)
from IPython.core.error import UsageError

from mpi_magic.errors import JobError

pytestmark = needs_slurm()

def test_a_session_is_one_allocation_whose_ranks_keep_state_between_cells(slurm, sessions, slurm_cluster, capsys):
    slurm.run_line_magic("mpirun_session", "start --backend slurm -i 2 -g 2 --time 30 --out s")
    session = slurm.user_ns["s"]
    assert [line.split()[2] for line in slurm_queue(slurm_cluster)] == ["RUNNING"]  # one job holds the allocation
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
    assert wait_until(lambda: slurm_queue(slurm_cluster) == [], SLURM_GONE_WITHIN), slurm_queue(slurm_cluster)


def test_a_cell_asking_for_another_partition_time_or_account_is_refused_before_anything_is_sent(
        slurm, sessions, slurm_cluster, cache_dir):
    slurm.run_line_magic("mpirun_session", "start --backend slurm -i 1 -g 2 --time 5 --out s")
    session = slurm.user_ns["s"]
    queued, folders = slurm_queue(slurm_cluster), sorted(os.listdir(os.path.join(cache_dir, "jobs")))
    slurm.user_ns["sent"] = 21
    for line, asked, own in [("--partition short", "--partition short", "the default --partition"),
                             ("--time 3", "--time 3", "--time 5"),
                             ("--backend slurm --account other", "--account other", "the default --account")]:
        with pytest.raises(UsageError) as refused:
            run(slurm, line, "ran = sent * 2")
        assert str(refused.value) == (f"this cell asks for {asked}, but session {session.name} runs 1 x 2 ranks on "
                                      f"slurm with {own}: run it as a one-off job with --no-session, or "
                                      "%mpirun_session stop and start one that fits")
    assert "ran" not in slurm.user_ns and (session.cells, session.bytes_sent) == (0, 0)
    assert slurm_queue(slurm_cluster) == queued and sorted(os.listdir(os.path.join(cache_dir, "jobs"))) == folders
    run(slurm, "--time 5 --quiet", "ran = sent * 2")  # the session's own value is fine
    assert slurm.user_ns["ran"] == 42 and session.cells == 1 and slurm_queue(slurm_cluster) == queued
    slurm.run_line_magic("mpirun_session", "stop")


def test_a_budget_is_refused_before_anything_is_submitted_as_slurm_has_no_price(slurm, sessions, slurm_cluster):
    with pytest.raises(UsageError) as refused:
        slurm.run_line_magic("mpirun_session", "start --backend slurm -i 2 -g 1 --max-cost 5")
    assert str(refused.value) == ("--max-cost $5.00 cannot be kept: a Slurm cluster charges its accounts in units of "
                                  "its own, which the meter does not know (--time bounds a job, and the account's "
                                  "limits what it may spend); drop it")
    assert slurm_queue(slurm_cluster) == [] and sessions.magics_manager.registry["MpiMagics"].session is None


def test_a_failed_node_ends_the_session_naming_it_and_the_allocation_never_runs_again(slurm, sessions, slurm_cluster):
    slurm.run_line_magic("mpirun_session", "start --backend slurm -i 2 -g 1 --out s")
    session = slurm.user_ns["s"]
    with node_down(slurm_cluster, "n2", "disk on fire", lambda: session.status == "running"), \
            pytest.raises(JobError) as raised:
        run(slurm, "--quiet", "import time\ntime.sleep(300)")
    assert "node n2 of the job failed (NODE_FAIL; Slurm's reason: disk on fire)" in str(raised.value)
    assert session.status == "stopped" and "node n2" in session.ended_reason
    assert wait_until(lambda: slurm_queue(slurm_cluster) == [], SLURM_GONE_WITHIN), slurm_queue(slurm_cluster)


def test_an_interrupt_reaches_the_ranks_still_in_a_cell_rank_0_has_left(slurm, sessions):
    """Rank 0 waits for the next cell on the channel while the others still run this one: the
    interrupt that comes then is passed on to them, not taken for a cell."""
    slurm.run_line_magic("mpirun_session", "start --backend slurm -i 2 -g 2 --out s")
    session = slurm.user_ns["s"]
    with once(lambda: session.status == "running", _thread.interrupt_main, pause=2.0), pytest.raises(KeyboardInterrupt):
        run(slurm, "--quiet", "import time, mpi_magic\nif mpi_magic.rank() != 0:\n    time.sleep(300)")
    run(slurm, "--quiet", "back = 1")
    assert slurm.user_ns["back"] == 1 and session.status == "idle", session.ended_reason
    slurm.run_line_magic("mpirun_session", "stop")


@needs_hosts()
@pytest.mark.parametrize("etc_hosts, name", [
    ("127.0.0.1 localhost\n127.0.0.1 nb\n", "nb"),  # getfqdn() says "localhost": a name of every machine
    ("127.0.0.1 localhost\n10.1.2.3 nb.cluster.example nb\n", "nb.cluster.example"),
    ("127.0.0.1 localhost\n127.0.1.1 nb.cluster.example nb\n", "nb.cluster.example"),  # (Debian's own line)
], ids=["name-on-loopback", "fqdn", "fqdn-on-127.0.1.1"])
def test_a_session_tells_rank_0_this_machines_own_name_never_localhost(tmp_path, etc_hosts, name):
    """Where this machine's name shares 127.0.0.1 with localhost in /etc/hosts, its fully qualified name
    is "localhost", which on a node names the node: the machine's own name is told instead."""
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text(etc_hosts)
    shown = subprocess.run(
        ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c",
         'mount --bind "$0" /etc/hosts && hostname nb && exec "$1" -c "$2"', str(hosts_file), sys.executable,
         "from mpi_magic.backends.channel_ranks import this_host; print(this_host())"],
        capture_output=True, text=True, timeout=60)
    assert (shown.returncode, shown.stdout, shown.stderr) == (0, f"{name}\n", "")


def test_a_running_cells_ranks_answer_where_they_are_when_asked_from_another_thread(slurm, sessions):
    """Through Slurm (``scancel --signal``), as a one-off job's are asked: the notebook cannot signal
    ranks on the nodes itself; the answers come with the cell's events, which the follower folds."""
    slurm.run_line_magic("mpirun_session", "start --backend slurm -i 2 -g 1 --out s")
    seen = []
    with once(lambda: ranks_running(slurm), lambda: seen.append(str(slurm.user_ns["job"].roll_call(limit=15)))):
        run(slurm, "--quiet --out job", "import time\ntime.sleep(10)\n")  # (asked from another thread meanwhile)
    assert seen == ["ranks 0, 1 at cell line 3 in sleep"]
