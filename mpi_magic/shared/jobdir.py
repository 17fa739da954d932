"""Job folders: one per run, private to the user, under the cache directory; old ones pruned.

``<cache_dir>/jobs/<job name>/`` holds ``payload.bin``, ``job.json`` (what ran, when, how it
ended), ``logs/rank-N.log``, ``logs/all.log`` and ``logs/events.jsonl`` (the events the notebook's
view folded, to reopen the job later), and ``results/rank-N.bin``. Payloads and
logs may hold the user's data, so every folder made here is 0700 and every file 0600, whatever
the umask, and a tree that another user could change is refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import stat
import time
from typing import IO, Any

from .payload import PAYLOAD_FILE

STACKS_FOLDER = "stacks"  # in a job's folder: its ranks' stack dumps while it runs (shared/stacks.py)

JOB_FILE = "job.json"
_MOVE_IT = "%mpirun_config cache_dir=... or MPI_MAGIC_CACHE_DIR"


class FolderError(Exception):
    """The cache folder cannot hold job folders, or others could change them (one sentence)."""


def new_job_name(prefix: str = "mpi") -> str:
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def prepare(cache_dir: str) -> str:
    """``<cache_dir>/jobs``, made if missing; ``FolderError`` if it cannot be used or is not private."""
    jobs = os.path.join(cache_dir, "jobs")
    try:
        make_private_dirs(jobs)
    except OSError as exc:
        blocking = _first_file(jobs)
        why = (f"{blocking} is a file, not a folder" if blocking
               else f"{exc.filename or jobs} cannot be created ({exc.strerror})")
        raise FolderError(f"the cache folder {cache_dir} cannot hold job folders: {why}; choose another with {_MOVE_IT}")
    for folder in (cache_dir, jobs):
        info = os.stat(folder)
        if info.st_uid != os.geteuid():
            raise FolderError(f"{folder} belongs to another user (uid {info.st_uid}), who could change what the ranks "
                              f"run; choose a cache folder of your own with {_MOVE_IT}")
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise FolderError(f"{folder} can be written by other users, who could change what the ranks run; "
                              f"chmod 700 {folder}, or choose another cache folder with {_MOVE_IT}")
    if not os.access(jobs, os.W_OK | os.X_OK):
        raise FolderError(f"the cache folder {cache_dir} cannot hold job folders: {jobs} is not writable; "
                          f"choose another with {_MOVE_IT}")
    return jobs


def _first_file(path: str) -> str | None:
    """The nearest of ``path`` and its parents that exists and is not a folder."""
    while True:
        if os.path.lexists(path) and not os.path.isdir(path):
            return path
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def make_private_dirs(path: str) -> None:
    """Make ``path`` and its missing parents, each 0700 whatever the umask; existing ones are left alone."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent != path:
        make_private_dirs(parent)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if os.path.isdir(path):
            return  # made meanwhile, by another kernel
        raise
    os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask


def open_private(path: str, mode: str = "w", **kwargs: Any) -> IO:
    """``open(path, mode)`` for writing ("w", "a", "wb", "ab"), the file 0600 whatever the umask."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)  # os.open's mode is filtered by the umask, and an existing file keeps its own
    return os.fdopen(fd, mode, **kwargs)


def create(cache_dir: str, name: str, reuse: bool = False) -> str:
    """A fresh job folder in the jobs folder that ``prepare`` checked."""
    job_dir = os.path.join(cache_dir, "jobs", name)
    if reuse and os.path.isdir(job_dir):
        return job_dir
    for folder in (job_dir, os.path.join(job_dir, "logs"), os.path.join(job_dir, "results")):
        os.mkdir(folder, 0o700)
        os.chmod(folder, 0o700)
    return job_dir


def record(job_dir: str, **fields: Any) -> None:
    """Merge ``fields`` into the folder's job.json (nothing, if the folder has gone)."""
    if not os.path.isdir(job_dir):
        return
    path = os.path.join(job_dir, JOB_FILE)
    data = read_record(job_dir)
    data.update(fields)
    tmp = path + ".tmp"
    with open_private(tmp) as f:
        json.dump(data, f, indent=1, default=str)
    os.replace(tmp, path)


def read_record(job_dir: str) -> dict[str, Any]:
    try:
        with open(os.path.join(job_dir, JOB_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def prune(cache_dir: str, keep: int, new_job_dir: str) -> list[str]:
    """Delete the oldest folders of jobs no longer running, so that ``keep`` remain, the new one included."""
    jobs = os.path.join(cache_dir, "jobs")
    others = [os.path.join(jobs, n) for n in os.listdir(jobs) if os.path.join(jobs, n) != new_job_dir]
    removed = []
    for job_dir in sorted(others, key=_mtime, reverse=True)[keep - 1:]:
        if is_running(read_record(job_dir)):
            continue
        shutil.rmtree(job_dir, ignore_errors=True)
        removed.append(job_dir)
    return removed


def kept_jobs(cache_dir: str) -> list[dict[str, Any]]:
    """What job.json says of each job folder kept, newest first (as ``prune`` orders them), with its ``name``."""
    jobs = os.path.join(cache_dir, "jobs")
    try:
        folders = [os.path.join(jobs, name) for name in os.listdir(jobs)]
    except FileNotFoundError:
        return []
    return [{**read_record(folder), "name": os.path.basename(folder)}
            for folder in sorted(folders, key=_mtime, reverse=True) if os.path.isdir(folder)]


def finished(job_dir: str) -> None:
    """The job has ended: its payload goes (it may hold large data), unless the job was started with
    ``keep_payloads``, and so do its ranks' stack dumps; logs, results and job.json stay."""
    shutil.rmtree(os.path.join(job_dir, STACKS_FOLDER), ignore_errors=True)
    if not read_record(job_dir).get("keep_payload"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(job_dir, PAYLOAD_FILE))


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def is_running(data: dict[str, Any]) -> bool:
    """Whether the job's launcher runs (or, where it runs elsewhere, the kernel that follows it)."""
    if data.get("status") not in (None, "running"):
        return False
    pid, started = data.get("launcher_pid"), data.get("launcher_started")
    if not pid:
        pid, started = data.get("follower_pid"), data.get("follower_started")
    if not pid:
        return False
    import psutil  # the notebook's side alone prunes folders: ranks import this module without it

    try:
        return abs(psutil.Process(pid).create_time() - started) < 1
    except (psutil.Error, TypeError):
        return False
