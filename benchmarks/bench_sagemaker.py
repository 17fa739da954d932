"""The SageMaker backend watched through the emulated cloud (moto + mpi_magic's emulator).

While a 4 x 8 job runs, with every rank reporting progress twice a second:
- latency from a rank's progress event (its own timestamp) to the dashboard's model having it,
  through the emulated CloudWatch Logs (the emulator pushes logs every 0.2 s; mpi_magic follows
  the leader's stream through a Live Tail session, or with ``--no-live-tail`` reads it at its
  adaptive pace, ``job.ADAPTIVE``; ``bench_sagemaker_watch.py`` compares the ways at three sizes);
- AWS API calls per minute made by the notebook while the job runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import rehearsal_shell

from mpi_magic.notebook import job as jobs
from mpi_magic.backends.sagemaker.training_job import SageMakerJob
from mpi_magic.shared.events import Progress


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--no-live-tail", action="store_true", help="read the log instead of following it")
    args = parser.parse_args()
    latencies: list[float] = []
    watched: list[SageMakerJob] = []
    record, init = jobs.Job.record, SageMakerJob.__init__

    def timed_record(self, event):
        if isinstance(event, Progress):
            latencies.append(time.time() - event.time)
        record(self, event)

    def remembered_init(self, *a, **k):
        init(self, *a, **k)
        watched.append(self)

    jobs.Job.record, SageMakerJob.__init__ = timed_record, remembered_init
    with rehearsal_shell() as ip:
        ip.run_line_magic("mpirun_config", f"live_tail={'no' if args.no_live_tail else 'yes'}")
        steps = int(args.seconds * 2)
        started = time.monotonic()
        ip.run_cell_magic("mpirun_remote", f"-i {args.instances} -g {args.gpus} --quiet --out job", (
            "import time, mpi_magic\n"
            f"for step in mpi_magic.progress(range({steps})):\n"
            "    time.sleep(0.5)\n"
        ))
        elapsed = time.monotonic() - started
    calls = watched[0].api_calls
    latencies.sort()
    print(f"sagemaker backend on the emulated cloud, {args.instances} x {args.gpus} ranks, {elapsed:.1f} s job:")
    print(f"  progress event -> dashboard model: median {statistics.median(latencies):.2f} s, "
          f"p90 {latencies[int(0.9 * len(latencies))]:.2f} s, max {latencies[-1]:.2f} s ({len(latencies)} events)")
    print(f"  AWS API calls by the notebook: {calls} in {elapsed:.0f} s = {60 * calls / elapsed:.0f} per minute "
          f"({', '.join(f'{op} {n}' for op, n in watched[0].calls.most_common())})")


if __name__ == "__main__":
    main()
