"""Test hosts (``mpi_magic.testing.hosts``): how long a bed takes to come up, answer over ssh and go down.

Each bed is made with every host's sshd started and answering, as the tests use it; then one ssh
round trip into a host (from this machine) and one between two hosts (as mpirun makes them). Runs
as root (network namespaces); prints the median and range of ``--repeats`` rounds per size.
"""

from __future__ import annotations

import argparse
import sys
import time

from _common import median

from mpi_magic.testing.hosts import TestHosts, missing


def measure(hosts: int) -> tuple[float, float, float, float]:
    """(up, ssh in, ssh between, down) seconds for one bed of ``hosts`` hosts."""
    started = time.perf_counter()
    bed = TestHosts(hosts=hosts).up()
    up = time.perf_counter() - started
    try:
        started = time.perf_counter()
        assert bed.ssh("algo-1", "true").returncode == 0
        into = time.perf_counter() - started
        started = time.perf_counter()
        assert bed.run("algo-1", ["ssh", bed.names[-1], "true"]).returncode == 0
        between = time.perf_counter() - started
    finally:
        started = time.perf_counter()
        bed.down()
    return up, into, between, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="4,16", help="hosts per bed, comma-separated (default 4,16)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    why = missing()
    if why:
        print(why, file=sys.stderr)
        return 1
    for size in (int(s) for s in args.sizes.split(",")):
        rounds = [measure(size) for _ in range(args.repeats)]
        for index, what in enumerate(("up (sshd answering)", "ssh into a host", "ssh host to host", "down")):
            times = [r[index] for r in rounds]
            print(f"{size:3d} hosts  {what:20s} median {median(times):.3f} s  ({min(times):.3f}-{max(times):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
