"""Slurm: a trivial 4-rank cell (2 nodes x 2) through %%mpirun_remote --backend slurm, against Slurm
run by hand on the same code, and a session's warm cell against a local session's of the same shape.

Baselines, measured in the same run, taking turns with the magic: ``srun --mpi=pmix`` of the code
(the quickest way to run it on an allocation), as it comes and with the transports the magic picks on
nodes without a fabric device (Open MPI's libfabric left out); ``salloc`` running ``mpirun`` here, in
the allocation it holds (mpirun starts its daemons on the nodes through srun), and ``salloc`` running
``srun``, both with those transports; and ``sbatch --wait`` of a script running ``mpirun`` (what the
backend submits, waited for by Slurm's own client, which polls the job). Uses the cluster SLURM_CONF
points at, else starts one on this machine (``mpi_magic.testing.slurm_cluster``) and stops it at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

from _common import interleaved, median, shell, warm_cells

from mpi_magic.backends import launcher
from mpi_magic.shared import fabric

CODE = "from mpi4py import MPI; MPI.COMM_WORLD.allreduce(1)"
CELL = "from mpi4py import MPI\nMPI.COMM_WORLD.allreduce(1)\n"


@contextlib.contextmanager
def cluster() -> Iterator[None]:
    if os.environ.get("SLURM_CONF"):
        yield
        return
    from mpi_magic.testing.slurm_cluster import SlurmCluster

    started = SlurmCluster(tempfile.mkdtemp(prefix="mpi_magic_bench_slurm_"), nodes=4).start()
    print(started.layout)
    os.environ.update(started.environ)
    try:
        yield
    finally:
        started.stop(remove=True)


def bare_srun(environ: dict[str, str] | None = None) -> None:
    subprocess.run(["srun", "-N", "2", "--ntasks-per-node=2", "--mpi=pmix", sys.executable, "-c", CODE],
                   check=True, stdout=subprocess.DEVNULL, env={**os.environ, **(environ or {})})


def bare_srun_without_libfabric() -> None:
    """As the magic runs ranks on nodes without a fabric device (``mpi_magic.shared.fabric``)."""
    bare_srun({f"OMPI_MCA_{name}": value for name, value in fabric.LEFT_OUT.items()})


def bare_salloc(launch: str):
    """``salloc`` of the job's shape running ``launch`` (mpirun or srun) on this machine, in the allocation."""
    if launch == "mpirun":
        argv = [launcher.find_launcher(os.environ.get("MPI_MAGIC_MPIRUN")).path, "-np", "4"]
    else:
        argv = ["srun", "--mpi=pmix"]
    env = {**os.environ, **{f"OMPI_MCA_{name}": value for name, value in fabric.LEFT_OUT.items()},
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}

    def run() -> None:
        subprocess.run(["salloc", "-Q", "-N", "2", "--ntasks-per-node=2", *argv, sys.executable, "-c", CODE],
                       check=True, stdout=subprocess.DEVNULL, env=env)

    return run


def bare_sbatch(folder: str):
    mpirun = launcher.find_launcher(os.environ.get("MPI_MAGIC_MPIRUN")).path
    script = os.path.join(folder, "bare.sh")
    with open(script, "w") as f:
        f.write(f"#!/bin/bash\nexport OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1\n"
                f"exec {mpirun} -np 4 {sys.executable} -c '{CODE}'\n")

    def run() -> None:
        subprocess.run(["sbatch", "--wait", "-N", "2", "--ntasks-per-node=2", f"--output={folder}/bare-%j.out", script],
                       check=True, stdout=subprocess.DEVNULL)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cells", type=int, default=20, help="warm cells timed on each session")
    args = parser.parse_args()
    with cluster(), tempfile.TemporaryDirectory(prefix="mpi_magic_bench_sbatch_") as folder:
        ip = shell()
        magic = lambda: ip.run_cell_magic("mpirun_remote", "--backend slurm -i 2 -g 2 --quiet", CELL)  # noqa: E731
        magic_srun = lambda: ip.run_cell_magic("mpirun_remote", "--backend slurm -i 2 -g 2 --srun --quiet", CELL)  # noqa: E731
        magic()  # warm the page cache
        cell, cell_srun, srun, srun_lean, salloc_mpirun, salloc_srun, sbatch = interleaved(
            [magic, magic_srun, bare_srun, bare_srun_without_libfabric, bare_salloc("mpirun"), bare_salloc("srun"),
             bare_sbatch(folder)], args.repeats)
        print(f"one-off cell, 2 nodes x 2 ranks, median of {args.repeats} rounds, each taking the seven in turn:")
        print(f"  %%mpirun_remote --backend slurm -i 2 -g 2          {median(cell):6.3f} s  (mpirun in the allocation)")
        print(f"  %%mpirun_remote --backend slurm -i 2 -g 2 --srun   {median(cell_srun):6.3f} s")
        print(f"  bare srun --mpi=pmix                                {median(srun):6.3f} s")
        print(f"  bare srun --mpi=pmix, btl and mtl ^ofi              {median(srun_lean):6.3f} s  (the magic's transports)")
        print(f"  bare salloc running mpirun here                     {median(salloc_mpirun):6.3f} s  (same transports)")
        print(f"  bare salloc running srun --mpi=pmix                 {median(salloc_srun):6.3f} s  (same transports)")
        print(f"  bare sbatch --wait of mpirun                        {median(sbatch):6.3f} s  (sbatch polls the job)")
        print(f"  ratio magic / bare srun with the same transports = {median(cell) / median(srun_lean):.2f}, "
              f"magic --srun / the same = {median(cell_srun) / median(srun_lean):.2f}; "
              f"magic / bare salloc running mpirun = {median(cell) / median(salloc_mpirun):.2f}")
        one_node = warm_cells(ip, "--backend slurm -i 1 -g 2", CELL, args.cells)
        local = warm_cells(ip, "-i 1 -g 2", CELL, args.cells)
        two_nodes = warm_cells(ip, "--backend slurm -i 2 -g 2", CELL, args.cells)
        local_four = warm_cells(ip, "-i 2 -g 2", CELL, args.cells)
        print(f"session, warm cell, median of {args.cells}:")
        print(f"  slurm session, 1 node x 2     {median(one_node) * 1000:7.1f} ms")
        print(f"  local session, 1 x 2          {median(local) * 1000:7.1f} ms")
        print(f"  slurm session, 2 nodes x 2    {median(two_nodes) * 1000:7.1f} ms  (MPI between the nodes over TCP)")
        print(f"  local session, 2 x 2          {median(local_four) * 1000:7.1f} ms  (the same 4 ranks on this one host)")
        print(f"  ratio slurm / local (1 x 2) = {median(one_node) / median(local):.2f}; "
              f"2 nodes x 2 / one host 2 x 2 = {median(two_nodes) / median(local_four):.2f}")


if __name__ == "__main__":
    main()
