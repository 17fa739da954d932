"""Job folders: one per run, private to the user, under the cache directory; old ones pruned.

``<cache_dir>/jobs/<job name>/`` holds ``payload.bin``, ``job.json`` (what ran, when, how it
ended), ``logs/rank-N.log`` and ``logs/all.log``, and ``results/rank-N.bin``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from typing import Any

import psutil

JOB_FILE = "job.json"


def new_job_name(prefix: str = "mpi") -> str:
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def create(cache_dir: str, name: str, reuse: bool = False) -> str:
    """A fresh job folder (mode 0700: payloads and logs may hold the user's data).

    Only folders made here are restricted; a cache_dir the user already had is left as it is.
    """
    jobs = os.path.join(cache_dir, "jobs")
    if not os.path.isdir(jobs):
        os.makedirs(jobs, mode=0o700, exist_ok=True)
        os.chmod(jobs, 0o700)  # makedirs' mode is filtered by the umask
    job_dir = os.path.join(jobs, name)
    if reuse and os.path.isdir(job_dir):
        return job_dir
    os.mkdir(job_dir, 0o700)
    os.mkdir(os.path.join(job_dir, "logs"), 0o700)
    os.mkdir(os.path.join(job_dir, "results"), 0o700)
    return job_dir


def record(job_dir: str, **fields: Any) -> None:
    """Merge ``fields`` into the folder's job.json (nothing, if the folder has gone)."""
    if not os.path.isdir(job_dir):
        return
    path = os.path.join(job_dir, JOB_FILE)
    data = read_record(job_dir)
    data.update(fields)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=str)
    os.replace(tmp, path)


def read_record(job_dir: str) -> dict[str, Any]:
    try:
        with open(os.path.join(job_dir, JOB_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def prune(cache_dir: str, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` job folders whose job is no longer running."""
    jobs = os.path.join(cache_dir, "jobs")
    try:
        names = os.listdir(jobs)
    except FileNotFoundError:
        return []
    folders = sorted((os.path.join(jobs, n) for n in names), key=_mtime, reverse=True)
    removed = []
    for job_dir in folders[keep:]:
        if _is_running(read_record(job_dir)):
            continue
        shutil.rmtree(job_dir, ignore_errors=True)
        removed.append(job_dir)
    return removed


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _is_running(data: dict[str, Any]) -> bool:
    if data.get("status") not in (None, "running"):
        return False
    pid, started = data.get("launcher_pid"), data.get("launcher_started")
    if not pid:
        return False
    try:
        return abs(psutil.Process(pid).create_time() - started) < 1
    except (psutil.Error, TypeError):
        return False
