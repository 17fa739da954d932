"""What a cell's MPIJob's launcher pod runs: mpirun over every worker of the operator's hostfile,
each rank running the cell whose payload is in the job folder (on the volume the notebook and the
pods share).

The image's mpirun decides its own arguments: its version is said first (the notebook reads its
ranks' tags by it), and Open MPI 5's launcher ignores the operator's ``OMPI_MCA_orte_*`` variables,
so the hostfile they name, ssh that gives up on a silent worker and the forwarding of the stack
requests' signals are given on the command line. mpirun starts the ranks over ssh, which passes on
no variable of the pod: the job's own are forwarded with ``-x``. The pod's end is mpirun's: its
output is the pod's log, which the notebook follows, and a SIGTERM (the job deleted) goes to
mpirun, which stops the ranks.

    python3 -m mpi_magic.backends.kubernetes.bootstrap JOB_DIR [--digest SHA256] [-- MPIRUN_ARGS...]
    python3 -m mpi_magic.backends.kubernetes.bootstrap FOLDER --session ADDRESS [--idle-timeout S] [-- ...]
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from ...shared import envvars, fabric, remote_hosts, stacks

HOSTFILE_VARIABLE = "OMPI_MCA_orte_default_hostfile"  # set by the MPI Operator in the launcher
HOSTFILE = "/etc/mpi/hostfile"  # where the operator mounts it
ANNOUNCED = "mpi_magic launcher runs "  # the log's first line: then what the image's ``mpirun --version`` says first
STACKS_REQUEST = "stacks-request"  # in the job folder: written by the notebook to ask every rank for its stack
SESSION_SECRET = "session-secret"  # in a session's folder: the channel's secret, which the API never carries
REQUEST_LOOK = 0.5  # seconds between looks at the stacks request
WORKERS_LIMIT = 300.0  # seconds the workers' sshd get to listen (the launcher starts once their pods run)
# what the ranks get of the pod's environment (mpirun over ssh passes on none of it)
FORWARDED_PREFIXES = (envvars.PREFIX, "NCCL_", "FI_", "OMP_", "CUDA_", "PYTHON", "LD_LIBRARY_PATH", "PATH")


def announced_version(line: str) -> str | None:
    """What the image's mpirun said of its version, from the launcher's first line; None for another line."""
    return line[len(ANNOUNCED):].strip() if line.startswith(ANNOUNCED) else None


def mpirun_argv(mpirun: str, version: str, hostfile: str, world_size: int, command: list[str],
                user_args: list[str], environ: dict[str, str]) -> list[str]:
    """mpirun's line for ``world_size`` ranks of ``command`` over the hosts of ``hostfile``."""
    match = re.search(r"(\d+)\.\d+", version)
    major = int(match.group(1)) if match else 5
    forwarded = sorted(name for name in environ if name.startswith(FORWARDED_PREFIXES) or
                       name in set(environ.get(envvars.ENV_NAMES, "").split()))
    launch = ["--hostfile", hostfile, "-np", str(world_size), "--tag-output", "--bind-to", "none"]
    launch += remote_hosts.ssh_args(major, user_args, environ)
    launch += stacks.forwarding_args(major, user_args, environ)
    launch += fabric.mca_args(user_args, environ)
    if major < 5:
        launch.append("--allow-run-as-root")
    return [mpirun, *launch, *(arg for name in forwarded for arg in ("-x", name)), *user_args, *command]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the job deleted before mpirun started (as PID 1)
    own, user_args = _split(argv)
    job_dir = own[0]
    if "--session" in own:  # a session's ranks, waiting for cells from the notebook (the secret read, not sent)
        with open(os.path.join(job_dir, SESSION_SECRET)) as f:
            os.environ[envvars.SESSION_SECRET] = f.read().strip()
        command = [sys.executable, "-m", "mpi_magic.runtime", *own[own.index("--session"):]]
    else:
        digest = own[own.index("--digest") + 1] if "--digest" in own else None
        command = [sys.executable, "-m", "mpi_magic.runtime", job_dir, *(["--digest", digest] if digest else [])]
    mpirun = os.environ.get(envvars.MPIRUN) or shutil.which("mpirun") or "mpirun"
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    print(ANNOUNCED + (version[0] if version else "(its version unknown)"), flush=True)
    world_size = int(os.environ[envvars.INSTANCES]) * int(os.environ[envvars.PROCS_PER_INSTANCE])
    if os.geteuid() == 0:  # containers run as root; Open MPI refuses that unless told
        os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    hostfile = os.environ.get(HOSTFILE_VARIABLE) or HOSTFILE
    silent = wait_for_workers(hostfile)
    if silent:
        print(f"mpi_magic launcher: no sshd answered on port 22 of {', '.join(silent)} within {WORKERS_LIMIT:g}s: "
              "does the image run /usr/sbin/sshd there (the workers' command), and do the workers' names "
              "resolve in the launcher (the operator's Service)?", flush=True)
        return 1
    line = mpirun_argv(mpirun, version[0] if version else "", hostfile, world_size, command, user_args,
                       dict(os.environ))
    process = subprocess.Popen(line)
    signal.signal(signal.SIGTERM, lambda *_: process.send_signal(signal.SIGTERM))  # the job deleted
    threading.Thread(target=ask_for_stacks, args=(process, os.path.join(job_dir, STACKS_REQUEST)), daemon=True).start()
    status = process.wait()
    return 128 - status if status < 0 else status  # killed by a signal: as a shell says it


def wait_for_workers(hostfile: str, limit: float = WORKERS_LIMIT) -> list[str]:
    """Until every worker of ``hostfile`` takes connections on ssh's port (its pod runs before its sshd
    listens), at most ``limit`` seconds; the workers that never did."""
    with open(hostfile) as f:
        waiting = [line.split()[0] for line in f if line.strip() and not line.startswith("#")]
    deadline = time.monotonic() + limit
    while waiting and time.monotonic() < deadline:
        waiting = [host for host in waiting if not _listening(host)]
        if waiting:
            time.sleep(0.1)
    return waiting


def _listening(host: str) -> bool:
    try:
        with socket.create_connection((host, 22), timeout=remote_hosts.CONNECT_TIMEOUT):
            return True
    except OSError:
        return False


def ask_for_stacks(mpirun: subprocess.Popen, request: str) -> None:
    """Ask every rank for its stack whenever the notebook writes ``request`` anew (at a stall, on
    Ctrl-C, %mpirun_stacks): mpirun forwards the signal to the ranks on every worker, and each sends
    its stack as an event through this log; a rank that has not answered is asked the second way."""
    def written() -> str | None:  # (the notebook's time: a shared filesystem's mtime may be coarse)
        try:
            with open(request) as f:
                return f.read()
        except OSError:
            return None

    seen, fallback_due = written(), None
    while mpirun.poll() is None:
        time.sleep(REQUEST_LOOK)
        try:
            if fallback_due is not None and time.monotonic() >= fallback_due:
                fallback_due = None
                mpirun.send_signal(getattr(signal, stacks.FALLBACK_NAME))
            now = written()
            if now is not None and now != seen:
                seen = now
                mpirun.send_signal(getattr(signal, stacks.SIGNAL_NAME))
                fallback_due = time.monotonic() + stacks.FALLBACK_AFTER
        except OSError:
            return


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the bootstrap's own arguments, mpirun's from the cell's --mpirun-args, after ``--``)."""
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return argv, []


if __name__ == "__main__":
    sys.exit(main())
