"""What `--mlflow` costs a cell: the same 2 x 2 cell, each rank logging ``--steps`` metrics, run
untracked and tracked (one MLflow run, written by the notebook to a real ``mlflow server`` on
loopback with a SQLite store), taking turns in each round; the ratio of the medians, and that the
run holds every point the notebook holds (rank 0's ``loss`` and rank 3's ``rank3/loss``: the ranks
send a fast loop's values thinned, ``shared/metrics.py``).

The first tracked cell also pays MLflow's import (seconds, once per kernel): it is run before the
rounds and reported apart.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from _common import median, shell

from mpi_magic.shared.procs import free_port

CELL = """import mpi_magic
for step in range({steps}):
    mpi_magic.log(loss=(1 + mpi_magic.rank()) / (step + 1))
"""


def start_server(root: str) -> tuple[subprocess.Popen, str]:
    uri = f"http://127.0.0.1:{free_port()}"
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{root}/store.db",
         "--artifacts-destination", os.path.join(root, "artifacts"), "--host", "127.0.0.1",
         "--port", uri.rsplit(":", 1)[1], "--workers", "1"],
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2):
                return server, uri
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("mlflow server did not start") from None
            time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="mpi_magic_bench_mlflow_")
    started = time.monotonic()
    server, uri = start_server(root)
    print(f"mlflow server up in {time.monotonic() - started:.1f} s")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        ip = shell()
        cell = CELL.format(steps=args.steps)
        line = "-i 2 -g 2 --quiet"
        first = time.perf_counter()
        ip.run_cell_magic("mpirun_remote", f"{line} --mlflow bench-first", cell)
        print(f"first tracked cell (MLflow imported): {time.perf_counter() - first:.2f} s")
        untracked, tracked = [], []
        for round_ in range(args.repeats):
            for times, extra in ((untracked, ""), (tracked, f" --mlflow bench-{round_} --out job")):
                began = time.perf_counter()
                ip.run_cell_magic("mpirun_remote", line + extra, cell)
                times.append(time.perf_counter() - began)
        import mlflow

        client = mlflow.MlflowClient(uri)
        runs = client.search_runs([client.get_experiment_by_name(f"bench-{args.repeats - 1}").experiment_id])
        points = {key: len(client.get_metric_history(runs[0].info.run_id, key)) for key in ("loss", "rank3/loss")}
        print(f"{args.steps} steps on 4 ranks, {args.repeats} rounds: untracked median {median(untracked):.3f} s "
              f"({min(untracked):.3f}-{max(untracked):.3f}), tracked {median(tracked):.3f} s "
              f"({min(tracked):.3f}-{max(tracked):.3f}): ratio {median(tracked) / median(untracked):.2f}")
        print(f"the last run holds {points} points; status {runs[0].info.status}")
        held = ip.user_ns["job"].metrics
        kept = {"loss": len(held[0]["loss"]), "rank3/loss": len(held[3]["loss"])}
        if points != kept:
            raise SystemExit(f"the run does not hold every point the notebook holds ({kept})")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)


if __name__ == "__main__":
    main()
