"""Stack dumps on request: real processes answer the signal, and the roll-call groups them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

from mpi_magic.shared import envvars, stacks

RANK_SCRIPT = textwrap.dedent("""
    import os, sys, threading, time
    from mpi_magic.shared import stacks
    stacks.install(int(sys.argv[1]))

    def helper_thread():
        time.sleep(60)

    def deep(n):
        return deep(n - 1) + 1 if n else 0

    def running_python():  # frames made and freed without end, and threads that come and go
        while True:
            deep(200)
            thread = threading.Thread(target=deep, args=(50,))
            thread.start()
            thread.join()

    def blocked_in_c():
        print("ready", flush=True)
        time.sleep(60)  # in C with the GIL released, as a rank inside MPI_Allreduce is

    def blocked_in_c_holding_the_gil():
        import ctypes
        print("ready", flush=True)
        ctypes.PyDLL(None).sleep(60)  # as a rank inside mpi4py's comm.allreduce (lower case) is

    if sys.argv[2] == "busy threads":
        for _ in range(2):
            threading.Thread(target=running_python, daemon=True).start()
    threading.Thread(target=helper_thread, daemon=True).start()
    if sys.argv[2] == "holding the GIL":
        blocked_in_c_holding_the_gil()
    if sys.argv[2] == "then holding the GIL":
        print("ready", flush=True)
        time.sleep(0.6)  # asked here, then
        blocked_in_c_holding_the_gil()
    blocked_in_c()
""")


def _rank(tmp_path, rank: int, behaviour: str = "answer") -> subprocess.Popen:
    env = dict(os.environ, **{envvars.STACKS_DIR: str(tmp_path)})
    process = subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, str(rank), behaviour], env=env,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "ready\n"
    time.sleep(0.2)  # from the print into the sleep
    return process


def _end(process: subprocess.Popen) -> None:
    process.kill()
    process.communicate()


def test_a_process_blocked_in_c_answers_with_its_main_threads_frames_innermost_last(tmp_path):
    process = _rank(tmp_path, 0)
    try:
        found, missing = stacks.request(str(tmp_path), {0: process.pid})
        again, _ = stacks.request(str(tmp_path), {0: process.pid})
    finally:
        _end(process)
    assert missing == {}
    functions = [function for _, _, function in found[0]]
    assert functions == ["<module>", "blocked_in_c"], "the main thread only, not the helper thread"
    assert found[0][-1][0] == "<string>" and isinstance(found[0][-1][1], int)
    assert again == found, "a second request reads the second dump, not the first again"


def test_a_rank_whose_threads_run_python_while_it_is_asked_answers_every_time_and_lives_on(tmp_path):
    """Its stacks are read holding the GIL: read without it, the frames a running thread frees
    meanwhile are read, and the rank dies of SIGSEGV (within a few asks)."""
    process = _rank(tmp_path, 0, "busy threads")
    answers = []
    try:
        for _ in range(40):
            found, missing = stacks.request(str(tmp_path), {0: process.pid})
            assert process.poll() is None, f"the rank died of signal {-process.returncode} when asked"
            assert missing == {}
            answers.append([function for _, _, function in found[0]])
    finally:
        _end(process)
    assert answers == [["<module>", "blocked_in_c"]] * 40


def test_a_rank_blocked_in_c_holding_the_gil_answers_when_asked_the_second_way(tmp_path):
    process = _rank(tmp_path, 0, "holding the GIL")
    try:
        started = time.monotonic()
        found, missing = stacks.request(str(tmp_path), {0: process.pid})
        took = time.monotonic() - started
    finally:
        _end(process)
    assert missing == {}
    assert [function for _, _, function in found[0]] == ["<module>", "blocked_in_c_holding_the_gil"]
    assert stacks.FALLBACK_AFTER <= took < stacks.ANSWER_LIMIT


def test_a_rank_that_answered_and_then_went_into_c_holding_the_gil_answers_again(tmp_path):
    process = _rank(tmp_path, 0, "then holding the GIL")  # (asked 0.2 s into its 0.6 s sleep)
    try:
        first, _ = stacks.request(str(tmp_path), {0: process.pid})
        assert process.stdout.readline() == "ready\n"  # inside the call that holds the GIL
        time.sleep(0.2)
        second, missing = stacks.request(str(tmp_path), {0: process.pid})
    finally:
        _end(process)
    assert [function for _, _, function in first[0]] == ["<module>"]
    assert missing == {}
    assert [function for _, _, function in second[0]] == ["<module>", "blocked_in_c_holding_the_gil"]


def test_ranks_that_cannot_answer_have_ended_or_never_set_up_are_named_within_the_limit(tmp_path):
    import signal

    answering, stopped = _rank(tmp_path, 0), _rank(tmp_path, 1)
    os.kill(stopped.pid, signal.SIGSTOP)
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    open(stacks.dump_path(str(tmp_path), 2), "w").close()  # it set up its dump before it ended
    try:
        started = time.monotonic()
        found, missing = stacks.request(str(tmp_path), {0: answering.pid, 1: stopped.pid, 2: ended.pid, 3: os.getpid()},
                                        limit=1.0)
        took = time.monotonic() - started
    finally:
        for process in (answering, stopped):
            _end(process)
    assert list(found) == [0]
    assert missing == {1: "it did not answer within 1s", 2: "its process has ended",
                       3: "it has not set up its stack dump (still starting?)"}
    assert took < 2.0, "the others' answer does not wait for a silent rank longer than the limit"


def test_the_roll_call_groups_ranks_by_the_cell_line_and_names_the_call_running_there():
    cell_lines = ["%%mpirun_remote -g 5", "from mpi4py import MPI", "def settle(comm):", "    time.sleep(1)",
                  "comm = MPI.COMM_WORLD", "x = 1", "total = comm.allreduce(x)"]
    runtime = [("/site/mpi_magic/runtime/rank.py", 219, "_run")]
    at_allreduce = runtime + [("<cell>", 7, "<module>")]
    in_helper = runtime + [("<cell>", 7, "<module>"), ("<cell>", 4, "settle")]
    in_library = runtime + [("<cell>", 6, "<module>"), ("/site/numpy/core/fromnumeric.py", 86, "_wrapreduction")]
    snapshot = stacks.Snapshot({0: at_allreduce, 1: at_allreduce, 2: in_helper, 3: at_allreduce, 5: in_library},
                               {4: "its process has ended"}, "<cell>", cell_lines)
    assert str(snapshot) == ("ranks 0, 1, 3 at cell line 7 in allreduce; rank 2 at cell line 4 in sleep; "
                             "rank 5 at cell line 6 in _wrapreduction; rank 4 gave no stack: its process has ended")
    assert snapshot.lines(frames=True)[:4] == [
        "ranks 0, 1, 3 at cell line 7 in allreduce", "    cell line 7 in <module>: total = comm.allreduce(x)",
        "rank 2 at cell line 4 in sleep", "    cell line 7 in <module>: total = comm.allreduce(x)"]
    assert snapshot.lines(frames=True)[4] == "    cell line 4 in settle: time.sleep(1)"


def test_a_rank_that_answered_and_then_ended_is_where_it_answered_and_named_once():
    """The order that races: rank 2 answers, then ends before the roll-call reads the ranks'
    states (the job's events are folded meanwhile), so it is found and also has completed."""
    in_sleep = [("/site/mpi_magic/runtime/rank.py", 219, "_run"), ("<cell>", 7, "<module>")]
    snapshot = stacks.Snapshot({0: in_sleep, 2: in_sleep}, {1: "its process has ended", 2: "it has completed"},
                               "<cell>", ["", "", "", "", "", "", "time.sleep(5)"])
    assert str(snapshot) == "ranks 0, 2 at cell line 7 in sleep; rank 1 gave no stack: its process has ended"
    assert snapshot.missing == {1: "its process has ended"}


def test_a_rank_outside_the_cell_is_placed_by_its_innermost_frame_and_a_session_rank_waits_for_a_cell():
    starting = [("/site/mpi_magic/runtime/rank.py", 150, "start_up"), ("/site/mpi4py/__init__.py", 3, "<module>")]
    idle = [("/site/mpi_magic/runtime/cell_loop.py", 55, "main"), ("/site/mpi_magic/runtime/cell_loop.py", 274,
            stacks.WAITING_FOR_CELL), ("/site/mpi_magic/shared/channel.py", 122, "receive")]
    assert str(stacks.Snapshot({0: starting, 1: idle, 2: []}, {}, "<cell>", [])) == (
        "rank 0 at __init__.py:3 in <module>; rank 1 waiting for a cell; rank 2 in no Python frame")


def test_a_dump_names_the_main_thread_by_its_header_and_parses_faulthandlers_format():
    dump = ('Thread 0x00007f0000000001 (most recent call first):\n'
            '  File "/lib/threading.py", line 320 in wait\n'
            '\n'
            'Current thread 0x00007f0000000002 (most recent call first):\n'
            '  File "<cell>", line 8 in <module>\n'
            '  File "/site/mpi_magic/runtime/rank.py", line 219 in _run\n')
    assert stacks.parse(dump, "0x00007f0000000002") == [("/site/mpi_magic/runtime/rank.py", 219, "_run"),
                                                         ("<cell>", 8, "<module>")]
    assert stacks.parse(dump, None) == [("/lib/threading.py", 320, "wait")], "without a header: the first thread"
    assert stacks.parse("", None) == []


SENDING_RANK = textwrap.dedent("""
    import ctypes, os, sys, time
    from mpi_magic.shared import stacks
    stacks.install(1, "0123456789abcdef")
    worker = os.fork()  # a data loader's worker, say: it must not answer for the rank
    if worker == 0:
        time.sleep(60)
        os._exit(0)
    print(worker, flush=True)

    def blocked_in_c():
        return ctypes.CDLL(None).sleep(2)  # libc's: it returns the seconds left when a handler interrupts it

    print(blocked_in_c(), flush=True)
    time.sleep(60)
""")


def test_a_rank_asked_through_its_process_group_answers_once_on_stderr_and_its_sender_ends_with_it(tmp_path):
    import signal

    import psutil

    from mpi_magic.shared.events import RankStacks, StreamDecoder

    env = dict(os.environ, **{envvars.STACKS_EVENTS: "1"})
    env.pop(envvars.STACKS_DIR, None)
    rank = subprocess.Popen([sys.executable, "-c", SENDING_RANK], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    worker = int(rank.stdout.readline())
    sender = [child.pid for child in psutil.Process(rank.pid).children() if child.pid != worker]
    err: list[bytes] = []
    reader = threading.Thread(target=lambda: err.extend(iter(rank.stderr.readline, b"")))  # as mpirun reads it
    reader.start()
    try:
        time.sleep(0.3)  # from the print into the sleep
        for _ in range(2):
            os.killpg(rank.pid, getattr(signal, stacks.SIGNAL_NAME))  # as Open MPI may signal a rank's group
            time.sleep(0.5)
        left = rank.stdout.readline()
    finally:
        os.killpg(rank.pid, signal.SIGKILL)
        rank.communicate()
        reader.join()
    decoder = StreamDecoder("0123456789abcdef")
    answers = [event for line in err for event in decoder.feed(f"[1,1]<stderr>: {line.decode()}")]
    assert [type(event) for event in answers] == [RankStacks, RankStacks], err
    assert [function for _, _, function in answers[0].frames] == ["<module>", "blocked_in_c"]
    assert answers[1].frames == answers[0].frames, "one dump each time, not the worker's as well"
    assert left == b"0\n", "the rank slept its full time: answering interrupted nothing of its own"
    assert len(sender) == 1
    deadline = time.monotonic() + 5
    while psutil.pid_exists(sender[0]) and psutil.Process(sender[0]).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the sender outlived its rank"
        time.sleep(0.05)
