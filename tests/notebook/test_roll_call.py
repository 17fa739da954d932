"""Where every rank is: the roll-call a quiet job takes by itself, on Ctrl-C, on request
(%mpirun_stacks, job.stacks()), for one-off jobs and sessions, through real mpirun."""

from __future__ import annotations

import _thread
import time

import pytest
from helpers import once, remote_cell, run, start_session
from IPython.core.error import UsageError

from mpi_magic.view.summary import Summary

DEADLOCK = (  # as the cell shows it, the magic line being line 1
    "from mpi4py import MPI\n"       # 2
    "import time\n"                  # 3
    "comm = MPI.COMM_WORLD\n"        # 4
    "if comm.rank == 2:\n"           # 5
    "    time.sleep(60)\n"           # 6
    "else:\n"                        # 7
    "    comm.allreduce(1)\n"        # 8
)
WHERE = "ranks 0, 1 at cell line 8 in allreduce; rank 2 at cell line 6 in sleep"


def _in_cell(job, frames, limit: float = 30.0) -> dict:
    """job.stacks() once each rank's innermost frames are ``frames`` (the ranks first load the
    cell's values, then run it)."""
    deadline = time.monotonic() + limit
    while True:
        stacks = job.stacks()
        if all(stacks.get(state.rank, [])[-len(frames):] == frames[state.rank] for state in job.ranks
               if state.rank in frames) or time.monotonic() > deadline:
            return stacks
        time.sleep(0.5)  # (a roll-call at a person's pace: each one signals every rank)


def test_a_quiet_job_takes_its_roll_call_by_itself_and_an_interrupt_says_where_the_ranks_were(ip, capsys):
    ip.run_line_magic("mpirun_config", "stall_after=1 view=text")
    def taken() -> bool:  # (on a loaded machine a roll-call may come before the ranks started: the next one counts)
        job = ip.user_ns.get("job")
        return bool(job and job.model.roll_call and WHERE in job.model.roll_call)

    with once(taken, _thread.interrupt_main), pytest.raises(KeyboardInterrupt):
        run(ip, "-g 3 --out job", DEADLOCK)
    job = ip.user_ns["job"]
    err = capsys.readouterr().err
    assert f"mpi_magic: where the ranks are: {WHERE}\n" in err, "the stall's roll-call, in the text lines"
    assert f"where the ranks were: {WHERE}\n" in err, "the interrupt's, before the job is stopped"
    assert err.index("where the ranks were") < err.index("interrupted: stopping job")
    assert job.status == "stopped"
    assert f"where the ranks were: {WHERE}" in repr(Summary(job.model))
    assert f"<div class='mpi-magic-roll-call'>where the ranks were: {WHERE}</div>" in Summary(job.model)._repr_html_()


IN_C_CALLS = (  # C calls that return early when a signal interrupts them: libc does not retry them
    "import ctypes, time\n"                                          # 2
    "libc = ctypes.CDLL(None)\n"                                     # 3
    "began = time.monotonic()\n"                                     # 4
    "left = libc.sleep(2)\n"                                         # 5: the seconds left, 0 once slept
    "slept = time.monotonic() - began\n"                             # 6
    "began = time.monotonic()\n"                                     # 7
    "polled = libc.poll(None, 0, 2000)\n"                            # 8: -1 (EINTR) once interrupted
    "waited = time.monotonic() - began\n"                            # 9
    "outcome = (left, slept >= 2.0, polled, waited >= 2.0)\n"        # 10
    "del libc\n"                                                     # 11: (a library handle does not pickle)
)


def test_roll_calls_taken_again_and_again_leave_ranks_in_c_calls_that_do_not_retry_to_finish_them(ip):
    run(ip, "-g 2 --async --quiet --gather --out job", IN_C_CALLS)
    job = ip.user_ns["job"]
    seen = set()
    try:
        while job.status == "running":
            seen.add(str(job.roll_call(limit=1.0)))
            time.sleep(0.1)
    finally:
        job.wait(60)
    assert "ranks 0, 1 at cell line 5 in sleep" in seen and "ranks 0, 1 at cell line 8 in poll" in seen, seen
    assert ip.user_ns["outcome"] == [(0, True, 0, True)] * 2, "each call took its full time, however often asked"
    with pytest.raises(UsageError, match=rf"job {job.name} has completed: its ranks have ended \(asked at [0-9.]+s: "
                                         r".*; then completed\)"):
        ip.run_line_magic("mpirun_stacks", "job")


def test_a_job_that_keeps_reporting_takes_no_roll_call(ip, capsys):
    ip.run_line_magic("mpirun_config", "stall_after=1 view=text")
    run(ip, "-g 2 --out job", "import time\nfor i in range(6):\n    print(i, flush=True)\n    time.sleep(0.4)\n")
    assert ip.user_ns["job"].model.roll_call == ""
    assert "where the ranks" not in capsys.readouterr().err


def test_job_stacks_and_mpirun_stacks_show_a_background_jobs_ranks_in_the_cells_lines(ip, capsys):
    run(ip, "-g 2 --async --quiet --out job", (
        "import time\n"                 # 2
        "def settle():\n"               # 3
        "    time.sleep(60)\n"          # 4
        "settle()\n"                    # 5
    ))
    job = ip.user_ns["job"]
    try:
        stacks = _in_cell(job, dict.fromkeys([0, 1], [("<cell>", 5, "<module>"), ("<cell>", 4, "settle")]))
        assert sorted(stacks) == [0, 1]
        for frames in stacks.values():
            assert frames[-2:] == [("<cell>", 5, "<module>"), ("<cell>", 4, "settle")], "innermost last, as the cell shows"
            assert all(isinstance(line, int) and filename and function for filename, line, function in frames)
        ip.run_line_magic("mpirun_stacks", "--frames")
        out = capsys.readouterr().out.splitlines()
        assert out[0].startswith(f"job {job.name} (local, 1 x 2) running ")
        assert out[1:] == ["  ranks 0, 1 at cell line 4 in sleep", "      cell line 5 in <module>: settle()",
                           "      cell line 4 in settle: time.sleep(60)"]
        assert job.model.roll_call == "ranks 0, 1 at cell line 4 in sleep", "the dashboard shows the latest"
    finally:
        job.cancel()
        with pytest.raises(Exception, match="cancelled"):
            job.wait()
    with pytest.raises(UsageError, match=f"job {job.name} has stopped: its ranks have ended"):
        ip.run_line_magic("mpirun_stacks", "job")


def test_a_rank_inside_a_function_from_an_earlier_cell_is_shown_in_that_cells_words(ip, capsys):
    assert ip.run_cell("import time\ndef settle():\n    time.sleep(60)\n", store_history=True).success
    cell_name = f"Cell In[{ip.execution_count - 1}]"
    filename = ip.user_ns["settle"].__code__.co_filename  # the notebook's own, which its linecache reads
    run(ip, "-g 2 --async --quiet --out job", "settle()\n")
    job = ip.user_ns["job"]
    try:
        stacks = _in_cell(job, dict.fromkeys([0, 1], [("<cell>", 2, "<module>"), (filename, 3, "settle")]))
        assert all(frames[-2:] == [("<cell>", 2, "<module>"), (filename, 3, "settle")] for frames in stacks.values())
        ip.run_line_magic("mpirun_stacks", "--frames")
        assert capsys.readouterr().out.splitlines()[1:] == [
            f"  ranks 0, 1 at {cell_name}, line 3 in sleep", "      cell line 2 in <module>: settle()",
            f"      {cell_name}, line 3 in settle: time.sleep(60)"]
    finally:
        job.cancel()
        with pytest.raises(Exception, match="cancelled"):
            job.wait()


def test_a_rank_that_is_stopped_or_has_finished_is_named_and_the_others_answer(ip):
    import os
    import signal

    run(ip, "-g 3 --async --quiet --out job", (
        "import mpi_magic, os, signal, time\n"                                     # 2
        "if mpi_magic.rank() == 1:\n"                                              # 3
        "    os.kill(os.getpid(), signal.SIGSTOP)\n"                               # 4: as a debugger stops it
        "if mpi_magic.rank() != 2:\n"                                              # 5
        "    time.sleep(60)\n"                                                     # 6
    ))
    job = ip.user_ns["job"]
    _in_cell(job, {0: [("<cell>", 6, "<module>")]})  # rank 1 then is stopped, rank 2 ends
    deadline = time.monotonic() + 30
    while (job.ranks[2].status != "completed" or 1 in job.stacks(limit=0.5)) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        started = time.monotonic()
        where = str(job.roll_call(limit=1.0))
        took = time.monotonic() - started
    finally:
        os.kill(job.ranks[1].pid, signal.SIGCONT)
        job.cancel()
        with pytest.raises(Exception, match="cancelled"):
            job.wait()
    assert where == ("rank 0 at cell line 6 in sleep; rank 1 gave no stack: it did not answer within 1s; "
                     "rank 2 gave no stack: it has completed")
    assert took < 2.5


def test_a_sessions_quiet_cell_takes_its_roll_call_and_idle_ranks_wait_for_a_cell(sessions, capsys):
    ip = sessions
    ip.run_line_magic("mpirun_config", "stall_after=1 view=text")
    start_session(ip, "-g 2")
    run(ip, "--out job", "from mpi4py import MPI\nimport time\nif MPI.COMM_WORLD.rank == 1:\n    time.sleep(2.5)\n"
                          "MPI.COMM_WORLD.barrier()\n")
    assert ip.user_ns["job"].model.roll_call == "rank 0 at cell line 6 in barrier; rank 1 at cell line 5 in sleep"
    expected = [f"session {ip.user_ns['s'].name} (local, 2 ranks) idle", "  ranks 0, 1 waiting for a cell"]
    deadline = time.monotonic() + 10  # a rank may still be writing its last event on a loaded machine
    while True:
        capsys.readouterr()
        ip.run_line_magic("mpirun_stacks", "")
        out = capsys.readouterr().out.splitlines()
        if out == expected or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert out == expected
    ip.run_line_magic("mpirun_session", "stop")
    with pytest.raises(UsageError, match="no job of this notebook is running and no session is up"):
        ip.run_line_magic("mpirun_stacks", "")


def test_a_rank_inside_a_function_from_an_earlier_session_cell_is_placed_in_that_cells_words(sessions):
    ip = sessions
    ip.run_line_magic("mpirun_config", "stall_after=1 view=text")
    start_session(ip, "-g 2")
    defining, error = remote_cell(ip, "--quiet", "import time\ndef settle(seconds):\n    time.sleep(seconds)\n")
    assert error is None
    _, error = remote_cell(ip, "--out job", ("from mpi4py import MPI\n"
                                             "settle(2.5 if MPI.COMM_WORLD.rank == 1 else 0)\n"
                                             "MPI.COMM_WORLD.barrier()\n"))
    assert error is None
    assert ip.user_ns["job"].model.roll_call == f"rank 0 at cell line 4 in barrier; rank 1 at {defining}, line 4 in sleep"


def test_mpirun_stacks_refuses_what_is_not_a_handle(ip):
    ip.user_ns["x"] = 3
    with pytest.raises(UsageError, match="x is not a job or session handle; store one with --out x"):
        ip.run_line_magic("mpirun_stacks", "x")
    with pytest.raises(UsageError, match=r"usage: %mpirun_stacks \[NAME\] \[--frames\]"):
        ip.run_line_magic("mpirun_stacks", "--frame")
