"""notebooks/tracking.ipynb runs in a real kernel: its jobs and its session become MLflow runs (in a
SQLite store in the kernel's folder), which it reads back through MLflow's client."""

from __future__ import annotations

import re

import pytest
from notebook_runs import code_cell, executed, text_of

pytest.importorskip("mlflow", reason="MLflow is not installed here: pip install 'mlflow>=2.16'")


@pytest.mark.timeout(300)
def test_tracking_records_a_job_a_failure_and_a_session_as_runs(tmp_path):
    nb = executed("tracking.ipynb", tmp_path)
    job = text_of(code_cell(nb, "client = mlflow.MlflowClient()").outputs)
    assert job.startswith("True FINISHED\n"), job
    assert "{'backend': 'local', 'instances': '2', 'procs_per_instance': '2', 'world_size': '4'}" in job
    assert "loss: 20 points, steps 0-19, last 0.050" in job and "rank3/loss: 20 points, steps 0-19, last 0.200" in job
    assert re.search(r"\['logs', 'summary.html'\]$", job.strip()), job
    failed = text_of(code_cell(nb, "(failed,) = client.search_runs").outputs)
    assert re.fullmatch(r"2 \| rank 2 \(instance 1, [^)]+\) raised ValueError: a bad batch", failed.strip()), failed
    session = text_of(code_cell(nb, "%mpirun_session stop").outputs)
    assert "FINISHED [(0, 1.0), (1, 0.5), (2, 0.33), (3, 0.3), (4, 0.15), (5, 0.1)]" in session, session
    assert (tmp_path / "mlflow.db").exists(), "the notebook's store is in its own folder"
