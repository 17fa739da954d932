"""Processes and ports of this machine: everything a job started, and a free port for it."""

from __future__ import annotations

import os
import socket

import psutil


def free_port() -> int:
    """A loopback TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def session(leader: int) -> list[psutil.Process]:
    """``leader``'s process tree and every other process of the session it leads: a job's
    processes, including those that left its tree (daemonised, or orphaned by a killed parent)."""
    members = {}
    try:
        root = psutil.Process(leader)
        members = {p.pid: p for p in [root, *root.children(recursive=True)]}
    except psutil.Error:
        pass
    for pid in psutil.pids():
        if pid not in members and _session_of(pid) == leader:
            try:
                members[pid] = psutil.Process(pid)
            except psutil.Error:
                pass
    return list(members.values())


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None
