"""A cell's job exported (``%mpirun_export``) and run again from bash without a notebook (``run.sh``,
``python -m mpi_magic.submit``): every rank's output, the exit status, the results a script reads."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from helpers import command_of, run

import mpi_magic

CELL = textwrap.dedent("""\
    import mpi_magic
    from mpi4py import MPI
    for step in mpi_magic.progress(range(3)):
        pass
    total = scale(base) + MPI.COMM_WORLD.allreduce(mpi_magic.rank())
    print("rank", mpi_magic.rank(), "of", mpi_magic.world_size())
    """)


def run_sh(folder, cache_dir: str, **environ: str) -> subprocess.CompletedProcess:
    """``bash FOLDER/run.sh`` from a terminal, this suite's Python as its Python, ``environ`` added."""
    return subprocess.run(["bash", os.path.join(folder, "run.sh")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": sys.executable, "MPI_MAGIC_CACHE_DIR": cache_dir, **environ})


def results_of(folder) -> dict:
    with open(os.path.join(folder, "results.pickle"), "rb") as f:
        return pickle.load(f)


def test_an_exported_job_runs_from_bash_with_every_ranks_output_and_the_cells_results(ip, cache_dir, tmp_path,
                                                                                      capsys):
    ip.run_line_magic("mpirun_config", "view=text")
    ip.user_ns["base"] = 10
    ip.run_cell("def scale(value):\n    return 3 * value\n")
    run(ip, "-i 2 -g 2 --gather --out job", CELL)
    assert ip.user_ns["total"] == [36] * 4
    folder = tmp_path / "exported"
    ip.run_line_magic("mpirun_export", f"job --to {folder}")
    name = ip.user_ns["job"].name
    assert capsys.readouterr().out.endswith(f"job {name} exported to {folder}: bash {folder}/run.sh runs it "
                                            f"({folder}/README.md says what it needs)\n")
    assert sorted(os.listdir(folder)) == ["README.md", "cell.py", "export.json", "launch.txt", "payload.bin",
                                          "results", "run.sh"]
    assert (folder / "cell.py").read_text() == CELL
    launch = (folder / "launch.txt").read_text()
    assert " -np 4 --tag-output " in launch and launch.endswith(f" -m mpi_magic.runtime {folder}\n")
    assert "results.pickle" in (folder / "README.md").read_text()
    ip.user_ns["base"] = 0  # the notebook moves on: the export keeps what the cell read

    done = run_sh(folder, cache_dir)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [f"[rank {r}] rank {r} of 4" for r in range(4)]
    assert "completed" in done.stderr and f"results written to {folder}/results.pickle: step, total" in done.stderr
    assert results_of(folder) == {"step": ip.user_ns["step"], "total": ip.user_ns["total"]}  # as the cell gave them


def test_an_exported_job_whose_rank_fails_exits_non_zero_with_that_ranks_traceback(ip, cache_dir, tmp_path):
    ip.run_line_magic("mpirun_config", "view=text keep_payloads=true")
    with pytest.raises(mpi_magic.RemoteRankError):
        run(ip, "-g 2", "import mpi_magic\nif mpi_magic.rank() == 1:\n    raise ValueError('bad shard')\n")
    folder = tmp_path / "failing"
    ip.run_line_magic("mpirun_export", f"--to {folder}")
    (folder / "results.pickle").write_bytes(pickle.dumps({"earlier": 1}))  # as an earlier run could have left
    done = run_sh(folder, cache_dir)
    assert done.returncode == 1
    assert "RemoteRankError: rank 1 (instance 0, " in done.stderr and "raised ValueError: bad shard" in done.stderr
    assert "--- traceback of rank 1 " in done.stderr and "    raise ValueError('bad shard')" in done.stderr
    assert not (folder / "results.pickle").exists()
    (folder / "results.pickle").write_bytes(pickle.dumps({"earlier": 1}))
    ip.run_line_magic("mpirun_export", f"--to {folder}")  # exported again: no results of an earlier export stay
    assert not (folder / "results.pickle").exists()


def test_an_exported_jobs_env_values_stay_out_of_its_folder_and_come_from_the_environment_it_runs_in(ip, cache_dir,
                                                                                                      tmp_path):
    ip.run_line_magic("mpirun_config", "view=text")
    run(ip, "-g 1 --env API_TOKEN=notebook-secret --env MODE=fast --out job",
        "import os\nseen = (os.environ['API_TOKEN'], os.environ['MODE'])\n")
    folder = tmp_path / "exported"
    ip.run_line_magic("mpirun_export", f"job --to {folder}")
    for path in folder.rglob("*"):
        assert path.is_dir() or b"notebook-secret" not in path.read_bytes(), path
    assert json.loads((folder / "export.json").read_text())["options"]["env"] == ["API_TOKEN", "MODE"]
    assert "`API_TOKEN`, `MODE`" in (folder / "README.md").read_text()

    missing = run_sh(folder, cache_dir, MODE="slow")
    assert missing.returncode == 2
    assert missing.stderr == ("mpi_magic: the job ran with --env API_TOKEN, which is not set here: set it in the "
                              "environment run.sh runs in (an export keeps the names of --env variables, not their "
                              "values)\n")
    done = run_sh(folder, cache_dir, API_TOKEN="ci-secret", MODE="slow")
    assert done.returncode == 0, done.stderr
    assert results_of(folder) == {"seen": ("ci-secret", "slow")}


def test_run_sh_names_any_other_failure_in_one_sentence_with_a_status_of_its_own(ip, cache_dir, tmp_path):
    ip.run_line_magic("mpirun_config", "view=text")
    run(ip, "-g 1 --out job", "x = 1\n")
    folder = tmp_path / "exported"
    ip.run_line_magic("mpirun_export", f"job --to {folder}")
    (folder / "payload.bin").unlink()
    done = run_sh(folder, cache_dir)
    assert done.returncode == 2
    assert done.stderr == (f"mpi_magic: the job could not run: [Errno 2] No such file or directory: "
                           f"'{folder}/payload.bin' (FileNotFoundError)\n")


def test_sigterm_to_run_sh_stops_the_job_and_leaves_nothing_of_it_running(ip, cache_dir, tmp_path):
    ip.run_line_magic("mpirun_config", "view=text")
    ip.user_ns["nap"] = 0
    run(ip, "-g 2 --out job", "import time\ntime.sleep(nap)\n")
    ip.user_ns["nap"] = 60  # exported with the notebook's values now: a job that runs for a minute
    folder = tmp_path / "exported"
    ip.run_line_magic("mpirun_export", f"job --to {folder}")
    started = subprocess.Popen(["bash", str(folder / "run.sh")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHON": sys.executable, "MPI_MAGIC_CACHE_DIR": cache_dir})
    try:
        deadline = time.monotonic() + 60
        ranks: list[psutil.Process] = []
        while len(ranks) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
            ranks = [p for p in psutil.Process(started.pid).children(recursive=True)
                     if command_of(p).split()[1:3] == ["-m", "mpi_magic.runtime"]]
        assert len(ranks) == 2
        job_processes = psutil.Process(started.pid).children(recursive=True)
        started.send_signal(signal.SIGTERM)  # as CI cancels a run
        out, err = started.communicate(timeout=60)
    finally:
        started.kill()
    assert started.returncode == 128 + signal.SIGTERM, err
    assert "interrupted: stopping job export-" in err and "nothing of it is left running" in err
    assert not [p for p in job_processes if p.is_running()]


def test_a_value_that_cannot_be_written_is_named_at_export_and_nothing_is_written(ip, tmp_path):
    ip.run_line_magic("mpirun_config", "view=text")
    ip.user_ns["source"] = str(tmp_path / "data.txt")
    run(ip, "-g 1", "print(source)\n")
    ip.user_ns["source"] = open(__file__)  # noqa: SIM115 - the notebook rebinds it to an open file
    try:
        with pytest.raises(mpi_magic.CaptureError) as refused:
            ip.run_line_magic("mpirun_export", f"--to {tmp_path / 'exported'}")
    finally:
        ip.user_ns["source"].close()
    assert str(refused.value) == (f"source (_io.TextIOWrapper) cannot be sent to the ranks: it is an open file of this "
                                  f"process ({__file__!r}); pass the file's path instead and open it inside the cell")
    assert not (tmp_path / "exported").exists()


def test_export_names_what_it_cannot_export_in_a_sentence(ip, tmp_path):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="^no job of this notebook to export yet: run a %%mpirun_remote cell first$"):
        ip.run_line_magic("mpirun_export", "")
    ip.run_line_magic("mpirun_config", "view=text")
    run(ip, "-g 1 --out job", "x = 1\n")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match=f"^{tmp_path}/busy holds files of its own: choose an empty or new folder "
                                         "with --to$"):
        ip.run_line_magic("mpirun_export", f"--to {tmp_path / 'busy'}")
    with pytest.raises(UsageError, match="^nothing is neither a job handle nor one of this notebook's recent jobs"):
        ip.run_line_magic("mpirun_export", "nothing")
