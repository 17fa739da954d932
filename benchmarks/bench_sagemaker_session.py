"""A SageMaker session on the emulated cloud (moto + mpi_magic's emulator), beside a one-off job.

Measured in one run, 4 x 2 ranks by default:
- a cold one-off cell (a new training job) from the cell's start to its result;
- then one-off cells in the warm kernel: the cell's time against the job's own, from CreateTrainingJob
  to the TrainingEndTime the emulator reports (what the notebook adds: packing and uploading the cell,
  noticing the end, fetching the results);
- the session's start (one training job whose ranks then wait for cells);
- a trivial cell on the idle session: median and worst of its round trips, its end read from rank 0's
  end record in S3 against its end read from the job's log (the path before end records), the two
  alternating cell by cell on the same session;
- AWS API calls per minute the notebook makes for the session while it idles, and while a cell runs
  (the watch loop's, the heartbeat's and the cells' calls: the session's ``api_calls`` counter), and
  apart from them the S3 GETs looking for the cell's end record (``end_looks``).

``--pace aws`` runs it at AWS's pace (``mpi_magic.testing.aws_pace``: S3 in 0.1 s, a log line readable
5 s after it was written, instances starting in two minutes unless ``--instance-start`` says otherwise).
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import rehearsal_shell

from mpi_magic.testing.aws_pace import add_arguments



def own_time(job_name: str) -> float:
    """Seconds from a training job's creation to the end of its training, as SageMaker reports them."""
    import boto3

    described = boto3.client("sagemaker").describe_training_job(TrainingJobName=job_name)
    return (described["TrainingEndTime"] - described["CreationTime"]).total_seconds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--cells", type=int, default=10)
    parser.add_argument("--one-off-cells", type=int, default=5)
    parser.add_argument("--idle-seconds", type=float, default=60)
    parser.add_argument("--running-seconds", type=float, default=60)
    add_arguments(parser)  # --pace and --instance-start, as the rehearsal's servers take them
    args = parser.parse_args()
    from mpi_magic.backends.sagemaker.session_ranks import SageMakerSessionRanks

    shape = f"-i {args.instances} -g {args.gpus}"
    with rehearsal_shell(args.pace, args.instance_start) as ip:
        cold, one_off, jobs = None, [], []
        if args.one_off_cells:
            started = time.monotonic()
            ip.run_cell_magic("mpirun_remote", f"{shape} --quiet", "one_off = 1\n")
            cold = time.monotonic() - started
        for i in range(args.one_off_cells):
            started = time.monotonic()
            ip.run_cell_magic("mpirun_remote", f"{shape} --quiet --out one_off_job", f"one_off = {i}\n")
            one_off.append(time.monotonic() - started)
            jobs.append(own_time(ip.user_ns["one_off_job"].name))

        started = time.monotonic()
        ip.run_line_magic("mpirun_session", f"start {shape} --quiet --out session")
        start = time.monotonic() - started
        session = ip.user_ns["session"]
        ranks = session._ranks
        round_trips: dict[bool, list[float]] = {True: [], False: []}  # by whether the end came from the record
        for i in range(2 * args.cells):
            SageMakerSessionRanks.end_records = from_record = i % 2 == 0
            started = time.monotonic()
            ip.run_cell_magic("mpirun_remote", "--quiet", f"y = {i}\n")
            round_trips[from_record].append(time.monotonic() - started)
            assert ip.user_ns["y"] == i
        SageMakerSessionRanks.end_records = True
        idle = running = end_looks = None
        if args.idle_seconds:
            time.sleep(1)  # the last cell's pace has settled to idle
            calls, started = ranks.api_calls, time.monotonic()
            time.sleep(args.idle_seconds)
            idle = (ranks.api_calls - calls) * 60 / (time.monotonic() - started)
        if args.running_seconds:
            calls, looks, started = ranks.api_calls, ranks.end_looks, time.monotonic()
            ip.run_cell_magic("mpirun_remote", "--quiet", f"import time\ntime.sleep({args.running_seconds})\n")
            running = (ranks.api_calls - calls) * 60 / (time.monotonic() - started)
            end_looks = (ranks.end_looks - looks) * 60 / (time.monotonic() - started)
        ip.run_line_magic("mpirun_session", "stop")
    print(f"sagemaker session on the emulated cloud at pace {args.pace}, {args.instances} x {args.gpus} ranks:")
    if cold is not None:
        print(f"  cold one-off cell (a new training job): {cold:.1f} s")
        print(f"  one-off cell in the warm kernel: median {statistics.median(one_off):.2f} s, the job itself "
              f"{statistics.median(jobs):.2f} s (created to ended), ratio "
              f"{statistics.median(one_off) / statistics.median(jobs):.2f} ({len(one_off)} cells)")
    print(f"  session start: {start:.1f} s")
    record, log = round_trips[True], round_trips[False]
    print(f"  trivial cell on the idle session, its end from the end record in S3: median "
          f"{statistics.median(record):.2f} s, max {max(record):.2f} s ({len(record)} cells)")
    print(f"  the same, its end from the job's log: median {statistics.median(log):.2f} s, max {max(log):.2f} s "
          f"({len(log)} cells); ratio of medians {statistics.median(record) / statistics.median(log):.2f}")
    if idle is not None and running is not None:
        print(f"  AWS API calls by the notebook: {idle:.1f} per minute idle ({args.idle_seconds:g} s), "
              f"{running:.1f} per minute while a cell runs ({args.running_seconds:g} s), and {end_looks:.1f} "
              "S3 GETs a minute looking for its end record")


if __name__ == "__main__":
    main()
