"""Sessions: a warm cell, a large value on its second use, and a session's start, each beside
a baseline measured in the same run; and a soak of many warm cells on one session.

- A trivial cell on a warm 4-rank session, against ipyparallel's ``%%px`` on 4 MPI engines
  (ipyparallel 9, started the documented way: ``ipp.Cluster(engines="mpi", n=4)``), and against
  a one-off ``%%mpirun_remote`` cell.
- A cell that reads an unchanged 1 GiB array, first and second use, against sending it as
  a one-off cell does.
- Starting a session, against one one-off cell of the same shape.
- A soak: 1,000 warm cells on one session (``--soak N``), the notebook's memory and open
  descriptors before and after, and the last hundred cells' times beside the first hundred's.

``--only soak`` (or ``warm``, ``large``, ``start``, several at once) runs only those parts.

``pip install ipyparallel`` (or ``pip install -e '.[bench]'``) for the ipyparallel baseline;
without it that row is left out.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import io
import os
import time

from _common import median, shell, timed

import numpy as np
import psutil

WARM_CELL = "x = 1"
PARTS = ("warm", "large", "start", "soak")
SOAK_RSS_LIMIT_MIB = 16


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


def soak(ip, cells: int) -> dict:
    """Many warm cells on one session: what a long notebook does to it. The figures are read
    after a warm-up, so what the first cells load once (imports, buffers) is not counted as growth;
    the cells' output goes to /dev/null, not to a buffer that would grow with them."""
    notebook = psutil.Process()

    def rss() -> int:
        gc.collect()
        return notebook.memory_info().rss

    fds_before_start = notebook.num_fds()
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        ip.run_line_magic("mpirun_session", "start -i 2 -g 2 --quiet")
        try:
            for _ in range(5):
                ip.run_cell_magic("mpirun_remote", "--quiet", WARM_CELL)
            rss_before, fds_before = rss(), notebook.num_fds()
            times = timed(lambda: ip.run_cell_magic("mpirun_remote", "--quiet", WARM_CELL), cells)
            rss_after, fds_after = rss(), notebook.num_fds()
        finally:
            ip.run_line_magic("mpirun_session", "stop")
    gc.collect()
    window = min(100, max(1, cells // 2))
    slowest = max(range(cells), key=times.__getitem__)
    return {"cells": cells, "rss growth": (rss_after - rss_before) / 2**20, "fds before start": fds_before_start,
            "fds before": fds_before, "fds after": fds_after, "fds after stop": notebook.num_fds(),
            "window": window, "first": median(times[:window]), "last": median(times[-window:]),
            "slowest": times[slowest], "slowest cell": slowest + 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--soak", type=int, default=1000, help="warm cells of the soak; 0 skips it")
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS), help="run only these parts")
    args = parser.parse_args()
    ip = shell()
    if "warm" in args.only:
        with contextlib.redirect_stdout(io.StringIO()):
            warm = warm_cells(ip, args.repeats)
            px = ipyparallel_cells(ip, args.repeats)
        print_warm(warm, px, args.repeats)
    if "large" in args.only:
        with contextlib.redirect_stdout(io.StringIO()):
            big = large_value(ip, 5)
        print("unchanged 1 GiB array read by a cell:")
        for label, seconds in big.items():
            print(f"  {label:<34} {seconds * 1000:7.1f} ms")
        print(f"  ratio second use / one-off cell = {big['second use'] / big['one-off cell']:.3f}")
    if "start" in args.only:
        with contextlib.redirect_stdout(io.StringIO()):
            start = session_start(ip, 5)
        print("session start, 4 ranks:")
        print(f"  %mpirun_session start              {start['session start']:7.3f} s")
        print(f"  one-off cell of the same shape     {start['one-off cell']:7.3f} s")
        print(f"  ratio start / one-off cell = {start['session start'] / start['one-off cell']:.2f}")
    if "soak" in args.only and args.soak > 0:
        print_soak(soak(ip, args.soak))


def print_warm(warm: dict[str, float], px: dict[str, float] | None, repeats: int) -> None:
    print(f"session, 4 ranks (2 x 2), medians ({repeats} warm cells):")
    print(f"  warm cell, --quiet                 {warm['session --quiet'] * 1000:7.1f} ms")
    print(f"  warm cell, with its view           {warm['session, with its view'] * 1000:7.1f} ms")
    print(f"  one-off cell                       {warm['one-off'] * 1000:7.1f} ms")
    if px is not None:
        print(f"  ipyparallel %%px, 4 MPI engines    {px['%%px'] * 1000:7.1f} ms (cluster start {px['start']:.1f} s)")
        print(f"  ratio session / %%px = {warm['session --quiet'] / px['%%px']:.2f}")
    else:
        print("  ipyparallel not installed: pip install ipyparallel for the %%px baseline")
    print(f"  ratio session / one-off cell = {warm['session --quiet'] / warm['one-off']:.3f}")


def print_soak(result: dict) -> None:
    """The figures, and a note for each one past what a long notebook may cost (the benchmark
    measures: its exit status says nothing of them)."""
    window = result["window"]
    print(f"soak, {result['cells']} warm cells on a 4-rank session (2 x 2):")
    print(f"  notebook RSS growth                {result['rss growth']:7.1f} MiB (limit {SOAK_RSS_LIMIT_MIB} MiB)")
    print(f"  open descriptors: before {result['fds before']}, after the cells {result['fds after']}, "
          f"after stop {result['fds after stop']} (before start {result['fds before start']})")
    print(f"  first {window} cells median {result['first'] * 1000:5.1f} ms, last {window} median "
          f"{result['last'] * 1000:5.1f} ms, ratio last/first = {result['last'] / result['first']:.2f}")
    print(f"  slowest cell {result['slowest'] * 1000:6.1f} ms (cell {result['slowest cell']})")
    if result["rss growth"] > SOAK_RSS_LIMIT_MIB:
        print(f"  over the limit: the notebook grew {result['rss growth']:.1f} MiB, more than {SOAK_RSS_LIMIT_MIB} MiB")
    if result["fds after"] > result["fds before"]:
        print(f"  over the limit: the cells left {result['fds after'] - result['fds before']} descriptors open")
    if result["fds after stop"] > result["fds before start"]:
        print(f"  over the limit: {result['fds after stop'] - result['fds before start']} descriptors open "
              "after the session stopped")


if __name__ == "__main__":
    main()
