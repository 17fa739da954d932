"""Progress reporting costs.

1. Rank side: one `mpi_magic.progress.update()` (with the rank's rate-limited reporter) versus
   one `tqdm.update()` (writing to a null stream), in ns per call, in the same run.
2. Client side: events per second through decoder + model + widget view for 32 ranks x 10,000
   progress updates each (every update sent, no rate limit), the lines decoded a read at a time
   (the local backend) and one at a time (a SageMaker log), and the time to render one frame of
   a 1024-rank world (compact grid).
"""

from __future__ import annotations

import argparse
import io
import time

from _common import NoDisplay

from mpi_magic.shared import reporting
from mpi_magic.backends.local.backend import READ_CHUNK
from mpi_magic.shared.events import Progress, RankStarted, StreamDecoder, encode
from mpi_magic.shared.wire import Emitter
from mpi_magic.view.model import JobModel
from mpi_magic.view.widgets import WidgetView

TOKEN = "0123456789abcdef"  # the job's marker token


def ns_per_call(fn, calls: int) -> float:
    start = time.perf_counter_ns()
    fn(calls)
    return (time.perf_counter_ns() - start) / calls


def rank_side(calls: int) -> None:
    from tqdm import tqdm

    sink = []
    reporting.install(reporting.Reporter(Emitter(0, sink.append, TOKEN)))

    def ours(n: int) -> None:
        bar = reporting.progress(total=n)
        for _ in range(n):
            bar.update()
        bar.close()

    def theirs(n: int) -> None:
        bar = tqdm(total=n, file=io.StringIO())
        for _ in range(n):
            bar.update()
        bar.close()

    ours(1000), theirs(1000)  # warm up
    a, b = ns_per_call(ours, calls), ns_per_call(theirs, calls)
    reporting.install(None)
    print(f"rank side, {calls:,} updates:")
    print(f"  mpi_magic.progress.update   {a:8.0f} ns/call  ({len(sink)} events sent)")
    print(f"  tqdm.update                 {b:8.0f} ns/call")
    print(f"  ratio mpi_magic / tqdm = {a / b:.2f}")


def reads_of(lines: list[str], size: int = READ_CHUNK) -> list[list[str]]:
    """``lines`` cut as the local backend's reader hands them on: the whole lines of one read."""
    reads, current, length = [], [], 0
    for line in lines:
        if current and length + len(line) + 1 > size:
            reads.append(current)
            current, length = [], 0
        current.append(line)
        length += len(line) + 1
    return reads + [current] if current else reads


def client_side(ranks: int, updates: int, repeats: int) -> None:
    lines = []
    for r in range(ranks):
        lines.append(f"[1,{r}]<stdout>: " + encode(RankStarted(rank=r, instance=r // 8, local_rank=r % 8, world_size=ranks, seq=0, time=0.0), TOKEN))
    for i in range(1, updates + 1):
        for r in range(ranks):
            lines.append(f"[1,{r}]<stdout>: " + encode(Progress(rank=r, n=i, total=updates, seq=i, time=i * 0.001), TOKEN))
    reads = reads_of(lines)

    def by_read(decoder: StreamDecoder):  # as the local backend decodes
        for read in reads:
            yield decoder.feed_lines(read)

    def by_line(decoder: StreamDecoder):  # as a SageMaker job's log is decoded
        for line in lines:
            yield decoder.feed(line)

    print(f"client side, {ranks} ranks x {updates:,} updates = {len(lines):,} lines ({len(reads)} reads), "
          f"{repeats} runs, the view asked to redraw after every event:")
    for name, decode in (("lines of a read at once", by_read), ("one line at a time", by_line)):
        rates, redraws = [], 0
        for _ in range(repeats):
            model = JobModel("bench", "local", ranks, 8)
            view = WidgetView(model, lambda: "", NoDisplay(), quiet_start=0.0)
            start = time.perf_counter()
            for decoded in decode(StreamDecoder(TOKEN)):
                for event in decoded:
                    model.fold(event)
                    view.update()
            view.close()
            rates.append(len(lines) / (time.perf_counter() - start))
            redraws = view.redraws
        rates.sort()
        print(f"  decoder + model + widget view, {name:24s} median {rates[len(rates) // 2]:9,.0f} events/s, "
              f"best {rates[-1]:9,.0f} ({redraws} redraws a run)")


def frame_1024() -> None:
    model = JobModel("bench", "local", 1024, 8)
    view = WidgetView(model, lambda: "", NoDisplay(), quiet_start=0.0)
    for r in range(1024):
        model.fold(RankStarted(rank=r, instance=r // 8, local_rank=r % 8, world_size=1024, seq=0, time=0.0))
        model.fold(Progress(rank=r, n=r % 100, total=100, seq=1, time=1.0))
    view.update()
    times = []
    for _ in range(20):
        model.version += 1
        start = time.perf_counter()
        view.redraw()
        times.append(time.perf_counter() - start)
    times.sort()
    print(f"one frame of a 1024-rank world (compact grid): median {1000 * times[len(times) // 2]:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--ranks", type=int, default=32)
    parser.add_argument("--updates", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rank_side(args.calls)
    client_side(args.ranks, args.updates, args.repeats)
    frame_1024()


if __name__ == "__main__":
    main()
