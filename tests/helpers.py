"""Helpers shared by the tests."""

from __future__ import annotations

import contextlib
import threading
import time

BUCKET = "mpi-magic-tests"  # on each test module's own moto server (the ``aws`` fixture)
ROLE = "arn:aws:iam::123456789012:role/mpi-magic-test"


@contextlib.contextmanager
def once_running(ip, *actions, pause: float = 0.3, limit: float = 60.0):
    """While the block runs a cell: wait until every rank of job `job` runs, then do each action."""
    def act():
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            job = ip.user_ns.get("job")
            if job is not None and all(r.status == "running" for r in job.ranks):
                break
            time.sleep(0.05)
        for action in actions:
            time.sleep(pause)
            action()

    thread = threading.Thread(target=act)
    thread.start()
    try:
        yield
    finally:
        thread.join()
