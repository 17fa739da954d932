"""What every backend must do, run over each (this machine, the tests' Slurm cluster on its test
hosts, the SageMaker rehearsal, the Kubernetes emulator whose pods run on test hosts, and the scripted
backend of ``mpi_magic.testing.scripted``, registered here) by one fixture: a backend passes these, and keeps in its own tests only what is its own. Each
test runs a 2 x 2 cell through the magic, as a user would. The scripted backend plays its ranks one
after another in the notebook's process, so it takes only the tests that need no MPI between ranks
and no process of their own (the fixture ``on_any``); the others run over the real backends (``on``)."""

from __future__ import annotations

import _thread
import io
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import pytest
from IPython.core.error import UsageError
from helpers import (BUCKET, ROLE, SLURM_GONE_WITHIN, kubernetes_left, needs_hosts, needs_slurm, once, once_running, run,
                     slurm_listed, start_session, wait_until)

from mpi_magic.backends import registry
from mpi_magic.errors import JobError, JobTimeoutError, RemoteRankError
from mpi_magic.testing import scripted


@dataclass
class On:
    """The shell with its cells going to one backend, and what that backend says of its ranks."""

    name: str
    ip: object
    host_of: Callable[[int, str], str]  # the host an error names for the ranks of an instance (of a job so named)
    gone: Callable[[object], bool]  # nothing of an ended job (or session) is left where it ran
    stop_description: str  # how an interrupt stops its jobs, as the sentence says it
    environ: dict[str, str]  # what another Python (a second kernel) needs to run cells there as this shell does


@pytest.fixture(scope="module")
def one_worker():
    """(A module's fixture: the suite's servers, started once for the module, serve every test of it.)"""


REAL = ["local", pytest.param("slurm", marks=needs_slurm()), "sagemaker", pytest.param("kubernetes", marks=needs_hosts())]


@pytest.fixture(params=REAL)
def on(request, sessions, one_worker) -> On:
    """A real backend. (``sessions``: a session a test leaves up is stopped at its end.)"""
    return _on(request, sessions)


@pytest.fixture(params=[*REAL, "scripted"])
def on_any(request, sessions, one_worker) -> On:
    """A real backend, or the scripted one, whose ranks are played in the notebook's process."""
    return _on(request, sessions)


def _on(request, ip) -> On:
    if request.param == "scripted":
        registry.register(scripted.declaration())
        request.addfinalizer(lambda: registry.unregister("scripted"))
        ip.run_line_magic("mpirun_config", "backend=scripted view=text")
        return On("scripted", ip, lambda instance, job: socket.gethostname(),
                  lambda ran: wait_until(lambda: ran.status == "stopped", 10), "a scripted stop",
                  {"MPI_MAGIC_BACKEND": "scripted"})
    if request.param == "slurm":
        cluster = request.getfixturevalue("slurm_cluster")
        request.getfixturevalue("slurm")  # (which fails the test if a job is left in the queue)
        ip.run_line_magic("mpirun_config", "backend=slurm")
        return On("slurm", ip, lambda instance, job: f"n{instance + 1}",
                  lambda ran: wait_until(lambda: not slurm_listed(cluster, ran.name), SLURM_GONE_WITHIN), "scancel",
                  {**cluster.environ, "MPI_MAGIC_BACKEND": "slurm"})
    if request.param == "kubernetes":
        cluster = request.getfixturevalue("kubernetes")
        ip.run_line_magic("mpirun_config", "backend=kubernetes view=text")
        return On("kubernetes", ip, lambda instance, job: f"{job}-worker-{instance} on node-{instance + 1}",
                  lambda ran: wait_until(lambda: not kubernetes_left(cluster, ran.name), 10),
                  "the MPIJob deleted", {**cluster.environ, "MPI_MAGIC_BACKEND": "kubernetes"})
    if request.param == "sagemaker":
        aws = request.getfixturevalue("cloud")
        settings = {"MPI_MAGIC_BACKEND": "sagemaker", "MPI_MAGIC_INSTANCE_TYPE": "ml.m5.xlarge",
                    "MPI_MAGIC_IMAGE_URI": "local/emulated", "MPI_MAGIC_ROLE": ROLE,
                    "MPI_MAGIC_S3_ROOT": f"s3://{BUCKET}/{request.getfixturevalue('prefix')}",
                    # (a session's ranks end once its notebook stopped beating for this long)
                    "MPI_MAGIC_HEARTBEAT": "1", "MPI_MAGIC_HEARTBEAT_LIMIT": "10"}

        def ended(ran) -> bool:  # (a session's handle names its training job apart)
            name = getattr(ran, "job_name", None) or ran.name
            return wait_until(lambda: aws.client("sagemaker").describe_training_job(TrainingJobName=name)[
                "TrainingJobStatus"] in ("Completed", "Failed", "Stopped"), 30)
        return On("sagemaker", ip, lambda instance, job: f"algo-{instance + 1}", ended, "StopTrainingJob",
                  {**request.getfixturevalue("local_aws_env"), **settings})
    ip.run_line_magic("mpirun_config", "view=text")
    return On("local", ip, lambda instance, job: socket.gethostname(), _no_rank_process, "SIGINT, then SIGTERM, then SIGKILL",
              {"MPI_MAGIC_BACKEND": "local"})


def _no_rank_process(ran) -> bool:
    """No process of the ranks of a job (or session) runs on (one ended but not yet reaped counts as gone)."""
    import psutil

    for rank in ran.ranks:
        try:
            if rank.pid and psutil.Process(rank.pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def test_every_rank_runs_the_cell_and_what_it_assigns_comes_back(on):
    on.ip.user_ns["data"] = [1, 10, 100, 1000]  # a notebook value the cell reads
    run(on.ip, "-i 2 -g 2 --out job", (
        "import mpi_magic\n"
        "from mpi4py import MPI\n"
        "total = MPI.COMM_WORLD.allreduce(data[mpi_magic.rank()])\n"
        "where = (mpi_magic.rank(), mpi_magic.instance(), mpi_magic.local_rank(), mpi_magic.world_size())\n"
    ))
    assert on.ip.user_ns["total"] == 1111 and on.ip.user_ns["where"] == (0, 0, 0, 4), "rank 0's values"
    job = on.ip.user_ns["job"]
    assert (job.backend, job.status, [r.status for r in job.ranks]) == (on.name, "completed", ["completed"] * 4)
    run(on.ip, "-i 2 -g 2 --gather", "import mpi_magic\nwhere = (mpi_magic.rank(), mpi_magic.instance())\n")
    assert on.ip.user_ns["where"] == [(0, 0), (1, 0), (2, 1), (3, 1)], "--gather: every rank's, by rank"


def test_a_failing_rank_is_named_with_its_host_and_line_and_its_frames_open_in_the_debugger(on, capsys, monkeypatch):
    with pytest.raises(RemoteRankError) as raised:
        run(on.ip, "-i 2 -g 2 --out job", (
            "import time, mpi_magic\n"
            "shard = [mpi_magic.rank()] * 3\n"
            "if mpi_magic.rank() == 3:\n"
            "    raise ValueError('bad shard')\n"
            "time.sleep(120)\n"
        ))
    job = on.ip.user_ns["job"]
    assert str(raised.value).startswith(f"rank 3 (instance 1, {on.host_of(1, job.name)}) raised ValueError: bad shard"), \
        str(raised.value)
    assert re.search(r"Cell In\[\d+\], line 5, in <module>\n    raise ValueError\('bad shard'\)\n",
                     raised.value.remote_traceback), "the cell's frame, as the notebook names its cells"
    assert job.status == "failed" and on.gone(job), "the others were stopped, and nothing of the job is left"
    monkeypatch.setattr(sys, "stdin", io.StringIO("p shard\nq\n"))
    capsys.readouterr()
    on.ip.run_line_magic("mpirun_debug", "")
    assert "[3, 3, 3]" in capsys.readouterr().out, "the failed rank's frames and locals, in the notebook"


def test_a_stall_names_where_each_rank_waits(on):
    on.ip.run_line_magic("mpirun_config", "stall_after=2")
    run(on.ip, "-i 2 -g 2 --async --quiet --out job", (
        "import time, mpi_magic\n"
        "from mpi4py import MPI\n"
        "print('up', flush=True)\n"  # (the quiet spell starts once MPI is up, however long that took)
        "if mpi_magic.rank() == 2:\n"
        "    time.sleep(300)\n"
        "MPI.COMM_WORLD.allreduce(1)\n"
    ))
    job = on.ip.user_ns["job"]
    try:
        # (a rank that holds the GIL in MPI answers only when asked the second way, a moment later)
        assert wait_until(lambda: job.model.roll_call and "no answer yet" not in job.model.roll_call, 60), \
            f"the ranks went quiet: the view says where each is ({job.model.roll_call!r})"
    finally:
        job.cancel()
        with pytest.raises(JobError, match="cancelled"):
            job.wait()
    # (lines as the cell shows them, the magic's line first)
    assert job.model.roll_call == "ranks 0, 1, 3 at cell line 7 in allreduce; rank 2 at cell line 6 in sleep"
    assert on.gone(job)


def test_timeout_stops_every_rank_and_says_so(on):
    with pytest.raises(JobTimeoutError, match=r"ran past --timeout 5s; all 4 ranks were stopped"):
        run(on.ip, "-i 2 -g 2 --timeout 5 --out job", "import time\ntime.sleep(300)\n")
    job = on.ip.user_ns["job"]
    assert job.status == "stopped" and on.gone(job)


def test_ctrl_c_says_where_the_ranks_were_and_stops_the_job_the_way_the_backend_says(on, capsys):
    with once_running(on.ip, _thread.interrupt_main), pytest.raises(KeyboardInterrupt):
        run(on.ip, "-i 2 -g 1 --out job", "import time\ntime.sleep(300)\n")
    job = on.ip.user_ns["job"]
    assert job.status == "stopped" and on.gone(job)
    said = capsys.readouterr().err.splitlines()
    assert "mpi_magic: where the ranks were: ranks 0, 1 at cell line 3 in sleep" in said, said
    stopping = [line for line in said if "interrupted: stopping job" in line]
    assert stopping and on.stop_description in stopping[0], "the sentence says how it is stopped"


# -- sessions ------------------------------------------------------------------------------------

def test_a_sessions_ranks_keep_their_state_between_cells_and_a_cell_of_another_shape_is_refused(on_any):
    on = on_any
    session = start_session(on.ip, "-i 2 -g 1")
    run(on.ip, "", "import mpi_magic\nkept = 10 * mpi_magic.rank()\n")
    run(on.ip, "--gather", "seen = kept + 1\n")
    assert on.ip.user_ns["seen"] == [1, 11], "each rank's own value, kept from the cell before"
    with pytest.raises(UsageError, match=r"^this cell asks for --gpus 2, but session \S+ runs "):
        run(on.ip, "-g 2", "x = 1\n")
    on.ip.run_line_magic("mpirun_session", "stop")
    assert session.status == "stopped" and on.gone(session)


def test_a_sessions_ranks_say_where_they_are_between_cells_at_a_stall_and_on_ctrl_c(on, capsys):
    on.ip.run_line_magic("mpirun_config", "stall_after=2")
    session = start_session(on.ip, "-i 2 -g 1")
    capsys.readouterr()
    on.ip.run_line_magic("mpirun_stacks", "")
    assert capsys.readouterr().out.splitlines() == [f"session {session.name} ({on.name}, 2 ranks) idle",
                                                    "  ranks 0, 1 waiting for a cell"]

    at_stall = []

    def stall_roll_call() -> bool:  # (taken by the follower once the cell's ranks were quiet for stall_after)
        job = on.ip.user_ns.get("job")
        if job and job.model.roll_call_quiet is not None and "no answer" not in job.model.roll_call:
            at_stall.append(job.model.roll_call)
        return bool(at_stall)

    with once(stall_roll_call, _thread.interrupt_main, limit=90), pytest.raises(KeyboardInterrupt):
        run(on.ip, "--out job", "import time\ntime.sleep(300)\n")
    assert at_stall[:1] == ["ranks 0, 1 at cell line 3 in sleep"], "the stall's roll-call"
    said = capsys.readouterr().err.splitlines()
    assert "mpi_magic: where the ranks were: ranks 0, 1 at cell line 3 in sleep" in said, said
    run(on.ip, "--gather", "import mpi_magic\nback = mpi_magic.rank()\n")
    assert on.ip.user_ns["back"] == [0, 1] and session.status == "idle", "the session is kept"
    on.ip.run_line_magic("mpirun_session", "stop")
    assert on.gone(session)


def test_an_idle_session_ends_itself_after_max_idle(on_any):
    on = on_any
    session = start_session(on.ip, "-i 1 -g 2 --max-idle 2")
    assert wait_until(lambda: session.status == "stopped", 60)
    assert "idle for 2s (--max-idle)" in session.ended_reason and on.gone(session)


def test_a_killed_kernel_leaves_nothing_of_its_session_running(on, tmp_path):
    """SIGKILL: no atexit, no goodbye; what stops the ranks is the backend's own (a process beside the
    kernel, the notebook's heartbeat)."""
    kernel = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""\
        import json, time
        from IPython.core.interactiveshell import InteractiveShell
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "mpi_magic")
        ip.run_line_magic("mpirun_config", "view=text")
        ip.run_line_magic("mpirun_session", "start -i 2 -g 1 --quiet --out s")
        ip.run_cell_magic("mpirun_remote", "--quiet", "kept = 1")
        s = ip.user_ns["s"]
        print(json.dumps({"name": s.name, "job_name": s.job_name, "pids": [r.pid for r in s.ranks]}), flush=True)
        time.sleep(300)
        """)], stdout=subprocess.PIPE, text=True,
        env={**os.environ, **on.environ, "MPI_MAGIC_CACHE_DIR": str(tmp_path / "cache")})
    try:
        said = kernel.stdout.readline()
        assert said, "the kernel started its session and ran a cell on it"
    finally:
        kernel.kill()
        kernel.wait()
        kernel.stdout.close()
    up = json.loads(said)
    ran = SimpleNamespace(name=up["name"], job_name=up["job_name"], ranks=[SimpleNamespace(pid=p) for p in up["pids"]])
    assert wait_until(lambda: on.gone(ran), 10), f"nothing of session {up['name']} runs on"
