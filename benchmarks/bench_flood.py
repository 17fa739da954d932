"""A flood of output: every rank prints many short lines as fast as it can.

Through %%mpirun_remote every line is decoded, attributed to its rank, kept in a bounded live
tail and written to the job folder's logs; the baseline, measured in the same run, is bare
`mpirun --tag-output` running the same code with its output going to /dev/null. Also printed:
how much the notebook's memory grew while the flood passed through it.
"""

from __future__ import annotations

import argparse
import threading
import time

import psutil
from _common import bare_launch, shell


def peak_rss_during(fn) -> tuple[float, int]:
    """(seconds fn took, the process's peak resident memory above its start, sampled every 10 ms)."""
    process = psutil.Process()
    start_rss = peak = process.memory_info().rss
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.01):
            peak = max(peak, process.memory_info().rss)

    sampler = threading.Thread(target=sample)
    sampler.start()
    started = time.perf_counter()
    try:
        fn()
    finally:
        elapsed = time.perf_counter() - started
        done.set()
        sampler.join()
    return elapsed, peak - start_rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=1_000_000, help="lines per rank")
    parser.add_argument("--ranks", type=int, default=4)
    args = parser.parse_args()
    ip = shell()
    code = f"import sys\nfor i in range({args.lines}):\n    print(i)\n"
    total = args.lines * args.ranks
    magic, grew = peak_rss_during(lambda: ip.run_cell_magic("mpirun_remote", f"-g {args.ranks} --quiet --out job", code))
    job = ip.user_ns["job"]
    logged = sum(len(job.logs(rank).splitlines()) for rank in range(args.ranks))
    bare, _ = peak_rss_during(bare_launch(args.ranks, code, tuned=True))
    print(f"flood, {args.ranks} ranks x {args.lines:,} lines ({job.status}, {logged:,} of {total:,} lines in the logs):")
    print(f"  %%mpirun_remote --quiet       {magic:6.2f} s  {total / magic:12,.0f} lines/s")
    print(f"  bare mpirun > /dev/null       {bare:6.2f} s  {total / bare:12,.0f} lines/s")
    print(f"  ratio magic / bare = {magic / bare:.2f}; notebook memory grew {grew / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
