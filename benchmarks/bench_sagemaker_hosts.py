"""A SageMaker rehearsal whose instances are hosts of their own, beside the same on this machine alone.

A one-off cell of ``--instances`` x ``--gpus`` ranks (16 x 2 by default) on the rehearsal cloud (moto
and the SageMaker emulator, pace none), first with each instance in a test host of its own
(``mpi_magic.testing.hosts``: the bootstrap starts sshd, the leader's mpirun reaches the others over
ssh), then with every instance on this machine (the ssh stand-in), ``--repeats`` times in turn. The
cell is one allreduce across every rank, so what is timed is the way to the ranks and back:
time to results (from the cell's start to its value in the notebook), and the job's own time as the
emulator reports it (CreateTrainingJob to TrainingEndTime). Runs as root (network namespaces).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from _common import rehearsal_shell

from mpi_magic.shared import envvars
from mpi_magic.testing.hosts import missing


def own_time(job_name: str) -> float:
    import boto3

    described = boto3.client("sagemaker").describe_training_job(TrainingJobName=job_name)
    return (described["TrainingEndTime"] - described["CreationTime"]).total_seconds()


def one_cell(where: str, instances: int, gpus: int) -> tuple[float, float]:
    """(time to results, the job's own time) of one cell on a rehearsal cloud whose instances run ``where``."""
    os.environ[envvars.EMULATOR_HOSTS] = where  # (read by the emulator as it starts)
    with rehearsal_shell() as ip:
        started = time.monotonic()
        ip.run_cell_magic("mpirun_remote", f"-i {instances} -g {gpus} --quiet --out job", (
            "import socket\n"
            "from mpi4py import MPI\n"
            "hosts = len(set(MPI.COMM_WORLD.allgather(socket.gethostname())))\n"
        ))
        elapsed = time.monotonic() - started
        expected = instances if where == "test-hosts" else 1
        assert ip.user_ns["hosts"] == expected, f"ranks on {ip.user_ns['hosts']} hosts, not {expected}"
        return elapsed, own_time(ip.user_ns["job"].name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--instances", type=int, default=16)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    why = missing()
    if why:
        print(f"bench_sagemaker_hosts: {why}", file=sys.stderr)
        return 1
    times: dict[str, list[tuple[float, float]]] = {"test-hosts": [], "stand-in": []}
    for _ in range(args.repeats):
        for where, spent in times.items():
            spent.append(one_cell(where, args.instances, args.gpus))
    print(f"a {args.instances} x {args.gpus} one-off cell on the rehearsal cloud (pace none), {args.repeats} rounds:")
    for where, spent in times.items():
        results, jobs = sorted(t for t, _ in spent), sorted(j for _, j in spent)
        label = f"{args.instances} test hosts" if where == "test-hosts" else "this machine alone (ssh stand-in)"
        print(f"  {label}: time to results median {statistics.median(results):.1f} s "
              f"({results[0]:.1f}-{results[-1]:.1f}), the job's own {statistics.median(jobs):.1f} s "
              f"({jobs[0]:.1f}-{jobs[-1]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
