"""What watching a SageMaker job costs, by its size, on the emulated cloud (moto + mpi_magic's emulator).

For each size (instances x processes), a ``--gather`` cell whose every rank reports progress
twice a second for ``--seconds``, watched three ways: reading the log at the fixed pace the
notebook used first (every 1 s, DescribeTrainingJob every 3 s), at the adaptive pace it uses
without Live Tail, and through a CloudWatch Live Tail session (the default):
- AWS calls per minute by the notebook, from submitting the job to its end (``calls_at_end``), and to
  its results brought back (the job's ``api_calls``);
- latency from a rank's progress event (its own wall-clock timestamp) to the notebook having it:
  the emulator pushes log lines every 0.2 s, the rest is how often the log is read, or Live Tail's
  update every second.
Then, for the largest size, the time and calls to bring every rank's results back: one
``download_file`` per rank in turn (HeadObject + GetObject) against ``fetch_each``.

    python benchmarks/bench_sagemaker_watch.py --sizes 4x2 16x2 64x2
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from _common import rehearsal_shell

from mpi_magic.notebook import job as jobs
from mpi_magic.backends.sagemaker import training_job as sagemaker_job
from mpi_magic.backends.sagemaker.training_job import ADAPTIVE, FIXED, SageMakerJob
from mpi_magic.shared.events import Progress
from mpi_magic.shared.layout import result_path, result_uri, split_s3


def download_each(job: SageMakerJob, job_dir: str, ranks) -> None:
    """The baseline: ``download_file`` per rank, one after the other."""
    for rank in ranks:
        bucket, key = split_s3(result_uri(job.results_uri, rank))
        os.makedirs(os.path.dirname(result_path(job_dir, rank)), exist_ok=True)
        job.s3.download_file(bucket, key, result_path(job_dir, rank))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["4x2", "16x2", "64x2"])
    parser.add_argument("--seconds", type=float, default=25)
    args = parser.parse_args()
    latencies: list[float] = []
    watched: list[SageMakerJob] = []
    record, init = jobs.Job.record, SageMakerJob.__init__

    steady: list[tuple[float, int]] = []  # (when, calls so far) at each progress event

    def timed_record(self, event):
        if isinstance(event, Progress):
            latencies.append(time.time() - event.time)
            steady.append((time.monotonic(), watched[-1].api_calls))
        record(self, event)

    def remembered_init(self, *a, **k):
        init(self, *a, **k)
        watched.append(self)

    jobs.Job.record, SageMakerJob.__init__ = timed_record, remembered_init
    with rehearsal_shell() as ip:
        cell = ("import time, mpi_magic\n"
                f"for step in mpi_magic.progress(range({int(args.seconds * 2)})):\n"
                "    time.sleep(0.5)\n"
                "me = mpi_magic.rank()\n")
        for size in args.sizes:
            instances, per_instance = (int(n) for n in size.split("x"))
            for name, pace, live_tail in (("fixed reads", FIXED, "no"), ("adaptive reads", ADAPTIVE, "no"),
                                          ("Live Tail", ADAPTIVE, "yes")):
                SageMakerJob.pace = pace
                ip.run_line_magic("mpirun_config", f"live_tail={live_tail}")
                latencies.clear()
                steady.clear()
                started = time.monotonic()
                ip.run_cell_magic("mpirun_remote", f"-i {instances} -g {per_instance} --gather --quiet --out job", cell)
                elapsed = time.monotonic() - started
                assert ip.user_ns["me"] == list(range(instances * per_instance)), "not every rank's result came back"
                calls, job = watched[-1].api_calls, watched[-1]
                ended = job.calls_at_end or calls
                latencies.sort()
                (first, calls_first), (last_at, calls_last) = steady[0], steady[-1]
                running = 60 * (calls_last - calls_first) / (last_at - first)
                median, p95 = statistics.median(latencies), latencies[int(0.95 * len(latencies))]
                print(f"{size:>5} {name:15} job {elapsed:5.1f} s, {ended:4d} calls to its end = "
                      f"{60 * ended / elapsed:5.1f}/min, {calls:4d} with the results = {60 * calls / elapsed:5.1f}/min, "
                      f"{running:5.1f}/min while the ranks report; event latency "
                      f"median {median:.2f} s, p95 {p95:.2f} s ({len(latencies)} events)", flush=True)
                print("      calls: " + ", ".join(f"{op} {n}" for op, n in watched[-1].calls.most_common()), flush=True)
        last, world_size = watched[-1], instances * per_instance
        for name, fetch in (("download_file each, in turn", lambda d: download_each(last, d, range(world_size))),
                            (f"fetch_each, {sagemaker_job.FETCHES} at a time",
                             lambda d: last.fetch_results(d, range(world_size)))):
            spent, made = [], []
            for _ in range(3):
                with tempfile.TemporaryDirectory() as job_dir:
                    calls, start = last.api_calls, time.perf_counter()
                    fetch(job_dir)
                    spent.append(time.perf_counter() - start)
                    made.append(last.api_calls - calls)
                    assert len(os.listdir(os.path.dirname(result_path(job_dir, 0)))) == world_size
            print(f"results of {world_size} ranks, {name}: median {statistics.median(spent):.2f} s "
                  f"of {', '.join(f'{s:.2f}' for s in spent)}, {made[0]} calls", flush=True)


if __name__ == "__main__":
    main()
