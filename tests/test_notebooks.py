"""The demo notebooks execute headless, as the quick start runs them."""

from __future__ import annotations

import os

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = os.path.join(os.path.dirname(__file__), os.pardir, "notebooks")


def _text(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", ""))
        parts.append(output.get("data", {}).get("text/plain", ""))
    return "".join(parts)


def test_quickstart_runs_and_brings_values_back(tmp_path):
    nb = nbformat.read(os.path.join(NOTEBOOKS, "quickstart.ipynb"), as_version=4)
    env_cache = {"MPI_MAGIC_CACHE_DIR": str(tmp_path / "cache")}
    os.environ.update(env_cache)
    try:
        NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    finally:
        os.environ.pop("MPI_MAGIC_CACHE_DIR")
    mpi_cell = next(c for c in nb.cells if c.source.startswith("%%mpirun_remote"))
    shown = _text(mpi_cell)
    for rank in range(4):
        assert f"[rank {rank}] step 5/5 on instance {rank // 2}" in shown
    assert "4 ranks agree: total = 600.0" in shown
    last = _text(nb.cells[-1])
    assert last.splitlines()[0] == "600.0"
    assert "completed: 4 ranks (4 completed)" in last
