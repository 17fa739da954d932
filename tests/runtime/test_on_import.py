"""Code run right after a module's import, on a rank: the module is then as its own loader left it."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import inspect, sys
from mpi_magic.runtime import on_import
seen = []
on_import.after_import("colorsys", seen.append)
import colorsys
assert seen == [colorsys], seen
print(type(colorsys.__loader__).__name__, type(colorsys.__spec__.loader).__name__,
      "def rgb_to_yiq" in inspect.getsource(colorsys))
"""


def test_a_module_given_code_to_run_after_its_import_keeps_its_own_loader_and_source():
    shown = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == ["SourceFileLoader", "SourceFileLoader", "True"]
