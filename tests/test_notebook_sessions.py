"""The sessions notebook executes in a real kernel: one session, several cells, its end."""

from __future__ import annotations

import os
import re

import nbformat
from nbclient import NotebookClient

NOTEBOOK = os.path.join(os.path.dirname(__file__), os.pardir, "notebooks", "sessions.ipynb")


def _text(cell) -> str:
    return "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in cell.outputs)


def test_sessions_notebook_runs_cells_on_one_session_and_stops_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MPI_MAGIC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MPI_MAGIC_VIEW", "text")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    code = {c.source.splitlines()[0] if not c.source.startswith("%%time") else c.source: c
            for c in nb.cells if c.cell_type == "code"}
    shown = {source: _text(cell) for source, cell in code.items()}
    assert "4 ranks ready in" in shown["%mpirun_session start -i 2 -g 2 --idle-timeout 600 --out session"]
    assert "2000000 [3. 3. 3. 3. 3. 3. 3. 3.]" in shown["print(count, mean.round(2))"]
    sent = re.search(r"bytes sent: (\d+) then (\d+)", "".join(shown.values()))
    assert sent and sent[1] == sent[2] and int(sent[1]) > 0, "weights crossed once"
    status = shown["%mpirun_session"]
    assert ", idle" in status and "ranks alive: 4/4, cells run: 5" in status
    assert "stopped: 5 cells run, nothing of it is left running" in shown["%mpirun_session stop"]
