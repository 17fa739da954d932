"""Sessions: a warm cell, a large value on its second use, and a session's start, each beside
a baseline measured in the same run.

- A trivial cell on a warm 4-rank session, against ipyparallel's ``%%px`` on 4 MPI engines
  (ipyparallel 9, started the documented way: ``ipp.Cluster(engines="mpi", n=4)``), and against
  a one-off ``%%mpirun_remote`` cell.
- A cell that reads an unchanged 1 GiB array, first and second use, against sending it as
  a one-off cell does.
- Starting a session, against one one-off cell of the same shape.

``pip install ipyparallel`` (or ``pip install -e '.[bench]'``) for the ipyparallel baseline;
without it that row is left out.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import time

from _common import median, shell, timed

import numpy as np

WARM_CELL = "x = 1"


def warm_cells(ip, repeats: int) -> dict[str, float]:
    ip.run_line_magic("mpirun_session", "start -i 2 -g 2 --quiet")
    try:
        for _ in range(5):
            ip.run_cell_magic("mpirun_remote", "--quiet", WARM_CELL)
        quiet = timed(lambda: ip.run_cell_magic("mpirun_remote", "--quiet", WARM_CELL), repeats)
        viewed = timed(lambda: _silenced(ip, ""), repeats)
    finally:
        ip.run_line_magic("mpirun_session", "stop")
    one_off = timed(lambda: ip.run_cell_magic("mpirun_remote", "-i 2 -g 2 --quiet", WARM_CELL), max(5, repeats // 10))
    return {"session --quiet": median(quiet), "session, with its view": median(viewed), "one-off": median(one_off)}


def _silenced(ip, line: str) -> None:
    """A cell with its (text) view, its lines sent to /dev/null as a terminal would show them."""
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        ip.run_cell_magic("mpirun_remote", line, WARM_CELL)


def ipyparallel_cells(ip, repeats: int) -> dict[str, float] | None:
    if importlib.util.find_spec("ipyparallel") is None:
        return None
    import ipyparallel as ipp

    from mpi_magic.backends import launcher

    mpirun = launcher.find_launcher(os.environ.get("MPI_MAGIC_MPIRUN"))
    env_before = dict(os.environ)
    # the same mpirun and transports as the local backend's (and root allowed, as there)
    os.environ.update(launcher.launcher_environ(mpirun, dict(os.environ), os.geteuid() == 0))
    started = time.perf_counter()
    cluster = ipp.Cluster(engines="mpi", n=4, log_level=40)
    cluster.config.MPILauncher.mpi_cmd = [mpirun.path]
    cluster.config.MPILauncher.mpi_args = ["--oversubscribe"]
    client = cluster.start_and_connect_sync()
    try:
        client.wait_for_engines(4, timeout=120)
        cluster_start = time.perf_counter() - started
        client.activate()
        for _ in range(5):
            ip.run_cell_magic("px", "", WARM_CELL)
        px = timed(lambda: ip.run_cell_magic("px", "", WARM_CELL), repeats)
    finally:
        client.close()
        cluster.stop_cluster_sync()
        os.environ.clear()
        os.environ.update(env_before)
    return {"start": cluster_start, "%%px": median(px)}


def large_value(ip, repeats: int) -> dict[str, float]:
    ip.user_ns["big"] = np.ones(1 << 27)  # 1 GiB of float64
    cell = "s = float(big[::1_000_000].sum())"
    # the first 1 GiB written here costs seconds of the kernel's own (page cache): not the session's
    ip.run_cell_magic("mpirun_remote", "-i 2 -g 2 --quiet", cell)
    ip.run_line_magic("mpirun_session", "start -i 2 -g 2 --quiet")
    try:
        first = timed(lambda: ip.run_cell_magic("mpirun_remote", "--quiet", cell), 1)[0]
        again = timed(lambda: ip.run_cell_magic("mpirun_remote", "--quiet", cell), repeats)
        ip.run_cell("pass")  # other notebook code ran: the content is checked before it is trusted
        checked = timed(lambda: ip.run_cell_magic("mpirun_remote", "--quiet", cell), 1)[0]
    finally:
        ip.run_line_magic("mpirun_session", "stop")
    one_off = timed(lambda: ip.run_cell_magic("mpirun_remote", "-i 2 -g 2 --quiet", cell), 3)
    del ip.user_ns["big"]
    return {"first use": first, "second use": median(again), "after other code ran": checked,
            "one-off cell": median(one_off)}


def session_start(ip, repeats: int) -> dict[str, float]:
    def start_and_stop() -> float:
        began = time.perf_counter()
        ip.run_line_magic("mpirun_session", "start -i 2 -g 2 --quiet")
        took = time.perf_counter() - began
        ip.run_line_magic("mpirun_session", "stop")
        return took

    starts = [start_and_stop() for _ in range(repeats)]
    one_off = timed(lambda: ip.run_cell_magic("mpirun_remote", "-i 2 -g 2 --quiet", WARM_CELL), repeats)
    return {"session start": median(starts), "one-off cell": median(one_off)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    ip = shell()
    with contextlib.redirect_stdout(io.StringIO()):
        warm = warm_cells(ip, args.repeats)
        px = ipyparallel_cells(ip, args.repeats)
        big = large_value(ip, 5)
        start = session_start(ip, 5)
    print(f"session, 4 ranks (2 x 2), medians ({args.repeats} warm cells):")
    print(f"  warm cell, --quiet                 {warm['session --quiet'] * 1000:7.1f} ms")
    print(f"  warm cell, with its view           {warm['session, with its view'] * 1000:7.1f} ms")
    print(f"  one-off cell                       {warm['one-off'] * 1000:7.1f} ms")
    if px is not None:
        print(f"  ipyparallel %%px, 4 MPI engines    {px['%%px'] * 1000:7.1f} ms (cluster start {px['start']:.1f} s)")
        print(f"  ratio session / %%px = {warm['session --quiet'] / px['%%px']:.2f}")
    else:
        print("  ipyparallel not installed: pip install ipyparallel for the %%px baseline")
    print(f"  ratio session / one-off cell = {warm['session --quiet'] / warm['one-off']:.3f}")
    print("unchanged 1 GiB array read by a cell:")
    for label, seconds in big.items():
        print(f"  {label:<34} {seconds * 1000:7.1f} ms")
    print(f"  ratio second use / one-off cell = {big['second use'] / big['one-off cell']:.3f}")
    print("session start, 4 ranks:")
    print(f"  %mpirun_session start              {start['session start']:7.3f} s")
    print(f"  one-off cell of the same shape     {start['one-off cell']:7.3f} s")
    print(f"  ratio start / one-off cell = {start['session start'] / start['one-off cell']:.2f}")


if __name__ == "__main__":
    main()
