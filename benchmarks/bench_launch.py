"""Launch overhead: a trivial 4-rank cell through %%mpirun_remote versus bare mpirun, same code.

Baselines, measured in the same run: bare `mpirun -np 4 python -c CODE` with Open MPI's default
transports, and with the shared-memory transports the local backend selects. Then where the
difference goes, stretch by stretch, the magic beside bare mpirun running the same code with a
time stamp at its start and end: the notebook's work before the launch, the ranks' start-up (from
the launch to the last rank's first event, against bare Python's start), the ranks' payload and
cell, the last rank's end until the launcher's exit is seen, and the notebook's work after it.
With more ranks than cores the ranks take turns, so what a rank does before its first event also
shortens the next stretch: the two together compare best.

``--installed`` measures the same against a regular (not editable) install of this checkout,
built into a scratch folder and removed afterwards, as a user's environment has it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

from _common import bare_launch, bare_mpirun, interleaved, median, shell

import mpi_magic
from mpi_magic.backends import launcher
from mpi_magic.backends.local import backend as local
from mpi_magic.notebook.job import Job
from mpi_magic.shared import events

CODE = "from mpi4py import MPI; MPI.COMM_WORLD.allreduce(1)"
# the same, stamped as it starts and as it ends (by time.time(), as the ranks stamp their events)
STAMPED = "import time; began = time.time(); " + CODE + "; print(began, time.time())"
CELL = "from mpi4py import MPI\nMPI.COMM_WORLD.allreduce(1)\n"
LINE = "-i 2 -g 2 --quiet"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--installed", action="store_true",
                        help="run against a regular install of this checkout, made in a scratch folder")
    args = parser.parse_args()
    if args.installed:
        sys.exit(run_installed([arg for arg in sys.argv[1:] if arg != "--installed"]))
    print(f"mpi_magic from {os.path.dirname(mpi_magic.__file__)}")
    if sys.flags.dont_write_bytecode and not os.path.exists(importlib.util.cache_from_source(local.__file__)):
        print("note: PYTHONDONTWRITEBYTECODE is set and mpi_magic is not compiled, so every rank compiles it "
              f"anew: python -m compileall {os.path.dirname(mpi_magic.__file__)} (or unset the variable)")
    ip = shell()
    ip.run_cell_magic("mpirun_remote", LINE, CELL)  # warm the page cache
    magic, tuned, default = interleaved([lambda: ip.run_cell_magic("mpirun_remote", LINE, CELL),
                                         bare_launch(4, CODE, tuned=True),
                                         bare_launch(4, CODE, tuned=False)], args.repeats)
    print(f"launch, 4 ranks, median of {args.repeats} rounds, each taking the three in turn:")
    print(f"  %%mpirun_remote {LINE}   {median(magic):6.3f} s")
    print(f"  bare mpirun, shared-memory btl      {median(tuned):6.3f} s")
    print(f"  bare mpirun, Open MPI defaults      {median(default):6.3f} s")
    print(f"  ratio magic / bare (same transports) = {median(magic) / median(tuned):.2f}")
    print(f"  ratio magic / bare (Open MPI defaults) = {median(magic) / median(default):.2f}")
    breakdown(ip, args.repeats)


# Each stretch of a run, between two of its marks: the cell began, the launcher was started, every rank
# started (the magic's: its first event, after the runtime's start-up; bare's: its Python's first line),
# the last rank's cell ended, the launcher's exit was seen, the cell ended.
STRETCHES = [("notebook before the launch", "began", "launched"),
             ("launch until every rank started", "launched", "started"),
             ("every rank started until the last cell ended", "started", "done"),
             ("launch until the last cell ended (the two)", "launched", "done"),
             ("last cell's end until the exit is seen", "done", "exit_seen"),
             ("notebook after the exit", "exit_seen", "ended"),
             ("in all", "began", "ended")]


def breakdown(ip, repeats: int) -> None:
    """Median milliseconds of each stretch of a cell and of bare mpirun's run, taking turns, from
    wall-clock marks (the ranks stamp their events; bare Python prints its stamps)."""
    marks: dict[str, float] = {}
    record, launch = Job.record, local.LocalJob.__init__

    def launching(self, *args, **kwargs):
        marks["launch"] = time.time()
        launch(self, *args, **kwargs)

    def seen(self, event):
        if isinstance(event, events.RankStarted):
            marks["started"] = max(marks.get("started", 0.0), event.time)
        elif isinstance(event, events.RankFinished):
            marks["cell_done"] = max(marks.get("cell_done", 0.0), event.time)
        elif isinstance(event, events.LauncherExited):
            marks["exit_seen"] = time.time()
        record(self, event)

    magic: list[dict[str, float]] = []
    bare: list[dict[str, float]] = []

    def run_magic() -> None:
        marks.clear()
        began = time.time()
        ip.run_cell_magic("mpirun_remote", LINE, CELL)
        magic.append({"began": began, "launched": marks["launch"], "started": marks["started"],
                      "done": marks["cell_done"], "exit_seen": marks["exit_seen"], "ended": time.time()})

    argv, env = bare_mpirun(4, STAMPED, tuned=True)
    variable = launcher.tmpdir_variable(launcher.find_launcher(os.environ.get("MPI_MAGIC_MPIRUN")))

    def run_bare() -> None:
        began = time.time()  # (the magic's launch makes the launcher's folder too)
        with tempfile.TemporaryDirectory(prefix="mpi_magic_bench_mpirun_") as folder:
            out = subprocess.run(argv, env={**env, variable: folder} if variable else env, check=True,
                                 stdout=subprocess.PIPE, text=True).stdout
            ended = time.time()
        stamps = [tuple(map(float, line.split()[-2:])) for line in out.splitlines()]  # (after the rank's tag)
        bare.append({"began": began, "launched": began, "started": max(s for s, _ in stamps),
                     "done": max(e for _, e in stamps), "exit_seen": ended, "ended": ended})

    local.LocalJob.__init__, Job.record = launching, seen
    try:
        interleaved([run_magic, run_bare], repeats)
    finally:
        local.LocalJob.__init__, Job.record = launch, record
    print(f"  where the difference goes (median of {repeats} more rounds, each taking the two in turn):")
    print(f"    {'':<46} {'magic':>8} {'bare':>8} {'more':>8}")
    for name, start, end in STRETCHES:
        ours, theirs = (median([1000 * (run[end] - run[start]) for run in runs]) for runs in (magic, bare))
        print(f"    {name:<46} {ours:6.1f}ms {theirs:6.1f}ms {ours - theirs:+6.1f}ms")


def run_installed(argv: list[str]) -> int:
    """Run this benchmark again against a regular install of the checkout: a scratch virtual
    environment whose packages are this environment's (read through a path file, so none of this
    environment's own path files, an editable install's hook among them, runs), with mpi_magic
    built from a copy of the checkout (so no build left in it, or found there, gets in) and
    installed into it, compiled. Run from the scratch folder, so that neither the notebook nor its
    ranks import the checkout itself."""
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory(prefix="mpi_magic_bench_install_") as scratch:
        source = os.path.join(scratch, "checkout")
        shutil.copytree(checkout, source, ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__"))
        environment = os.path.join(scratch, "venv")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", environment], check=True)
        python = os.path.join(environment, "bin", "python")
        packages = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                  check=True, capture_output=True, text=True).stdout.strip()
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--target", packages, source], check=True)
        with open(os.path.join(packages, "_bench_packages.pth"), "w") as f:
            f.write("\n".join(dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])) + "\n")
        environ = {name: value for name, value in os.environ.items()
                   if name not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
        subprocess.run([python, "-m", "compileall", "-q", os.path.join(packages, "mpi_magic")], check=True,
                       env=environ)
        return subprocess.run([python, os.path.abspath(__file__), *argv], cwd=scratch, env=environ).returncode


if __name__ == "__main__":
    main()
