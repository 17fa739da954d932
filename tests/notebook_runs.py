"""Running the demo notebooks for the tests: each executes in a real kernel through
notebooks/execute.py (as ``./dev.sh notebooks`` runs them), and its cells are found by their first line."""

from __future__ import annotations

import os
import re
import sys

NOTEBOOKS = os.path.join(os.path.dirname(__file__), os.pardir, "notebooks")
sys.path.insert(0, NOTEBOOKS)
import execute  # noqa: E402  (notebooks/execute.py)

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
DURATION = r"(?:\d+h\d\dm|(?:\d+m)?[\d.]+s)"  # a time as the view writes it: 4.2s, 1m04s, 1h02m
RUNNING_LINE = re.compile(r"mpi_magic: job \S+ \(.*\) (starting|running) ")  # the text view's lines while a job starts and runs


def stored_notebook(name: str):
    """The notebook as the repository holds it."""
    import nbformat  # here: every worker imports this module, and nbformat (jsonschema) takes seconds to import

    return nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)


def executed(name: str, tmp_path, view: str = "text", cloud: dict | None = None):
    """The notebook as it ran now, its jobs kept under ``tmp_path``."""
    env = {"MPI_MAGIC_CACHE_DIR": str(tmp_path / "cache"), "MPI_MAGIC_VIEW": view, **(cloud or {})}
    return execute.run(os.path.join(NOTEBOOKS, name), env, str(tmp_path))


def code_cell(nb, first_line: str):
    return next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith(first_line))


def text_of(outputs) -> str:
    return "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") + o.get("evalue", "")
                   for o in outputs)
