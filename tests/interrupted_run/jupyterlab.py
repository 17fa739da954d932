"""Waits, JupyterLab running a kernel, to be interrupted by ``test_suite``'s interrupted run; not a test
of the suite's own (not test_*.py)."""

import os
import time

import nbformat
import pytest


@pytest.mark.timeout(600)
def test_jupyterlab_with_a_kernel(jupyter):
    server = jupyter()
    nbformat.write(nbformat.v4.new_notebook(), os.path.join(server.root, "waiting.ipynb"))
    server.start_kernel("waiting.ipynb")
    time.sleep(600)
