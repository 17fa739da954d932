"""Sessions over the real local backend: ranks kept up between cells, values sent once, state
kept through failures and interrupts that every rank gets back from, torn down when one cannot."""

from __future__ import annotations

import _thread
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import psutil
import pytest
from helpers import once, run, start_session
from IPython.core.error import UsageError

from mpi_magic.shared.channel import SocketChannel, SocketRankEnd
from mpi_magic.errors import JobTimeoutError, RemoteRankError, SessionStartError


def _dead(pids) -> bool:
    return all(not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE for p in pids)


def _wait_dead(pids, limit: float = 15.0) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if _dead(pids):
            return True
        time.sleep(0.05)
    return False


def test_the_ranks_keep_their_globals_across_cells(sessions):
    ip = sessions
    s = start_session(ip)
    assert (s.status, s.world_size, s.cells) == ("idle", 4, 0)
    assert len({r.pid for r in s.ranks}) == 4 and all(r.status == "idle" and r.host for r in s.ranks)
    pids = [r.pid for r in s.ranks]
    run(ip, "--quiet", "import mpi_magic, os\ncounter = 10 * mpi_magic.rank()\npid = os.getpid()")
    run(ip, "--quiet", "counter += 1")
    run(ip, "--quiet --gather", "seen = (counter, os.getpid())")
    assert ip.user_ns["seen"] == [(1, pids[0]), (11, pids[1]), (21, pids[2]), (31, pids[3])]
    assert s.cells == 3 and [r.pid for r in s.ranks] == pids, "the same processes ran every cell"
    s.stop()
    assert s.status == "stopped" and _wait_dead(pids)


def test_an_unchanged_value_crosses_once_and_a_changed_one_again(sessions):
    ip = sessions
    s = start_session(ip)
    ip.user_ns["a"] = np.arange(5_000_000, dtype=np.float64)  # 40 MB
    run(ip, "--quiet", "first = float(a.sum())")
    sent = s.bytes_sent
    assert sent >= 40_000_000 and ip.user_ns["first"] == float(ip.user_ns["a"].sum())
    run(ip, "--quiet", "second = float(a[:10].sum())")
    assert s.bytes_sent == sent, "the same object, no other code since: not sent again"
    ip.run_cell("unrelated = 1")  # other code ran: the content is checked, and found the same
    run(ip, "--quiet", "third = float(a[-1])")
    assert s.bytes_sent == sent and ip.user_ns["third"] == 4_999_999.0
    ip.run_cell("a[-1] = -1.0")  # changed in place: the same object, other content
    run(ip, "--quiet", "fourth = float(a[-1])")
    assert ip.user_ns["fourth"] == -1.0 and s.bytes_sent >= 2 * sent
    ip.run_cell("import numpy as np\na = np.ones(3)")
    run(ip, "--quiet", "fifth = float(a.sum())")
    assert ip.user_ns["fifth"] == 3.0


def test_a_value_that_came_back_never_overwrites_the_ranks_copy(sessions):
    ip = sessions
    start_session(ip)
    run(ip, "--quiet", "model = [0]")
    run(ip, "--quiet", "model.append(1)")  # changed on the ranks only: the notebook's copy is stale
    assert ip.user_ns["model"] == [0]
    run(ip, "--quiet --gather", "n = len(model)")
    assert ip.user_ns["n"] == [2, 2, 2, 2]
    ip.run_cell("model = [7, 7, 7]")  # rebound in the notebook: this one is sent
    run(ip, "--quiet --gather", "n = len(model)")
    assert ip.user_ns["n"] == [3, 3, 3, 3]


def test_values_too_big_or_unpicklable_stay_on_the_ranks_and_say_so_once(sessions, capsys):
    ip = sessions
    ip.run_line_magic("mpirun_config", "return_limit=100000")
    start_session(ip)
    run(ip, "--quiet", "import numpy as np, threading\nbig = np.zeros(50_000)\nlock = threading.Lock()\nsmall = 1")
    err = capsys.readouterr().err
    assert re.search(r"big stayed on the ranks: ndarray, 390\.\d KiB, more than the 97\.7 KiB return_limit", err)
    assert "lock stayed on the ranks: lock: TypeError" in err
    assert "big" not in ip.user_ns and "lock" not in ip.user_ns and ip.user_ns["small"] == 1
    run(ip, "--quiet", "big[0] = 5\nwith lock:\n    size = big.size + big[0]")
    assert ip.user_ns["size"] == 50_005
    run(ip, "--quiet", "big = np.ones(60_000)")
    assert "stayed on the ranks" not in capsys.readouterr().err, "said once per name"


def test_a_failure_every_rank_gets_back_from_keeps_the_session(sessions):
    ip = sessions
    s = start_session(ip)
    run(ip, "--quiet", "import mpi_magic\nkept = 'state'")
    with pytest.raises(RemoteRankError) as raised:
        run(ip, "--quiet", "if mpi_magic.rank() == 1:\n    raise ValueError('bad input on 1')\nother = 1")
    assert raised.value.failures[0].rank == 1 and "bad input on 1" in str(raised.value)
    assert s.status == "idle"
    run(ip, "--quiet --gather", "still = kept")
    assert ip.user_ns["still"] == ["state"] * 4


def test_a_rank_stuck_in_a_collective_after_a_failure_tears_the_session_down(sessions, capsys):
    ip = sessions
    ip.run_line_magic("mpirun_config", "session_grace=1")
    s = start_session(ip)
    pids = [r.pid for r in s.ranks]
    with pytest.raises(RemoteRankError):
        run(ip, "--quiet", (
            "import mpi_magic\nfrom mpi4py import MPI\n"
            "if mpi_magic.rank() == 1:\n    raise ValueError('rank 1 gives up')\n"
            "MPI.COMM_WORLD.barrier()\n"  # the others wait for rank 1 forever
        ))
    assert s.status == "stopped" and "did not get back to waiting within 1s after rank 1 failed" in s.ended_reason
    err = capsys.readouterr().err
    assert "the session's state is gone (the next cell runs as a one-off job" in err
    assert _wait_dead(pids, 5)
    run(ip, "--quiet", "after = 1")
    assert ip.user_ns["after"] == 1


def test_interrupt_reaches_the_cell_on_every_rank_and_keeps_the_session(sessions, capsys):
    ip = sessions
    s = start_session(ip)
    run(ip, "--quiet", "kept = 5")

    with once(lambda: s.status == "running", _thread.interrupt_main, pause=0.5), pytest.raises(KeyboardInterrupt):
        run(ip, "--quiet", "import time\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n"
                           "    caught = True\n    raise")
    assert s.status == "idle"
    assert "interrupted on every rank; session" in capsys.readouterr().err
    run(ip, "--quiet --gather", "back = (kept, caught)")
    assert ip.user_ns["back"] == [(5, True)] * 4


def test_timeout_interrupts_the_cell_and_keeps_the_session(sessions):
    ip = sessions
    s = start_session(ip, "-i 1 -g 2")
    started = time.monotonic()
    with pytest.raises(JobTimeoutError):
        run(ip, "--quiet --timeout 1", "import time\ntime.sleep(60)")
    assert time.monotonic() - started < 10 and s.status == "idle"
    run(ip, "--quiet", "ok = 1")
    assert ip.user_ns["ok"] == 1


def test_a_rank_that_dies_ends_the_session_with_nothing_left(sessions):
    ip = sessions
    s = start_session(ip)
    pids = [r.pid for r in s.ranks]
    with pytest.raises(Exception):
        run(ip, "--quiet", "import os, mpi_magic\nif mpi_magic.rank() == 2:\n    os._exit(3)\nimport time\ntime.sleep(30)")
    assert s.status == "stopped" and s.ended_reason
    assert _wait_dead(pids, 10)


def test_a_rank_that_cannot_start_ends_the_start_with_its_words(sessions, tmp_path):
    """Rank 1 dies before the session is up (here a sitecustomize on its path): the start ends in
    one error that names the rank and carries what it printed, and nothing is left running."""
    (tmp_path / "sitecustomize.py").write_text(
        "import os, sys\n"
        "if os.environ.get('MPI_MAGIC_TEST_BROKEN') == os.environ.get('OMPI_COMM_WORLD_RANK', os.environ.get('PMI_RANK')):\n"
        "    print('cannot start: no licence', file=sys.stderr, flush=True)\n"
        "    os._exit(7)\n")
    ip = sessions
    with pytest.raises(SessionStartError) as caught:
        start_session(ip, f"-i 1 -g 2 --env PYTHONPATH={tmp_path} --env MPI_MAGIC_TEST_BROKEN=1")
    message = str(caught.value)
    assert "could not start: its ranks ended before all 2 were up (" in message
    assert message.endswith("[rank 1] cannot start: no licence")
    session = ip.magics_manager.registry["MpiMagics"].session
    assert session is None or session.status == "stopped"
    with pytest.raises(SessionStartError, match="the launcher refused to start the ranks: .*Option: --no-such-flag"):
        start_session(ip, "-i 1 -g 2 --mpirun-args=--no-such-flag")


def test_a_killed_kernel_leaves_no_rank_and_its_folders_go_at_the_next_launch(tmp_path, monkeypatch):
    from helpers import held_folders

    from mpi_magic.backends.scratch import ScratchFolder

    script = (
        "import os, sys, time\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\nip.run_line_magic('load_ext', 'mpi_magic')\n"
        "ip.run_line_magic('mpirun_session', 'start -i 1 -g 3 --out s --quiet')\n"
        "print(' '.join(str(r.pid) for r in ip.user_ns['s'].ranks), flush=True)\n"
        "time.sleep(120)\n"
    )
    # a temporary folder of the kernel's own (short: it holds a socket), so that no other test's
    # launch sweeps its folders away before this one looks
    private_tmp = tempfile.mkdtemp(prefix="mk")
    monkeypatch.setattr(tempfile, "tempdir", private_tmp)
    env = {**os.environ, "MPI_MAGIC_CACHE_DIR": str(tmp_path / "cache"), "TMPDIR": private_tmp}
    kernel = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env, text=True)
    try:
        pids = [int(p) for p in kernel.stdout.readline().split()]
        folders = held_folders(kernel.pid)
        assert len(pids) == 3 and not _dead(pids)
        kinds = [kind for f in folders for kind in ("mpirun", "session")
                 if os.path.basename(f).startswith(f"mpi_magic_{kind}_")]
        assert sorted(kinds) == ["mpirun", "session"], folders
        assert all(os.path.dirname(f) == private_tmp for f in folders), folders
        kernel.kill()
        kernel.wait()
        assert _wait_dead(pids, 10), "every rank ended with the kernel"
        assert all(os.path.isdir(f) for f in folders), "a killed kernel cannot remove its folders"
        for kind in ("mpirun", "session"):  # what the next launch does first
            ScratchFolder(kind).remove()
        assert not [f for f in folders if os.path.exists(f)]
    finally:
        kernel.kill()
        kernel.wait()
        kernel.stdout.close()
        shutil.rmtree(private_tmp, ignore_errors=True)


def test_a_cell_that_does_not_fit_the_session_is_refused_in_one_sentence(sessions, cache_dir):
    ip = sessions
    s = start_session(ip, "-i 1 -g 2")
    ip.user_ns["sent"] = 1
    folders = sorted(os.listdir(os.path.join(cache_dir, "jobs")))
    for line, expected in [
        ("-i 2 -g 2", f"this cell asks for --instances 2, but session {s.name} runs 1 x 2 ranks on local: run it "
                      "as a one-off job with --no-session, or %mpirun_session stop and start one that fits"),
        ("-g 3", "this cell asks for --gpus 3, but session"),
        ("--backend sagemaker", "this cell asks for --backend sagemaker, but session"),
        ("--env A=1", "--env is fixed when a session starts"),
        ("--mpirun-args=--report-bindings", "this cell asks for other --mpirun-args"),
        ("--async --out job", "--async applies to one-off cells, not to a session's; run the cell as a one-off job "
                              "with --no-session"),
    ]:
        with pytest.raises(UsageError) as refused:
            run(ip, line, "x = sent")
        assert str(refused.value).startswith(expected) and "\n" not in str(refused.value)
    # refused before anything was packed or sent
    assert "x" not in ip.user_ns and "job" not in ip.user_ns
    assert (s.cells, s.bytes_sent, sorted(os.listdir(os.path.join(cache_dir, "jobs")))) == (0, 0, folders)
    run(ip, "-i 1 -g 2 --quiet", "same_shape = 1")  # the session's own shape, named, is fine
    run(ip, "-i 1 --timeout 30 --gather --quiet", "own_instances = 1")  # and its own -i, with a cell's own options
    assert ip.user_ns["own_instances"] == [1, 1] and s.cells == 2
    run(ip, "-i 2 -g 1 --no-session --quiet", "import mpi_magic\nw = mpi_magic.world_size()")
    assert ip.user_ns["w"] == 2


def test_every_bad_session_command_is_one_sentence(sessions):
    ip = sessions
    for line, expected in [
        ("begin", "the actions are start, stop, restart, attach"),
        ("start --detach", "--detach applies to --backend sagemaker sessions"),
        ("attach", "usage: %mpirun_session attach JOB_NAME"),
        ("stop now", "takes no options"),
        ("restart", "no session to restart"),
        ("start --gather", "--gather applies to cells"),
        ("start --timeout 3", "--timeout applies to cells"),
        ("start -g 0", "must be 1 or more"),
        ("start --idle-timeout soon", "--max-idle must be"),
        ("start --gpu 2", "unrecognized"),
    ]:
        with pytest.raises(UsageError, match=expected) as refused:
            ip.run_line_magic("mpirun_session", line)
        assert "\n" not in str(refused.value)
    start_session(ip, "-i 1 -g 1")
    with pytest.raises(UsageError, match="is up already"):
        ip.run_line_magic("mpirun_session", "start")


def test_status_restart_and_stop(sessions, capsys):
    ip = sessions
    s = start_session(ip, "-i 1 -g 2")
    run(ip, "--quiet", "kept = 1")
    capsys.readouterr()
    ip.run_line_magic("mpirun_session", "")
    shown = capsys.readouterr().out
    assert f"session {s.name}: local, 1 x 2 = 2 ranks, idle" in shown
    assert "ranks alive: 2/2, cells run: 1, idle for:" in shown and "memory per rank:" in shown
    ip.run_line_magic("mpirun_session", "restart")
    fresh = ip.magics_manager.registry["MpiMagics"].session
    assert fresh is not s and s.status == "stopped" and fresh.world_size == 2 and fresh.cells == 0
    with pytest.raises(RemoteRankError, match="NameError"):
        run(ip, "--quiet", "del kept\nprint(kept)")  # a new session: the ranks' state is new
    ip.run_line_magic("mpirun_session", "stop")
    assert fresh.status == "stopped" and "stopped: 1 cell run" in capsys.readouterr().out
    assert (s.ended_reason, fresh.ended_reason) == ("restarted", "stopped from the notebook")


def test_forged_session_events_from_a_cell_are_not_believed(sessions):
    ip = sessions
    start_session(ip, "-i 1 -g 2")
    run(ip, "--quiet", (
        "import json, time, sys\n"
        "for token in ('', 'deadbeefdeadbeef'):\n"
        "    print(f'@@mpi_magic:{token}@@' + json.dumps({'v': 2, 'k': 'ready', 'rank': 0, 'cell': 1, 'seq': 99, "
        "'time': 1.0}), file=sys.stderr, flush=True)\n"
        "time.sleep(1)\n"
        "done = 'after the forgery'\n"
    ))
    assert ip.user_ns["done"] == "after the forgery", "the cell ran to its end"


def test_the_channel_accepts_only_the_secret_and_then_nobody(tmp_path):
    folder = tmp_path / "chan"
    folder.mkdir(mode=0o700)
    channel = SocketChannel(str(folder), "s3cret")
    try:
        assert stat.S_IMODE(os.stat(channel.path).st_mode) == 0o600
        intruder = socket.socket(socket.AF_UNIX)
        intruder.connect(channel.path)
        intruder.sendall(b"guess\n")  # (the secret itself, sent as before, would be no proof either)
        assert not channel.try_accept() and not channel.connected
        challenge = intruder.makefile("rb").readline()
        assert len(challenge) == 33 and intruder.recv(16) == b"", "a challenge, then dropped without an answer"
        intruder.close()
        result = {}
        thread = threading.Thread(target=lambda: result.setdefault("end", SocketRankEnd(channel.path, "s3cret")))
        thread.start()
        deadline = time.monotonic() + 5
        while not channel.try_accept() and time.monotonic() < deadline:
            time.sleep(0.01)
        thread.join()
        assert channel.connected and not os.path.exists(channel.path), "nothing more can connect"
        channel.send({"kind": "cell", "cell": 1})
        assert result["end"].receive(5) == {"kind": "cell", "cell": 1}
        assert result["end"].receive(0.05) is None
        channel.close()
        with pytest.raises(ConnectionError):
            result["end"].receive(5)
        result["end"].close()
    finally:
        channel.close()


def test_idle_ranks_do_not_keep_the_cores_busy(sessions):
    ip = sessions
    s = start_session(ip, "-i 1 -g 2")
    procs = [psutil.Process(r.pid) for r in s.ranks]
    before = [p.cpu_times() for p in procs]
    time.sleep(2)
    used = [sum(p.cpu_times()[:2]) - sum(b[:2]) for p, b in zip(procs, before)]
    assert max(used) < 0.5, f"CPU seconds used by idle ranks in 2 s: {used}"


def test_sigint_between_cells_is_ignored_by_the_ranks(sessions):
    ip = sessions
    s = start_session(ip, "-i 1 -g 2")
    for r in s.ranks:
        os.kill(r.pid, signal.SIGINT)
    time.sleep(0.3)
    run(ip, "--quiet", "fine = 1")
    assert ip.user_ns["fine"] == 1 and s.status == "idle"


def test_a_session_cell_has_what_a_one_off_cell_has(sessions, capsys):
    ip = sessions
    ip.run_line_magic("mpirun_config", "view=widgets")
    start_session(ip)
    value = run(ip, "--out job", (
        "import sys, mpi_magic\n"
        "for i in range(2000):\n"
        "    print(f'out {i}')\n"
        "    print(f'err {i}', file=sys.stderr)\n"
        "for step in mpi_magic.progress(range(5), desc='steps'):\n"
        "    pass\n"
        "40 + mpi_magic.rank() + 2\n"
    ))
    assert value == 42, "the cell's value, from rank 0"
    job = ip.user_ns["job"]
    assert job.status == "completed" and type(job.view).__name__ == "WidgetView"
    assert all(r.status == "completed" and r.n == 5 and r.total == 5 for r in job.ranks)
    for rank in range(4):  # every line of the cell, stderr's last ones too, is in that cell's log
        log = job.logs(rank).splitlines()
        assert log.count("[stderr] err 1999") == 1 and "out 1999" in log
        assert sum(1 for line in log if line.startswith(("out ", "[stderr] err "))) == 4000
    run(ip, "--quiet --out job", "print('second')")
    assert ip.user_ns["job"].logs(0).splitlines() == ["second"], "each cell has logs of its own"


def test_dry_run_in_a_session_says_what_would_be_sent(sessions, capsys):
    ip = sessions
    s = start_session(ip, "-i 1 -g 2")
    ip.user_ns.update(small=[1, 2, 3])
    run(ip, "--quiet", "total = sum(small)")
    ip.user_ns["fresh"] = "new"
    capsys.readouterr()
    run(ip, "--dry-run", "print(small, fresh)")
    out = capsys.readouterr().out
    assert f"would run on session {s.name} (2 ranks): sending fresh (" in out
    assert "the ranks hold small already" in out and s.cells == 1


@pytest.mark.timeout(600)  # (a few ms a cell, but a loaded machine may take ten times that)
def test_a_thousand_warm_cells_leave_no_descriptor_open_and_the_notebook_barely_grows(sessions):
    """What a session keeps per cell must not pile up: after a warm-up, 1,000 cells may grow the
    notebook's resident memory by 16 MiB at most, and every descriptor they opened is closed."""
    import gc

    ip = sessions
    me = psutil.Process()
    fds_before_start = me.num_fds()
    s = start_session(ip)
    for _ in range(20):
        run(ip, "--quiet", "x = 1")
    gc.collect()
    rss, fds = me.memory_info().rss, me.num_fds()
    for _ in range(1000):
        run(ip, "--quiet", "x = 1")
    gc.collect()
    grown = me.memory_info().rss - rss
    assert s.cells == 1020 and s.status == "idle"
    assert me.num_fds() == fds, "the cells left descriptors open"
    assert grown <= 16 * 2**20, f"the notebook grew by {grown / 2**20:.1f} MiB over 1,000 cells"
    s.stop()
    assert me.num_fds() == fds_before_start, "the stopped session left descriptors open"
