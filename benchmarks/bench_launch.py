"""Launch overhead: a trivial 4-rank cell through %%mpirun_remote versus bare mpirun, same code.

Baselines, measured in the same run: bare `mpirun -np 4 python -c CODE` with Open MPI's default
transports, and with the shared-memory transports the local backend selects. A breakdown says
where a cell's time goes: the notebook before mpirun starts, mpirun until the last rank reports
it started (process start, imports, payload read), the cells, the last rank's end until the
launcher's exit is seen, and the notebook after that (results, summary).
"""

from __future__ import annotations

import argparse
import time

from _common import bare_launch, interleaved, median, shell

from mpi_magic.shared import events
from mpi_magic.backends import local
from mpi_magic.notebook.job import Job

CODE = "from mpi4py import MPI; MPI.COMM_WORLD.allreduce(1)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    ip = shell()
    cell = "from mpi4py import MPI\nMPI.COMM_WORLD.allreduce(1)\n"
    ip.run_cell_magic("mpirun_remote", "-i 2 -g 2 --quiet", cell)  # warm the page cache
    magic, tuned, default = interleaved([lambda: ip.run_cell_magic("mpirun_remote", "-i 2 -g 2 --quiet", cell),
                                         bare_launch(4, CODE, tuned=True),
                                         bare_launch(4, CODE, tuned=False)], args.repeats)
    print(f"launch, 4 ranks, median of {args.repeats} rounds, each taking the three in turn:")
    print(f"  %%mpirun_remote -i 2 -g 2          {median(magic):6.3f} s")
    print(f"  bare mpirun, shared-memory btl     {median(tuned):6.3f} s")
    print(f"  bare mpirun, Open MPI defaults     {median(default):6.3f} s")
    print(f"  ratio magic / bare (same transports) = {median(magic) / median(tuned):.2f}")
    print(f"  ratio magic / bare (Open MPI defaults) = {median(magic) / median(default):.2f}")
    breakdown(ip, cell, args.repeats)


def breakdown(ip, cell: str, repeats: int) -> None:
    """Median seconds of each stretch of a cell, from wall-clock marks (ranks stamp their events)."""
    marks: dict[str, float] = {}
    record, launch = Job.record, local.LocalJob.__init__

    def spawned(self, *args, **kwargs):
        marks["mpirun"] = time.time()
        launch(self, *args, **kwargs)

    def seen(self, event):
        if isinstance(event, events.RankStarted):
            marks["started"] = max(marks.get("started", 0.0), event.time)
        elif isinstance(event, events.RankFinished):
            marks["cell_done"] = max(marks.get("cell_done", 0.0), event.time)
        elif isinstance(event, events.LauncherExited):
            marks["exit_seen"] = time.time()
        record(self, event)

    stretches: dict[str, list[float]] = {}
    local.LocalJob.__init__, Job.record = spawned, seen
    try:
        for _ in range(repeats):
            marks.clear()
            began = time.time()
            ip.run_cell_magic("mpirun_remote", "-i 2 -g 2 --quiet", cell)
            ended = time.time()
            points = [("notebook before mpirun", began, marks["mpirun"]),
                      ("mpirun until every rank started", marks["mpirun"], marks["started"]),
                      ("ranks: payload and cell", marks["started"], marks["cell_done"]),
                      ("last rank's end until the exit is seen", marks["cell_done"], marks["exit_seen"]),
                      ("notebook after the exit", marks["exit_seen"], ended)]
            for name, start, end in points:
                stretches.setdefault(name, []).append(end - start)
    finally:
        local.LocalJob.__init__, Job.record = launch, record
    print(f"  where a cell's time goes (median of {repeats} more runs):")
    for name, values in stretches.items():
        print(f"    {name:<40} {1000 * median(values):6.1f} ms")
    totals = [sum(parts) for parts in zip(*stretches.values())]
    print(f"    {'in all':<40} {1000 * median(totals):6.1f} ms")


if __name__ == "__main__":
    main()
