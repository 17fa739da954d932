"""%mpirun_debug: a failed rank's frames and locals, opened in IPython's debugger in the notebook.

Real shell, real mpirun; the debugger reads its commands from stdin, as a kernel's would come."""

from __future__ import annotations

import io
import os
import re
import sys
import time

import pytest
from helpers import remote_cell, run
from IPython.core.error import UsageError

from mpi_magic.errors import RemoteRankError
from mpi_magic.runtime.rank import POST_MORTEM_LIMIT
from mpi_magic.shared import postmortem
from mpi_magic.shared.layout import POST_MORTEM, result_path
from mpi_magic.view.summary import Summary

ANSI = re.compile("\x1b\\[[0-9;]*m")

FAILING = (
    "import mpi_magic\n"                                  # line 2 (the magic line is line 1)
    "def step(x, k):\n"                                   # 3
    "    scale = x * k\n"                                 # 4
    "    return scale // (k - 2)\n"                       # 5
    "label = f'rank {mpi_magic.rank()}'\n"                # 6
    "for k in range(4):\n"                                # 7
    "    y = step(10 + mpi_magic.rank(), k if mpi_magic.rank() in failing else 5)\n"  # 8
)


def debug(ip, capsys, line: str, commands: list[str], monkeypatch) -> str:
    """What the debugger printed for ``commands`` (then ``q``)."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(commands + ["q"]) + "\n"))
    capsys.readouterr()
    ip.run_line_magic("mpirun_debug", line)
    return ANSI.sub("", capsys.readouterr().out)


def fail(ip, failing: list[int], line: str = "-i 2 -g 2 --quiet") -> RemoteRankError:
    ip.user_ns["failing"] = failing
    with pytest.raises(RemoteRankError) as raised:
        run(ip, line, FAILING)
    return raised.value


def test_the_failed_ranks_frames_open_with_their_locals_up_down_and_the_cells_lines(ip, capsys, monkeypatch):
    error = fail(ip, [1])
    assert error.debuggable == [1]
    assert "%mpirun_debug opens the debugger on rank 1's frames and locals" in "\n".join(error._render_traceback_())
    out = debug(ip, capsys, "", ["p scale, k, x", "ll", "up", "p label", "p failing", "where"], monkeypatch)
    assert "rank 1 raised ZeroDivisionError: integer division or modulo by zero" in out
    assert "(22, 2, 11)" in out  # the innermost frame, step's, with its locals as they were on rank 1
    assert "return scale // (k - 2)" in out  # ll reads the cell's lines
    cell_file = re.search(r"(\S+)\(8\)<module>\(\)", out)[1]  # up: the cell's own frame, numbered as the cell shows it
    assert ip.compile.format_code_name(cell_file) == ("Cell", f"In[{ip.execution_count}]"), "a file IPython names"
    assert "'rank 1'" in out and "[1]" in out
    assert f"{cell_file}(5)step()" in out  # where lists both frames


def test_a_function_from_an_earlier_cell_reads_in_where_and_list_as_the_notebooks_own_debug_reads_it(
        ip, capsys, monkeypatch):
    assert ip.run_cell("import math\ndef step(x, k):\n    scale = x * k\n    return scale // (k - 2)\n",
                       store_history=True).success
    assert not ip.run_cell("step(10, 2)", store_history=True).success  # the same failure in the notebook
    here = debug_here(ip, capsys, ["where", "list"], monkeypatch)
    with pytest.raises(RemoteRankError):
        run(ip, "-g 2 --quiet", "import mpi_magic\nlabel = 'on a rank'\nstep(10 + mpi_magic.rank(), 2 + mpi_magic.rank())\n")
    there = debug(ip, capsys, "", ["where", "list", "p scale, label"], monkeypatch)
    step_frame = f"{ip.user_ns['step'].__code__.co_filename}(4)step()"
    assert step_frame in here and step_frame in there, "where names the frame as %debug names it"
    listed = here[here.index("      1 import math"):].split("\nipdb>")[0]
    assert "----> 4     return scale // (k - 2)" in listed and listed in there, "list shows the cell's lines alike"
    assert "(20, 'on a rank')" in there, "the function's globals are the cell's"


def test_a_function_from_an_earlier_session_cell_reads_in_where_and_list_as_that_cells_lines(sessions, capsys,
                                                                                               monkeypatch):
    ip = sessions
    ip.run_line_magic("mpirun_session", "start -g 2 --quiet")
    defining, error = remote_cell(ip, "--quiet", "import math\ndef step(x, k):\n    scale = x * k\n"
                                                 "    return scale // (k - 2)\n")
    assert error is None
    calling, error = remote_cell(ip, "--quiet", "import mpi_magic\nstep(10 + mpi_magic.rank(), 2 + mpi_magic.rank())\n")
    assert isinstance(error, RemoteRankError)
    out = debug(ip, capsys, "", ["where", "list"], monkeypatch)
    named = {function: " ".join(ip.compile.format_code_name(filename) or [filename])
             for filename, function in re.findall(r"(<[^>]+>|/\S+)\(\d+\)(<module>|step)\(\)", out)}
    assert named == {"<module>": calling, "step": defining}, "each frame in its own cell's file, which IPython names"
    assert "----> 5     return scale // (k - 2)" in out, "list shows the function's own cell"


def test_a_notebook_function_among_a_failed_ranks_locals_keeps_its_cells_file(ip, capsys, monkeypatch):
    assert ip.run_cell("def scale(x):\n    return 2 * x\n", store_history=True).success
    with pytest.raises(RemoteRankError):
        run(ip, "--quiet", "fn = scale\nfn(1) // 0\n")
    out = debug(ip, capsys, "", ["p fn.__code__.co_filename"], monkeypatch)
    assert repr(ip.user_ns["scale"].__code__.co_filename) in out, out


def debug_here(ip, capsys, commands: list[str], monkeypatch) -> str:
    """What the notebook's own %debug printed for ``commands`` on its last traceback (then ``q``)."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(commands + ["q"]) + "\n"))
    capsys.readouterr()
    ip.run_line_magic("debug", "")
    return ANSI.sub("", capsys.readouterr().out)


def test_several_failed_ranks_one_is_picked_by_number_and_a_rank_that_did_not_fail_is_refused(sessions, capsys,
                                                                                              monkeypatch):
    ip = sessions  # a session's failed ranks go back to waiting, so both report (a one-off job's launcher may stop
    ip.run_line_magic("mpirun_session", "start -i 2 -g 2 --quiet")  # the second before it does)
    error = fail(ip, [1, 3], "--quiet")
    assert error.debuggable == [1, 3]
    out = debug(ip, capsys, "3", ["p x"], monkeypatch)
    assert "rank 3 raised ZeroDivisionError" in out and "\n13\n" in out.replace("ipdb> ", "\n")
    out = debug(ip, capsys, "", ["p x"], monkeypatch)  # the rank that failed first, of two that fail alike
    other = 4 - error.rank
    assert f"rank {error.rank} raised" in out and f"also raised: rank {other}; %mpirun_debug N opens rank N" in out
    with pytest.raises(UsageError, match="rank 0 of job .* did not raise; the ranks that did: 1, 3"):
        ip.run_line_magic("mpirun_debug", "0")
    with pytest.raises(UsageError, match="usage: %mpirun_debug"):
        ip.run_line_magic("mpirun_debug", "one")
    capsys.readouterr()
    ip.run_line_magic("mpirun_debug", "3 -c 'p x' -c up -c 'p label'")  # headless: no stdin is read
    out = ANSI.sub("", capsys.readouterr().out)
    assert "\n13\n" in out.replace("ipdb> ", "\n") and "'rank 3'" in out


def test_the_rank_that_failed_first_is_named_debugged_and_the_others_read_as_what_followed(sessions, capsys,
                                                                                           monkeypatch):
    ip = sessions  # a session's failed ranks go back to waiting, so the others report what followed
    ip.run_line_magic("mpirun_session", "start --instances 1 --gpus 4 --quiet")
    error = fail_on_rank_2_first(ip)
    assert (error.rank, error.error_type, error.message) == (2, "ValueError", "root cause on rank 2")
    assert "root cause on rank 2" in error.remote_traceback and "collateral" not in error.remote_traceback
    assert len(error.failures) == 4, "every rank raised"
    # (0.3 s after rank 2 by the cell's clock, less where a loaded machine started rank 2's cell later)
    assert re.search(r"\(then ranks 0, 1, 3 of 4 failed within \d+\.\d s\)$", str(error)), str(error)
    rendered = error._render_traceback_()
    assert "--- traceback of rank 2 (instance 0" in "\n".join(rendered)
    assert "%mpirun_debug opens the debugger on rank 2's frames and locals (%mpirun_debug N on rank N)" in rendered
    assert sum(line.startswith("then rank") and "raised RuntimeError: collateral on rank" in line
               for line in rendered) == 3
    failures = [line for line in repr(Summary(ip.user_ns["job"].model, "")).splitlines() if " raised " in line]
    assert failures[0].startswith("  rank 2 (instance 0") and len(failures) == 4
    out = debug(ip, capsys, "", ["p mpi_magic.rank()"], monkeypatch)
    assert "rank 2 raised ValueError: root cause on rank 2 (also raised: ranks 0, 1, 3;" in out


def fail_on_rank_2_first(ip) -> RemoteRankError:
    """Rank 2 raises, the others 0.3 s later. Rank 2's frames hold a local that takes a second to
    keep (as a large model's might), so its report arrives after theirs."""
    with pytest.raises(RemoteRankError) as raised:
        run(ip, "--quiet --out job",
            "import time, mpi_magic\n"
            "class Weights:\n"
            "    def __reduce__(self):\n"
            "        time.sleep(1)\n"
            "        return (int, ())\n"
            "if mpi_magic.rank() == 2:\n"
            "    weights = Weights()\n"
            "    raise ValueError('root cause on rank 2')\n"
            "time.sleep(0.3)\n"
            "raise RuntimeError(f'collateral on rank {mpi_magic.rank()}: peer went away')\n")
    return raised.value


def test_an_mpi_object_among_the_locals_stays_on_the_rank(ip, capsys):
    imported = "mpi4py.MPI" in sys.modules
    with pytest.raises(RemoteRankError):
        run(ip, "-g 2 --quiet", "from mpi4py import MPI\ncomm = MPI.COMM_WORLD\nsize = comm.size\nraise ValueError\n")
    capsys.readouterr()
    ip.run_line_magic("mpirun_debug", "-c 'p comm' -c 'p size'")
    out = ANSI.sub("", capsys.readouterr().out)
    assert "(not loaded here: UnpicklingError: it is mpi4py.MPI's, which stays on the rank)" in out
    assert "\n2\n" in out.replace("ipdb> ", "\n")
    assert imported or "mpi4py.MPI" not in sys.modules, "MPI was not started in the notebook"


def test_nothing_to_debug_is_said_in_a_sentence(ip):
    with pytest.raises(UsageError, match="no job of this notebook has a rank that raised"):
        ip.run_line_magic("mpirun_debug", "")
    run(ip, "-g 2 --quiet", "x = 1\n")
    with pytest.raises(UsageError, match="no job of this notebook has a rank that raised"):
        ip.run_line_magic("mpirun_debug", "")


def test_frames_changed_after_the_rank_wrote_them_are_refused(ip):
    fail(ip, [1])
    job = ip.magics_manager.registry["MpiMagics"].recent_jobs[-1]
    path = result_path(job.job_dir, 1, POST_MORTEM)
    with open(path, "ab") as f:
        f.write(b"tampered")
    with pytest.raises(UsageError, match="checksum differs"):
        ip.run_line_magic("mpirun_debug", "")
    os.remove(path)
    with pytest.raises(UsageError, match="rank 1's frames are not in the job's folder"):
        ip.run_line_magic("mpirun_debug", "")


def test_huge_unpicklable_and_misbehaving_locals_come_as_their_reprs_and_the_failure_still_comes_at_once(
        ip, capsys, monkeypatch):
    cell = (
        "import threading\n"
        "class Sulky:\n"
        "    def __repr__(self):\n        raise RuntimeError('no repr today')\n"
        "    def __reduce__(self):\n        raise TypeError('no pickling either')\n"
        "lock = threading.Lock()\n"
        "big = bytes(8 << 20)\n"
        "many = list(range(2_000_000))\n"
        "sulky = Sulky()\n"
        "small = {'a': 1}\n"
        "import mpi_magic, time\n"
        "if mpi_magic.rank() == 0:\n    raise ValueError('stop here')\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    with pytest.raises(RemoteRankError, match="ValueError: stop here"):
        run(ip, "-g 2 --quiet", cell)
    assert time.monotonic() - started < 20
    out = debug(ip, capsys, "", ["p type(lock).__name__", "p len(big)", "p many", "p sulky", "p small"], monkeypatch)
    assert "'RemoteValue'" in out  # the lock did not pickle: its repr stands for it
    assert "<Sulky instance at 0x" in out  # its __repr__ raised
    assert "[0, 1, 2, 3, 4, 5" in out and "...]" in out  # a short repr, not two million numbers
    assert "{'a': 1}" in out
    assert "*** TypeError" in out  # len() of the repr's stand-in: big did not come as a value
    job = ip.magics_manager.registry["MpiMagics"].recent_jobs[-1]
    assert os.path.getsize(result_path(job.job_dir, 0, POST_MORTEM)) < postmortem.TOTAL_LIMIT
    assert not os.path.exists(result_path(job.job_dir, 1, POST_MORTEM))  # only failed ranks send frames


def test_a_session_cells_failed_rank_is_debugged_and_the_session_goes_on(sessions, capsys, monkeypatch):
    ip = sessions
    ip.run_line_magic("mpirun_session", "start -i 1 -g 2 --quiet")
    ip.user_ns["failing"] = [0]
    with pytest.raises(RemoteRankError):
        run(ip, "--quiet", FAILING)
    out = debug(ip, capsys, "", ["p scale, k, x"], monkeypatch)
    assert "(20, 2, 10)" in out
    run(ip, "--quiet", "after = label\n")  # the ranks kept their globals and wait for the next cell
    assert ip.user_ns["after"] == "rank 0"


BAD_LOCALS = (
    "import mpi_magic, time\n"
    "class Spinning:\n"
    "    def __repr__(self):\n"
    "        while True:\n"
    "            pass\n"
    "class Sleepy:\n"
    "    def __getstate__(self):\n"
    "        time.sleep(600)\n"
    "        return {}\n"
    "class Lazy:\n"
    "    def __getattr__(self, name):\n"
    "        raise RuntimeError('not loaded yet')\n"
    "spinning, sleepy, lazy, numbers, word = Spinning(), Sleepy(), Lazy(), [1, 2, 3], 'kept'\n"
    "def step(item, k):\n"
    "    total = k * 2\n"
    "    if mpi_magic.rank() == 0:\n"
    "        with open(raised_at_file, 'w') as f:\n"
    "            f.write(repr(time.time()))\n"
    "        raise ValueError('bad locals')\n"
    "    time.sleep(60)\n"
    "step(spinning, 21)\n"
)


def test_a_local_whose_repr_or_pickle_never_ends_costs_only_itself_and_the_failure_comes_in_time(
        ip, capsys, monkeypatch, tmp_path):
    ip.user_ns["raised_at_file"] = str(tmp_path / "raised_at")
    with pytest.raises(RemoteRankError, match="ValueError: bad locals") as raised:
        run(ip, "-g 2 --quiet", BAD_LOCALS)
    took = time.time() - float((tmp_path / "raised_at").read_text())
    # a loaded machine may add seconds to the limit; a rank waiting on its locals reports after POST_MORTEM_LIMIT or never
    assert took < postmortem.TIME_LIMIT + 8 < POST_MORTEM_LIMIT, f"the failure came {took:.1f} s after the raise"
    assert raised.value.debuggable == [0]
    out = debug(ip, capsys, "", ["p total, k", "p item", "up", "p numbers, word", "p spinning", "p sleepy", "p lazy"],
                monkeypatch)
    assert "(42, 21)" in out and "([1, 2, 3], 'kept')" in out  # the good locals of both frames
    unavailable = f"unavailable: took longer than {postmortem.LOCAL_TIME_LIMIT:g} s"
    assert out.count(f"<Spinning: {unavailable}>") == 2  # item and spinning: its repr never ended
    assert re.search(rf"<__main__\.Sleepy object at 0x\w+> \(its value {unavailable}\)", out)  # its pickle
    assert re.search(r"<__main__\.Lazy object at 0x\w+> \(its value unavailable: it raised RuntimeError: not loaded yet\)",
                     out)  # at once, with what its __getattr__ raised


def test_a_rank_that_could_not_keep_its_frames_says_why(ip):
    cell = ("import resource, signal\n"  # no file may grow: writing the frames fails, as on a full disk
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))\n"
            "raise ValueError('nowhere to write')\n")
    with pytest.raises(RemoteRankError, match="nowhere to write") as raised:
        run(ip, "-g 1 --quiet", cell)
    assert raised.value.debuggable == []
    with pytest.raises(UsageError, match=r"rank 0 of job \S+ kept no frames to debug \(keeping them failed: OSError: "
                                         r"\[Errno 27\] File too large\); its traceback is in the error above"):
        ip.run_line_magic("mpirun_debug", "")
