"""Launch overhead: a trivial 4-rank cell through %%mpirun_remote versus bare mpirun, same code.

Baselines, measured in the same run: bare `mpirun -np 4 python -c CODE` with Open MPI's default
transports, and with the shared-memory transports the local backend selects.
"""

from __future__ import annotations

import argparse

from _common import median, run_bare, shell, timed

CODE = "from mpi4py import MPI; MPI.COMM_WORLD.allreduce(1)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    ip = shell()
    cell = "from mpi4py import MPI\nMPI.COMM_WORLD.allreduce(1)\n"
    ip.run_cell_magic("mpirun_remote", "-i 2 -g 2 --quiet", cell)  # warm the page cache
    magic = timed(lambda: ip.run_cell_magic("mpirun_remote", "-i 2 -g 2 --quiet", cell), args.repeats)
    tuned = timed(lambda: run_bare(4, CODE, tuned=True), args.repeats)
    default = timed(lambda: run_bare(4, CODE, tuned=False), args.repeats)
    print(f"launch, 4 ranks, median of {args.repeats}:")
    print(f"  %%mpirun_remote -i 2 -g 2          {median(magic):6.3f} s")
    print(f"  bare mpirun, shared-memory btl     {median(tuned):6.3f} s")
    print(f"  bare mpirun, Open MPI defaults     {median(default):6.3f} s")
    print(f"  ratio magic / bare (same transports) = {median(magic) / median(tuned):.2f}")
    print(f"  ratio magic / bare (Open MPI defaults) = {median(magic) / median(default):.2f}")


if __name__ == "__main__":
    main()
