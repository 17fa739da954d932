"""notebooks/tracking.ipynb runs in a real kernel: its jobs and its session become MLflow runs (in a
SQLite store in the kernel's folder), which it reads back through MLflow's client; then it reopens its
job in a new Python, and exports its job and its failing job, each run again by its run.sh."""

from __future__ import annotations

import ast
import pickle
import re

import pytest
from notebook_runs import code_cell, executed, text_of

TRACKED_CELL = "%%mpirun_remote --instances 2 --gpus 2 --mlflow notebook-demo --out job"
FAILING_CELL = "%%mpirun_remote --instances 2 --gpus 2 --mlflow notebook-demo\n"


@pytest.mark.timeout(300)
def test_tracking_records_a_job_a_failure_and_a_session_as_runs_then_reopens_and_exports_them(tmp_path):
    nb = executed("tracking.ipynb", tmp_path)
    job = text_of(code_cell(nb, "import time\n\nclient = mlflow.MlflowClient()").outputs)
    assert job.startswith("True FINISHED\n"), job
    assert "{'backend': 'local', 'instances': '2', 'procs_per_instance': '2', 'world_size': '4'}" in job
    assert "loss: 20 points, steps 0-19, last 0.050" in job and "rank3/loss: 20 points, steps 0-19, last 0.200" in job
    assert re.search(r"\['logs', 'summary.html'\]$", job.strip()), job
    failed = text_of(code_cell(nb, "failed = ended(client.search_runs").outputs)
    assert re.fullmatch(r"2 \| rank 2 \(instance 1, [^)]+\) raised ValueError: a bad batch", failed.strip()), failed
    session = text_of(code_cell(nb, "%mpirun_session stop").outputs)
    assert "FINISHED [(0, 1.0), (1, 0.5), (2, 0.33), (3, 0.3), (4, 0.15), (5, 0.1)]" in session, session
    assert (tmp_path / "mlflow.db").exists(), "the notebook's store is in its own folder"

    rank_output = _check_export(nb, tmp_path)
    _check_reopened(nb, rank_output[3])
    _check_failure_exported(nb, tmp_path)


def _summary(cell) -> str:
    """The summary a job's cell showed in its place."""
    (shown,) = [o for o in cell.outputs if o.output_type == "display_data"]
    return shown.data["text/plain"].strip()


def _shell_output(nb, first_line: str) -> str:
    """What a cell with a ``!`` line printed (the shell's lines end in \\r\\n, as on a terminal)."""
    return text_of(code_cell(nb, first_line).outputs).replace("\r\n", "\n")


def _job_name(summary: str) -> str:
    return re.match(r"mpi_magic: job (\S+) ", summary).group(1)


def _check_export(nb, tmp_path) -> dict[int, list[str]]:
    """The tracked job's cell, exported and run by run.sh, prints what each rank printed in the notebook and
    brings back what the cell assigned there; each rank's lines, as run.sh printed them."""
    tracked = code_cell(nb, TRACKED_CELL)
    folder = tmp_path / "exported"
    exported = text_of(code_cell(nb, "%mpirun_export job --to exported").outputs)
    assert f"job {_job_name(_summary(tracked))} exported to {folder}: bash {folder / 'run.sh'} runs it" in exported
    ran = _shell_output(nb, "!PYTHON={sys.executable} bash exported/run.sh").splitlines()
    rank_output = {rank: [line.removeprefix(f"[rank {rank}] ") for line in ran if line.startswith(f"[rank {rank}] ")]
                   for rank in range(4)}
    shown = [line for o in tracked.outputs if o.get("name") == "stdout" for line in o.text.splitlines() if line]
    assert rank_output[0] == shown, (ran, shown)  # (the notebook shows rank 0's output)
    assert [len(lines) for lines in rank_output.values()] == [2, 2, 2, 2], ran
    assert any(re.match(r"mpi_magic: job export-\S+ \(local, 2 x 2\) completed", line) for line in ran), ran
    assert ran[-1] == f"mpi_magic: results written to {folder / 'results.pickle'}: step, loss", ran
    values, equal = text_of(code_cell(nb, "import pickle").outputs).strip().rsplit(" ", 1)
    with open(folder / "results.pickle", "rb") as f:
        assert ast.literal_eval(values) == pickle.load(f)
    assert equal == "True", "the exported run brings back what the cell assigned in the notebook"
    return rank_output


def _check_reopened(nb, rank3_output: list[str]) -> None:
    """%mpirun_jobs lists both jobs; a new Python reopens the tracked one as the cell left it, and so does
    the notebook, whose reopened handle cannot be cancelled."""
    tracked, failed = (_summary(code_cell(nb, first)) for first in (TRACKED_CELL, FAILING_CELL))
    name = _job_name(tracked)
    kept = text_of(code_cell(nb, "%mpirun_jobs").outputs).splitlines()
    assert [(line.split()[0], line.split()[3]) for line in kept[1:]] == [(_job_name(failed), "failed"),
                                                                          (name, "completed")], kept
    status, summary = _shell_output(nb, "import sys").split("\n", 1)
    assert status == re.match(r"mpi_magic: job \S+ \(local, 2 x 2\) (\w+) ", tracked).group(1)
    assert summary.strip() == tracked, "the new Python's summary is the one the cell showed"
    reopened = text_of(code_cell(nb, "import mpi_magic\n\nreopened = mpi_magic.Job.load").outputs).splitlines()
    assert reopened[0] == "True True True", "status, metrics and logs as the job left them"
    assert reopened[1:-1] == rank3_output, "rank 3's log holds what it printed"
    assert reopened[-1] == f"job {name} was reopened after it ended (completed): there is nothing left to cancel"


def _check_failure_exported(nb, tmp_path) -> None:
    """The failing job, exported by name and run: its rank's traceback, exit status 1, no results."""
    folder = tmp_path / "exported_failure"
    failure = _shell_output(nb, "%mpirun_export {failed.info.run_name}")
    failed_name = _job_name(_summary(code_cell(nb, FAILING_CELL)))
    assert f"job {failed_name} exported to {folder}: bash {folder / 'run.sh'} runs it" in failure, failure
    assert re.search(r"^RemoteRankError: rank 2 \(instance 1, [^)]+\) raised ValueError: a bad batch$", failure, re.M)
    assert '    raise ValueError("a bad batch")\nValueError: a bad batch\n' in failure, failure
    assert failure.endswith("run.sh exited with status 1\n"), failure
    assert not (folder / "results.pickle").exists()
