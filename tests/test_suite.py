"""The suite on a machine without what ``./dev.sh test`` installs where it can (Chromium, MPICH,
Slurm): the tests that need what is missing are skipped, each saying what to install, and the run passes."""

from __future__ import annotations

import os
import re
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))


def test_without_chromium_the_browser_tests_are_skipped_saying_what_to_install(tmp_path):
    browser_tests = [os.path.join(TESTS, "view", name) for name in ("test_browser.py", "test_browser_layouts.py")]
    env = {**os.environ, "MPI_MAGIC_CHROMIUM": str(tmp_path / "chromium")}  # no such file
    # --setup-only: a test that is not skipped has its fixtures set up, and nothing more
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-rs", "--setup-only",
                          *browser_tests], cwd=os.path.dirname(TESTS), env=env, capture_output=True, text=True,
                         timeout=100)
    summary = run.stdout.strip().splitlines()[-1]
    assert run.returncode == 0 and re.fullmatch(r"=+ \d+ skipped in [\d.]+s =+", summary), run.stdout + run.stderr
    reasons = {line.split(": ", 1)[1] for line in run.stdout.splitlines() if line.startswith("SKIPPED")}
    assert reasons == {f"the browser tests need Chromium at {tmp_path / 'chromium'}: apt-get install chromium "
                       "(./dev.sh test installs it, as root)"}
