"""Payload: a 1 GiB numpy array captured, shipped and loaded on 4 ranks through %%mpirun_remote,
versus numpy.save of the same array plus 4 ranks each running numpy.load (bare mpirun, same
transports), in the same run. Also the notebook process's peak memory above the array's size.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile

import numpy as np
from _common import bare_launch, median, shell, timed

GIB = 2**30


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ip = shell()
    arr = np.random.default_rng(0).random(int(args.gib * GIB) // 8)
    ip.user_ns["arr"] = arr
    cell = "check = float(arr.sum())\n"
    folder = tempfile.mkdtemp(prefix="mpi_magic_bench_npy_")
    path = os.path.join(folder, "arr.npy")
    load = f"import numpy as np; a = np.load({path!r}); float(a.sum())"

    def through_magic() -> None:
        ip.run_cell_magic("mpirun_remote", "-i 2 -g 2 --quiet", cell)

    bare = bare_launch(4, load, tuned=True)

    def baseline() -> None:
        np.save(path, arr)
        bare()

    before = peak_rss()
    magic, base = [], []
    for _ in range(args.repeats):  # alternated, each after a sync, so disk writeback hits both alike
        os.sync()
        magic.append(timed(through_magic, 1)[0])
        os.sync()
        base.append(timed(baseline, 1)[0])
    extra = peak_rss() - before
    shutil.rmtree(folder)
    assert ip.user_ns["check"] == float(arr.sum())
    print(f"payload of {arr.nbytes / GIB:.2f} GiB to 4 ranks, median of {args.repeats}:")
    print(f"  %%mpirun_remote (capture, write, 4 x map+load+sum)    {median(magic):6.2f} s")
    print(f"  numpy.save + 4 x numpy.load+sum (bare mpirun)     {median(base):6.2f} s")
    print(f"  ratio magic / baseline = {median(magic) / median(base):.2f} (of the fastest runs: {min(magic) / min(base):.2f})")
    print(f"  notebook peak memory above the array: {extra / GIB:.3f} GiB = {extra / arr.nbytes:.3f} x the array")


if __name__ == "__main__":
    main()
