"""Helpers shared by the tests."""

from __future__ import annotations

import contextlib
import os
import threading
import time

BUCKET = "mpi-magic-tests"  # on each test module's own moto server (the ``aws`` fixture)
ROLE = "arn:aws:iam::123456789012:role/mpi-magic-test"


def run(ip, line: str, cell: str):
    """Run ``cell`` under ``%%mpirun_remote line`` in the shell ``ip``."""
    return ip.run_cell_magic("mpirun_remote", line, cell)


@contextlib.contextmanager
def once(ready, *actions, pause: float = 0.3, limit: float = 60.0):
    """While the block runs a cell: once ``ready()`` holds (or after ``limit`` seconds), do each
    action, ``pause`` seconds apart (``_thread.interrupt_main`` is Ctrl-C)."""
    def act():
        deadline = time.monotonic() + limit
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.01)
        for action in actions:
            time.sleep(pause)
            action()

    thread = threading.Thread(target=act)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def once_running(ip, *actions, pause: float = 0.3, limit: float = 60.0):
    """``once`` every rank of the job named ``job`` in the notebook runs."""
    def running() -> bool:
        job = ip.user_ns.get("job")
        return job is not None and all(r.status == "running" for r in job.ranks)

    return once(running, *actions, pause=pause, limit=limit)


def held_folders(pid: int | str = "self") -> set[str]:
    """The scratch folders (``mpi_magic.scratch``) process ``pid`` holds, read from its open files."""
    from mpi_magic.scratch import LOCK_NAME

    held = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own, for this process)
            continue
        if target.endswith("/" + LOCK_NAME):
            held.add(os.path.dirname(target))
    return held
