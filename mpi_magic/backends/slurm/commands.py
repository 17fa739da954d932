"""Slurm's own client commands (``salloc``, ``sbatch``, ``squeue``, ``scancel``, ``sinfo``, ``scontrol``),
run unchanged from PATH, and what they say when they refuse."""

from __future__ import annotations

import re
import shutil
import subprocess

from ...errors import BackendSetupError


class SlurmSetupError(BackendSetupError):
    """Slurm cannot take the job as asked (no client, an unknown partition, a limit); nothing was submitted."""


CALL_LIMIT = 30.0  # seconds one client call may take: a busy slurmctld answers within seconds
NO_CLIENT = ("no Slurm client on PATH ({name} not found): run the notebook where Slurm's commands work "
             "(a login node, or a HyperPod cluster's head node), or add their folder to PATH")


def client(name: str) -> str:
    """The path of Slurm's ``name`` command; ``SlurmSetupError`` where it is missing."""
    path = shutil.which(name)
    if path is None:
        raise SlurmSetupError(NO_CLIENT.format(name=name))
    return path


def run(name: str, *args: str) -> subprocess.CompletedProcess:
    """``name args...``, its output as text; ``SlurmSetupError`` where it takes over ``CALL_LIMIT``
    seconds. Its exit status is the caller's to read."""
    try:
        return subprocess.run([client(name), *args], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=CALL_LIMIT)
    except subprocess.TimeoutExpired:
        raise SlurmSetupError(f"{name} did not answer within {CALL_LIMIT:g}s: is slurmctld up? "
                              "(scontrol ping says)") from None


def said(completed: subprocess.CompletedProcess) -> str:
    """Slurm's reason, without its prefix: "sbatch: error: Batch job submission failed: Invalid
    account" -> "Batch job submission failed: Invalid account"."""
    lines = [line.strip() for line in (completed.stderr or completed.stdout or "").splitlines()
             if line.strip() and not line.startswith('Try "')]  # (getopt's "Try "salloc --help" ...")
    errors = [line for line in lines if ": error: " in line] or lines
    if not errors:
        return f"exit status {completed.returncode}"
    return _PREFIX.sub("", errors[-1]).strip()


_PREFIX = re.compile(r"^(?:(?:/\S*/)?[a-z]+: )*(?:error: )?")  # "sbatch: error: ", "srun: ", "/usr/bin/salloc: "
