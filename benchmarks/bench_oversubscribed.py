"""More ranks than cores: small collectives while Open MPI's ranks yield, against busy-polling.

Open MPI's ranks busy-poll while they wait in MPI unless it counts more ranks than slots, and it
counts what mpirun is told (here ``--host localhost:N``, as a hostfile would say), not the cores.
With more ranks than cores the local backend sets ``OMPI_MCA_mpi_yield_when_idle=1`` for the ranks.
Measured in the same run, each round taking the three in turn: the magic as it runs the cell, the
magic with the ranks made to busy-poll (``--env OMPI_MCA_mpi_yield_when_idle=0``, as before it set
it), and bare mpirun running the same code with the ranks yielding (the baseline).
"""

from __future__ import annotations

import argparse
import os

from _common import bare_mpirun, interleaved, median, shell

CODE = ("from mpi4py import MPI\n"
        "comm = MPI.COMM_WORLD\n"
        "for step in range({rounds}):\n"
        "    comm.allreduce(step)\n"
        "    comm.bcast(step, root=step % comm.size)\n"
        "    comm.barrier()\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=300, help="allreduce + bcast + barrier rounds of the cell")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    if args.ranks <= cores:
        print(f"note: {args.ranks} ranks on {cores} cores are not more ranks than cores; --ranks {2 * cores} shows it")
    code = CODE.format(rounds=args.rounds)
    hosts = f'--mpirun-args="--host localhost:{args.ranks}"'
    line = f"-i 1 -g {args.ranks} --quiet {hosts}"
    ip = shell()

    def magic(*extra: str):
        return lambda: ip.run_cell_magic("mpirun_remote", " ".join([line, *extra]), code)

    argv, env = bare_mpirun(args.ranks, code, tuned=True)
    argv[1:1] = ["--host", f"localhost:{args.ranks}"]
    env["OMPI_MCA_mpi_yield_when_idle"] = "1"

    def bare() -> None:
        import subprocess

        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)

    yielding, polling, baseline = interleaved([magic(), magic("--env OMPI_MCA_mpi_yield_when_idle=0"), bare],
                                              args.repeats)
    print(f"{args.ranks} ranks on {cores} cores, {args.rounds} rounds of small collectives, "
          f"median of {args.repeats} rounds taking the three in turn:")
    print(f"  %%mpirun_remote (ranks yield)              {median(yielding):7.2f} s")
    print(f"  %%mpirun_remote, ranks made to busy-poll   {median(polling):7.2f} s")
    print(f"  bare mpirun, ranks yield                   {median(baseline):7.2f} s")
    print(f"  ratio magic / bare = {median(yielding) / median(baseline):.2f}")
    print(f"  ratio busy-polling / yielding = {median(polling) / median(yielding):.1f}")


if __name__ == "__main__":
    main()
