"""What sampling a rank's resources costs the rank (the limit: 1% of one core).

1. In a real job: 4 ranks (2 x 2) each sleep through an idle cell of ``--seconds``, and each
   measures its own process's CPU time meanwhile (``time.process_time()``: every thread of the
   rank, the sampler's too). Rounds take turns between sampling on (the default) and off
   (``--env MPI_MAGIC_RESOURCES_EVERY=0``, the baseline); the difference is the sampler's cost,
   as a percent of one core.
2. One sample on this process, by the thread that takes it (``time.thread_time()``): taken and
   found unchanged (what an idle or steady rank pays each second), and taken and sent as an event
   (written to /dev/null), in microseconds, and as a percent of one core at one sample a second.
3. A trivial 4-rank cell with sampling on and off, taking turns: what starting the sampler adds to
   a cell's launch.
4. The notebook's side: one frame of a 1024-rank dashboard (the compact grid), every rank's
   resources known (the grid drawn coloured by progress and by memory) against none known.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _common import NoDisplay, interleaved, median, shell

from mpi_magic.runtime.resources import Sampler
from mpi_magic.shared import envvars, wire
from mpi_magic.shared.events import Progress, RankStarted, Resources
from mpi_magic.view.model import JobModel
from mpi_magic.view.widgets import WidgetView

IDLE_CELL = "import time\nstart = time.process_time()\ntime.sleep({seconds})\ncpu = time.process_time() - start\n"
OFF = f"--env {envvars.RESOURCES_EVERY}=0"


def in_a_job(ip, seconds: float, rounds: int) -> None:
    cell = IDLE_CELL.format(seconds=seconds)
    used: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(rounds):
        for name, line in (("on", ""), ("off", OFF)):
            ip.run_cell_magic("mpirun_remote", f"-i 2 -g 2 --quiet --gather {line}", cell)
            used[name].extend(100 * cpu / seconds for cpu in ip.user_ns["cpu"])  # % of a core, per rank
    on, off = median(used["on"]), median(used["off"])
    print(f"an idle {seconds:g} s cell on 4 ranks (2 x 2), {rounds} rounds taking turns, CPU per rank in % of one core "
          f"(median of {len(used['on'])} rank-cells):")
    print(f"  sampling on (the default)          {on:8.4f} %  (max {max(used['on']):.4f})")
    print(f"  sampling off (the baseline)        {off:8.4f} %  (max {max(used['off']):.4f})")
    print(f"  the sampler's cost                 {on - off:8.4f} % of a core (limit 1%)")


def per_sample(samples: int) -> None:
    fd = os.open(os.devnull, os.O_WRONLY)
    emitter = wire.Emitter(0, lambda line: os.write(fd, line.encode()), "0123456789abcdef")
    quiet = Sampler(lambda **figures: None)
    quiet.tick()  # sends its first sample; the rest find nothing new
    sizes = iter(range(1 << 62))
    sent = Sampler(lambda **figures: emitter.emit(wire.RESOURCES, **figures),
                   resident=lambda: (next(sizes) % 2 + 1) << 30)  # 1 GiB, 2 GiB, ...: every sample is news
    costs = {}
    for name, sampler in (("taken, nothing new: not sent", quiet), ("taken and sent as an event", sent)):
        runs = []
        for _ in range(5):
            start = time.thread_time()
            for _ in range(samples):
                sampler.tick()
            runs.append(1e6 * (time.thread_time() - start) / samples)
        costs[name] = statistics.median(runs)
    os.close(fd)
    print(f"one sample on this process (median of 5 x {samples:,}), CPU of the thread that takes it:")
    for name, micros in costs.items():
        print(f"  {name:<32} {micros:8.1f} us  = {micros / 1e4:.4f} % of one core at one sample a second")


def launch(ip, rounds: int) -> None:
    on, off = interleaved([lambda: ip.run_cell_magic("mpirun_remote", "-i 2 -g 2 --quiet", "x = 1"),
                           lambda: ip.run_cell_magic("mpirun_remote", f"-i 2 -g 2 --quiet {OFF}", "x = 1")], rounds)
    print(f"a trivial 4-rank cell (2 x 2), median of {rounds} rounds taking turns:")
    print(f"  sampling on                        {1000 * median(on):8.1f} ms")
    print(f"  sampling off                       {1000 * median(off):8.1f} ms")
    print(f"  ratio on / off = {median(on) / median(off):.2f}")


def frame_1024(repeats: int = 21) -> None:
    medians = {}
    for name, known in (("no rank's resources known", False), ("every rank's resources known", True)):
        model = JobModel("bench", "local", 1024, 8)
        view = WidgetView(model, lambda: "", NoDisplay(), quiet_start=0.0)
        for r in range(1024):
            model.fold(RankStarted(rank=r, instance=r // 8, local_rank=r % 8, world_size=1024, seq=0, time=0.0))
            model.fold(Progress(rank=r, n=r % 100, total=100, seq=1, time=1.0))
            if known:
                model.fold(Resources(rank=r, cpu=99.0, rss=(r % 7 + 1) << 28, seq=2, time=1.0))
        view.update()
        times = []
        for _ in range(repeats):
            model.version += 1
            start = time.perf_counter()
            view.redraw()
            times.append(time.perf_counter() - start)
        medians[name] = median(times)
    print(f"one frame of a 1024-rank dashboard (compact grid), median of {repeats}:")
    for name, seconds in medians.items():
        print(f"  {name:<34} {1000 * seconds:8.1f} ms")
    none, every = medians.values()
    print(f"  ratio known / none = {every / none:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each idle cell sleeps")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--launches", type=int, default=15)
    args = parser.parse_args()
    ip = shell()
    ip.run_cell_magic("mpirun_remote", "-i 2 -g 2 --quiet", "x = 1")  # warm the page cache
    in_a_job(ip, args.seconds, args.rounds)
    per_sample(args.samples)
    launch(ip, args.launches)
    frame_1024()


if __name__ == "__main__":
    main()
