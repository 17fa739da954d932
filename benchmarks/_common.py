"""Shared pieces of the benchmarks: a shell with the extension, and bare mpirun for baselines."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

from IPython.core.interactiveshell import InteractiveShell

from mpi_magic.backends import launcher


def shell() -> InteractiveShell:
    if "MPI_MAGIC_CACHE_DIR" not in os.environ:  # the benchmark's jobs, removed when it ends
        os.environ["MPI_MAGIC_CACHE_DIR"] = tempfile.mkdtemp(prefix="mpi_magic_bench_")
        atexit.register(shutil.rmtree, os.environ["MPI_MAGIC_CACHE_DIR"], ignore_errors=True)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "mpi_magic")
    return ip


@contextlib.contextmanager
def rehearsal_shell(pace: str = "none", instance_start: float | None = None) -> Iterator[InteractiveShell]:
    """A shell whose cells run as SageMaker jobs on the rehearsal cloud (a moto server and the
    SageMaker emulator on loopback, answering at ``pace``: ``aws_pace``), for as long as the block runs."""
    from mpi_magic.testing.local_aws import local_aws

    with local_aws(pace=pace, instance_start=instance_start) as env:
        os.environ.update(env)
        import boto3

        boto3.client("s3").create_bucket(Bucket="mpi-magic-bench")
        ip = shell()
        ip.run_line_magic("mpirun_config", "backend=sagemaker instance_type=ml.m5.xlarge image_uri=local/emulated "
                                           "role=arn:aws:iam::123456789012:role/bench s3_root=s3://mpi-magic-bench/jobs")
        yield ip


def bare_mpirun(world_size: int, code: str, tuned: bool) -> tuple[list[str], dict[str, str]]:
    """argv and environment of mpirun running ``python -c code`` as our local backend would launch it."""
    found = launcher.find_launcher(os.environ.get("MPI_MAGIC_MPIRUN"))
    argv = launcher.mpirun_argv(found, world_size, [sys.executable, "-c", code], [], os.cpu_count() or 1)
    env = dict(os.environ)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    if tuned:
        env = launcher.launcher_environ(found, env, os.geteuid() == 0)
    return argv, env


def timed(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def interleaved(fns: list, repeats: int) -> list[list[float]]:
    """Seconds of each of ``fns`` per round, the functions taking turns within each round, so a
    load that comes and goes on the machine weighs on each of them alike."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, spent in zip(fns, times):
            spent.extend(timed(fn, 1))
    return times


def bare_launch(world_size: int, code: str, tuned: bool) -> Callable[[], None]:
    """A bare mpirun run of ``code``, its command found beforehand (what a timing should not count),
    with a session folder of its own, as each launch of the magic has (``launcher.tmpdir_variable``)."""
    argv, env = bare_mpirun(world_size, code, tuned)
    variable = launcher.tmpdir_variable(launcher.find_launcher(os.environ.get("MPI_MAGIC_MPIRUN")))

    def run() -> None:
        with tempfile.TemporaryDirectory(prefix="mpi_magic_bench_mpirun_") as folder:
            subprocess.run(argv, env={**env, variable: folder} if variable else env, check=True,
                           stdout=subprocess.DEVNULL)

    return run


def median(values: list[float]) -> float:
    return statistics.median(values)


class NoDisplay:
    """Where a benchmark's widget view "displays" itself: nowhere, as fast as can be."""

    def __call__(self, obj, display_id=False):
        return self

    def update(self, obj):
        pass


def warm_cells(ip: InteractiveShell, line: str, cell: str, repeats: int) -> list[float]:
    """Seconds each of ``repeats`` warm runs of ``cell`` took on a session started with ``line`` (its first
    cell, which warms it, not counted); the session stopped after."""
    ip.run_line_magic("mpirun_session", f"start {line} --quiet")
    try:
        ip.run_cell_magic("mpirun_remote", "--quiet", cell)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            ip.run_cell_magic("mpirun_remote", "--quiet", cell)
            times.append(time.perf_counter() - started)
        return times
    finally:
        ip.run_line_magic("mpirun_session", "stop")
