"""The suite on a machine without what ``./dev.sh test`` installs where it can (Chromium, MPICH,
Slurm): the tests that need what is missing are skipped, each saying what to install, and the run passes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))


def test_without_chromium_the_browser_tests_are_skipped_saying_what_to_install(tmp_path):
    browser_tests = [os.path.join(TESTS, "view", name) for name in ("test_browser.py", "test_browser_layouts.py")]
    env = {**os.environ, "MPI_MAGIC_CHROMIUM": str(tmp_path / "chromium")}  # no such file
    # --setup-only: a test that is not skipped has its fixtures set up, and nothing more
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-rs", "--setup-only",
                          *browser_tests], cwd=os.path.dirname(TESTS), env=env, capture_output=True, text=True,
                         timeout=100)
    summary = run.stdout.strip().splitlines()[-1]
    assert run.returncode == 0 and re.fullmatch(r"=+ \d+ skipped in [\d.]+s( \(\d+:\d\d:\d\d\))? =+", summary), run.stdout + run.stderr
    reasons = {line.split(": ", 1)[1] for line in run.stdout.splitlines() if line.startswith("SKIPPED")}
    assert reasons == {f"the browser tests need Chromium at {tmp_path / 'chromium'}: apt-get install chromium "
                       "(./dev.sh test installs it, as root)"}


# Run as the interrupted run's parent: a child subreaper (Linux), so that whatever the run leaves behind,
# however it was started, is reparented here and found. Once the run has ended and what is ending has had
# GRACE seconds, it writes the command lines of what is left to REPORT, ends those, and exits.
SUBREAPER = """
import ctypes, json, os, signal, subprocess, sys, time
import psutil

report, grace, command = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
signal.signal(signal.SIGINT, lambda *_: None)  # the interrupt is the run's (a handler is not inherited)
subprocess.run(command)


def left():
    while True:  # reap what has ended
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                found.append((process, process.cmdline()))
        except psutil.Error:
            pass
    return found


deadline = time.monotonic() + grace
while left() and time.monotonic() < deadline:
    time.sleep(0.2)
remaining = left()
with open(report, "w") as f:
    json.dump([command for _, command in remaining], f)
for process, _ in remaining:
    try:
        process.kill()
    except psutil.Error:
        pass
"""
ROOT = os.path.dirname(TESTS)
# what the interrupted run runs, each in a file of its own (so on a worker of its own), each waiting to be
# interrupted: a SageMaker job on the emulator, JupyterLab with a kernel, a job on the tests' Slurm cluster
INTERRUPTED = [os.path.join("tests", "interrupted_run", name) for name in ("sagemaker_job.py", "jupyterlab.py",
                                                                          "slurm_job.py")]
SAGEMAKER, JUPYTER, SLURM = "an emulated instance's Open MPI daemon", "JupyterLab's kernel", "a Slurm job's rank"


def _running(processes: list) -> set[str]:
    """Which of what the run is waited for to have started runs among ``processes``."""
    found = set()
    for process in processes:
        try:
            command = " ".join(process.cmdline())
            if "prted" in command and "SAGEMAKER_BASE_DIR" in process.environ():
                found.add(SAGEMAKER)
            elif "ipykernel_launcher" in command:
                found.add(JUPYTER)
            elif "mpi_magic.runtime" in command and "SLURM_JOB_ID" in process.environ():
                found.add(SLURM)
        except psutil.Error:
            pass
    return found


@pytest.mark.timeout(600)
@pytest.mark.parametrize("workers_killed", [False, True], ids=["interrupted", "interrupted and its workers killed"])
def test_an_interrupted_run_leaves_no_process_or_server_of_its_own(tmp_path, workers_killed):
    """Ctrl-C on the suite as a terminal sends it, SIGINT to the run's process group, while its workers
    have a SageMaker job on the emulator, JupyterLab and a Slurm job running (each where this machine
    has what it needs): the run ends, and nothing it started is left running or listening. Also where
    the workers are then killed before their fixtures' teardown could run, as xdist kills a worker that
    has not ended 10 s after the interrupt (here at once, however long the teardown would take)."""
    from browser import CHROMIUM

    from mpi_magic.testing.slurm_cluster import missing_programs

    awaited = {SAGEMAKER} | ({JUPYTER} if os.access(CHROMIUM, os.X_OK) else set()) | \
        (set() if missing_programs() else {SLURM})
    report = tmp_path / "left.json"
    # as ./dev.sh test runs the suite, in a process group of its own as a terminal's foreground job
    run = subprocess.Popen([sys.executable, "-c", SUBREAPER, str(report), "20", sys.executable, "-m", "pytest",
                            "-p", "no:cacheprovider", "-n", "3", "--dist", "loadscope", "-q", *INTERRUPTED],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    listened: set[int] = set()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and run.poll() is None:
            descendants = psutil.Process(run.pid).children(recursive=True)
            pids = {p.pid for p in descendants}
            listened |= {c.laddr.port for c in psutil.net_connections("inet") if c.status == "LISTEN" and c.pid in pids}
            if _running(descendants) >= awaited:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"the run never had all of {sorted(awaited)} running:\n{run.communicate()[0]}")
        assert listened, "the run's servers listen on ports of their own"
        workers = [worker for pytest_run in psutil.Process(run.pid).children() for worker in pytest_run.children()]
        os.killpg(run.pid, signal.SIGINT)
        for worker in workers if workers_killed else []:
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):  # (one may have ended on the SIGINT)
                worker.kill()
        shown, _ = run.communicate(timeout=180)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert json.loads(report.read_text()) == [], shown[-3000:]
    still = {c.laddr.port for c in psutil.net_connections("inet") if c.status == "LISTEN"} & listened
    assert not still, f"ports the run opened are still listened on: {sorted(still)}"
