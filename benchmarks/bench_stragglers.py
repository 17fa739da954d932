"""How soon a straggler is named once it starts lagging, and that ranks only out of phase are not
(``mpi_magic/view/pace.py``).

Real jobs of 4 ranks (2 x 2, the local backend), each a tqdm loop whose ranks meet in an allreduce
at its end, one step every ``--step`` seconds:

1. slowed: after ``--slow-after`` seconds rank 3 takes ``FACTOR`` times as long a step (one job per
   ``--factors``). Measured: the seconds from its slowdown (stamped by its clock, put on the
   notebook's by the model's clock offsets) to the look that first named it, the figures it was
   named with, and any other rank named (none is expected).
2. without: the same loop at one pace for every rank, the ranks out of phase: each starts its loop
   0.5 s after the one before, odd ranks move their bar before a step's work and even ranks after
   it, and odd ranks have a fifth fewer steps (a smaller shard). Measured: the ranks named (none is
   expected) and how near any came: the largest ratio of a rank's step time to the others' median
   at any look, against the 1.5 that names a rank.
3. What a look costs the notebook (the model looks at every rank's steps twice a second): one look
   at 32 and at 1,024 ranks, each with a bar that moved since the last look.

Each look of the model is recorded by wrapping its straggler watch (``Stragglers._name``), which is
what the dashboard and the summary read.
"""

from __future__ import annotations

import argparse
import time

from _common import median, shell

from mpi_magic.shared.events import Progress, RankStarted
from mpi_magic.view import pace
from mpi_magic.view.model import JobModel
from mpi_magic.view.summary import Summary

SLOWED = """\
from mpi4py import MPI
from tqdm import tqdm
import time
comm = MPI.COMM_WORLD
slowed_at = None
start = time.time()
for step in tqdm(range({steps})):
    if comm.rank == 3 and slowed_at is None and time.time() - start >= {slow_after}:
        slowed_at = time.time()
    time.sleep({step} * ({factor} if slowed_at is not None else 1))
total = comm.allreduce(step)
"""

OUT_OF_PHASE = """\
from mpi4py import MPI
from tqdm import tqdm
import time
comm = MPI.COMM_WORLD
time.sleep(0.5 * comm.rank)
bar = tqdm(total={steps} - {steps} // 5 * (comm.rank % 2))
for step in range(bar.total):
    if comm.rank % 2:
        bar.update()
    time.sleep({step})
    if not comm.rank % 2:
        bar.update()
bar.close()
total = comm.allreduce(bar.n)
del bar
"""


class Looks:
    """Every look of the straggler watch while a job runs: when each rank was first named, and
    the largest step-time ratio any rank had."""

    def __init__(self) -> None:
        self.first: dict[tuple[int, str], tuple[float, pace.Slow]] = {}
        self.largest = (0.0, -1)  # (ratio, rank)
        self._name = pace.Stragglers._name

    def __enter__(self) -> "Looks":
        looks = self

        def name(watch, now, found, ranks):
            for rank, slow in found.items():
                looks.first.setdefault((rank, slow.kind), (now, slow))
            times = watch.step_times()
            ordered = sorted(t for t, _ in times.values())
            for rank, (step_time, _) in times.items():
                others = pace._median_without(ordered, ordered.index(step_time)) if len(ordered) > 1 else 0.0
                if others and step_time / others > looks.largest[0]:
                    looks.largest = (step_time / others, rank)
            return looks._name(watch, now, found, ranks)

        pace.Stragglers._name = name
        return self

    def __exit__(self, *exc) -> None:
        pace.Stragglers._name = self._name


def slowed(ip, factor: float, args) -> None:
    steps = int(args.seconds / args.step)
    with Looks() as looks:
        ip.run_cell_magic("mpirun_remote", "-i 2 -g 2 --quiet --gather --out job", SLOWED.format(
            steps=steps, step=args.step, factor=factor, slow_after=args.slow_after))
    job = ip.user_ns["job"]
    model = job.model
    slowed_at = model.clock_offsets.ours(model.ranks[3].instance, ip.user_ns["slowed_at"][3])
    named = looks.first.get((3, "slower"))
    print(f"slowed: rank 3 takes {factor:g}x as long a step after {args.slow_after:g} s (ranks 0-2: {steps} steps of "
          f"{args.step:g} s), job {model.elapsed():.1f} s:")
    if named is None:
        print("  rank 3 was never named")
    else:
        at, slow = named
        print(f"  rank 3 named {at - slowed_at:.1f} s after it slowed down ({at - model.started_at:.1f} s into the job): "
              f"{slow.ratio:.2f}x the others' median step time over the last {slow.span:.1f} s")
    others = sorted(f"rank {rank} {kind}" for rank, kind in looks.first if rank != 3)
    print(f"  other ranks named: {', '.join(others) or 'none'}")
    told = [line.strip() for line in repr(Summary(model)).splitlines() if line.startswith("  straggler: ")]
    print(f"  the summary: {'; '.join(told) or 'names none'}")


def out_of_phase(ip, args) -> None:
    steps = int(args.seconds / args.step)
    with Looks() as looks:
        ip.run_cell_magic("mpirun_remote", "-i 2 -g 2 --quiet --out job", OUT_OF_PHASE.format(steps=steps, step=args.step))
    model = ip.user_ns["job"].model
    ratio, rank = looks.largest
    print(f"without: every rank {args.step:g} s a step, out of phase (starts 0.5 s apart, bars moved before or after the "
          f"step's work, odd ranks {steps - steps // 5} steps, even {steps}), job {model.elapsed():.1f} s:")
    print(f"  ranks named: {', '.join(f'rank {r} {kind}' for r, kind in looks.first) or 'none'}; measured at the end: "
          f"{len(model.pace.step_times())} of 4")
    print(f"  the largest step time against the others' median at any look: {ratio:.3f}x (rank {rank}); a rank is "
          f"named at {pace.SLOWER}x")
    told = [line.strip() for line in repr(Summary(model)).splitlines() if line.startswith("  straggler: ")]
    print(f"  the summary: {'; '.join(told) or 'names none'}")


def look_cost(ranks: int, looks: int = 200) -> None:
    now = [0.0]
    model = JobModel("bench", "local", ranks, 8, lambda: now[0])
    for rank in range(ranks):
        model.fold(RankStarted(rank=rank, instance=rank // 8, local_rank=rank % 8, world_size=ranks))
    spent = []
    for look in range(1, looks + 1):
        now[0] = look * pace.ASSESS_EVERY
        for rank in range(ranks):
            model.fold(Progress(rank=rank, n=5 * look, total=10 * looks, time=now[0] * (1.6 if rank == 5 else 1.0)))
        began = time.perf_counter()
        model.pace.assess(now[0], model.ranks, model.stall_after)
        spent.append(time.perf_counter() - began)
    named = ", ".join(f"rank {slow.rank} {slow.ratio:.1f}x" for slow in model.stragglers())
    print(f"one look at {ranks} ranks: median {1000 * median(spent):.2f} ms (max {1000 * max(spent):.2f}), "
          f"{100 * median(spent) / pace.ASSESS_EVERY:.2f}% of a core at two a second; named: {named}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--step", type=float, default=0.05, help="seconds a step (default 0.05)")
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds of steps of ranks 0-2 (default 15)")
    parser.add_argument("--slow-after", type=float, default=5.0, help="seconds before rank 3 slows down (default 5)")
    parser.add_argument("--factors", type=float, nargs="+", default=[3.0, 2.0],
                        help="how many times as long rank 3's steps take once slow (default 3 2)")
    parser.add_argument("--only", choices=["jobs", "cost"], help="the real jobs alone, or the cost of a look alone")
    args = parser.parse_args()
    if args.only != "cost":
        ip = shell()
        for factor in args.factors:
            slowed(ip, factor, args)
        out_of_phase(ip, args)
    if args.only != "jobs":
        for ranks in (32, 1024):
            look_cost(ranks)


if __name__ == "__main__":
    main()
