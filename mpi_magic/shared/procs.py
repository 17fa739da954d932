"""Processes and ports of this machine: everything a job started, a free port for it, and
a process that dies with its parent. Light to import: the rank runtime uses it too."""

from __future__ import annotations

import os
import sys
from . import envvars

TYPE_CHECKING = False
if TYPE_CHECKING:
    import psutil


LOWEST_PORT = 15000  # free ports are picked from here up to the ephemeral range
PORT_TRIES = 64


def free_port() -> int:
    """A TCP port nothing listens on now, for a server that binds it a moment later.

    Picked below the system's ephemeral range where there is room: every outgoing connection takes
    its local port from that range, and on a busy machine (many short connections) one of them
    could take a port picked there before its server binds it (EADDRINUSE)."""
    import random
    import socket

    below = ephemeral_ports()[0]
    for port in random.sample(range(LOWEST_PORT, below), min(PORT_TRIES, max(0, below - LOWEST_PORT))):
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:  # in use
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ephemeral_ports() -> tuple[int, int]:
    """The range the system takes outgoing connections' local ports from (Linux's setting, else
    the IANA dynamic range that macOS and Windows use)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = f.read().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49152, 65535


def job_processes(leader: int, job: str | None = None, started: float | None = None) -> list[psutil.Process]:
    """``leader``'s process tree, every other process of the session it leads, and (given
    ``job``) every process whose ``MPI_MAGIC_JOB`` names that job: a job's processes,
    including those that left its tree or started a process group of their own (setsid). Given the leader's
    ``started`` time, a number another process has taken since it ended names nothing."""
    import psutil

    members = {}
    try:
        root = psutil.Process(leader)
        if started is not None and abs(root.create_time() - started) >= 1:  # (as read: boot time + ticks)
            leader = -1  # reused: its tree and process group are another process's
        else:
            members = {p.pid: p for p in [root, *root.children(recursive=True)]}
    except psutil.Error:
        pass
    me = os.getpid()
    for pid in psutil.pids():
        if pid in members or pid == me:
            continue
        if _unix_session_of(pid) == leader or (job is not None and _marked(pid, job)):
            try:
                members[pid] = psutil.Process(pid)
            except psutil.Error:
                pass
    return list(members.values())


def _marked(pid: int, job: str) -> bool:
    """Whether process ``pid``'s environment sets ``MPI_MAGIC_JOB`` to ``job``. Linux's /proc is
    searched as it is: psutil would parse every process's whole environment, every time a job ends."""
    import psutil

    if not sys.platform.startswith("linux"):
        try:
            return psutil.Process(pid).environ().get(envvars.JOB) == job
        except psutil.Error:
            return False
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"\0{envvars.JOB}={job}\0".encode() in b"\0" + f.read()
    except OSError:  # ended, or another user's
        return False


def _unix_session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def alive(pid: int, group: bool = False) -> bool:
    """True while process ``pid`` (with ``group``, any process of process group ``pid``) exists,
    another user's included."""
    if pid <= 0:
        return False
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: it exists
        return True
    return True


def die_with_parent(signum: int) -> None:
    """Have the kernel send ``signum`` to this process when its parent dies (Linux; elsewhere
    nothing happens). Called in mpirun before it runs, and in each rank."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signum)
