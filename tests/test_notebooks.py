"""The demo notebook executes in a real kernel: with the widget dashboard, and headless as text."""

from __future__ import annotations

import os

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = os.path.join(os.path.dirname(__file__), os.pardir, "notebooks")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _execute(tmp_path, monkeypatch, view: str):
    monkeypatch.setenv("MPI_MAGIC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MPI_MAGIC_VIEW", view)
    nb = nbformat.read(os.path.join(NOTEBOOKS, "quickstart.ipynb"), as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    mpi_cell = next(c for c in nb.cells if c.source.startswith("%%mpirun_remote"))
    return nb, mpi_cell.outputs


def _text(outputs) -> str:
    return "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)


def _check_results(nb) -> None:
    last = _text(nb.cells[-1].outputs).splitlines()
    assert last[0] == "3120.0"
    assert "completed: 4 ranks (4 completed)" in last[1]
    assert last[2] == "[(0, 0, 12, 12), (1, 0, 12, 12), (2, 1, 12, 12), (3, 1, 12, 12)]"


def test_quickstart_in_a_kernel_shows_the_dashboard_then_the_summary_in_its_place(tmp_path, monkeypatch):
    nb, outputs = _execute(tmp_path, monkeypatch, "auto")
    models = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"].values()
    bars = [m["state"] for m in models if m["model_name"] == "FloatProgressModel"]
    assert len(bars) == 5, "the dashboard was drawn: the aggregate bar and one per rank"
    assert all(b["value"] == b["max"] and b["bar_style"] == "success" for b in bars[1:])
    kinds = [mime for o in outputs for mime in o.get("data", {})]
    assert WIDGET_VIEW not in kinds, "the saved notebook keeps the summary, not the widget"
    assert outputs[0]["output_type"] == "display_data", "the summary sits above the printed lines"
    summary = outputs[0].data["text/html"].replace(" style='text-align:left'", "")
    assert summary.count("<td>completed</td>") == 4 and summary.count("<td>12/12</td>") == 4
    assert "4 ranks agree: total = 3120.0" in _text(outputs)
    _check_results(nb)


def test_quickstart_headless_prints_each_ranks_progress(tmp_path, monkeypatch):
    nb, outputs = _execute(tmp_path, monkeypatch, "text")
    shown = _text(outputs)
    progress = [line for line in shown.splitlines() if " running " in line]
    per_rank = [i for i, line in enumerate(progress) if "; ranks 0:" in line and " 3:" in line]
    assert per_rank, "progress lines with every rank's share are printed while the job runs"
    assert len(per_rank) == len(progress) - per_rank[0], "once a rank reports progress, every line lists each rank"
    assert WIDGET_VIEW not in [mime for o in outputs for mime in o.get("data", {})]
    _check_results(nb)

