"""Servers the stand-ins run (moto, the SageMaker emulator, Slurm's daemons, a test's Jupyter): each in a
session of its own, so that an interrupt meant for whoever started it (Ctrl-C in a terminal, or a
kernel's interrupt, which Jupyter sends to the kernel's whole process group) does not end it under
them, and each sent SIGTERM when the process that started it dies without stopping it (Linux)."""

from __future__ import annotations

import signal
import subprocess

from ..shared import procs


def start(argv: list[str], ends_with_parent: bool = True, **popen) -> subprocess.Popen:
    """``argv`` as a server of the calling thread's process: it ends when that thread does, unless stopped
    before (start it from a thread that lives as long as the server should, the main one), or unless not
    ``ends_with_parent`` (a server started by a command that returns, to be stopped later)."""
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=_ends_with_parent if ends_with_parent else None, **popen)


def stop(server: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM, and SIGKILL after ``grace`` seconds; returns once it has ended."""
    server.terminate()
    try:
        server.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def _ends_with_parent() -> None:
    procs.die_with_parent(signal.SIGTERM)
