"""The script of a job and the line that runs it: ``salloc`` for a cell's one-off job, which runs the
script on this machine once the allocation is granted (mpirun there starts its daemons on the nodes
through srun, as it would inside a batch job, without Slurm starting a batch job first), and
``sbatch`` for a session's ranks, which live on between the notebook's calls. What ``--dry-run``
prints, and what runs.

The script starts the launcher in the background and waits for it, so that a signal Slurm sends
the script's shell (``scancel --signal``, the time limit's SIGTERM) reaches the launcher and the ranks
instead of ending the shell alone; it then writes the launcher's exit status into the job
folder, which is how the notebook learns at once that the job is over.
"""

from __future__ import annotations

import os
import shlex

from ...options import LaunchOptions
from ...shared import envvars

OUTPUT, ERRORS = "launcher.out", "launcher.err"  # in the job folder: the launcher's stdout and stderr
EXIT_FILE = "launcher.exit"  # in the job folder: the launcher's exit status, once it has ended
PID_FILE = "launcher.pid"  # in the job folder: the launcher's process id, where it runs
SCRIPT_FILE = "job.sh"


def sbatch_argv(sbatch: str, job_dir: str, job_name: str, options: LaunchOptions, gpus_per_node: int) -> list[str]:
    """``sbatch --parsable`` of the job's script, its output going into the job folder. ``--no-requeue``:
    where a cluster requeues a job whose node failed (``JobRequeue=1``, Slurm's default), the cell
    would run again later by itself, with nobody watching."""
    return [sbatch, "--parsable", "--no-requeue", f"--job-name={job_name}", f"--chdir={os.getcwd()}",
            f"--output={os.path.join(job_dir, OUTPUT)}", f"--error={os.path.join(job_dir, ERRORS)}",
            *shape(options, gpus_per_node), os.path.join(job_dir, SCRIPT_FILE)]


def salloc_argv(salloc: str, job_dir: str, job_name: str, options: LaunchOptions, gpus_per_node: int) -> list[str]:
    """``salloc`` of the job's shape running the job's script here (its output and errors go into the job
    folder, as a batch job's do: the caller opens them). Slurm never requeues such a job, so salloc takes
    no word on it (``--requeue`` in ``--slurm-args``, meant for a batch job, is left out)."""
    asked = [word for word in shape(options, gpus_per_node) if word not in ("--requeue", "--no-requeue")]
    return [salloc, f"--job-name={job_name}", f"--chdir={os.getcwd()}", *asked, "/bin/bash",
            os.path.join(job_dir, SCRIPT_FILE)]


def shape(options: LaunchOptions, gpus_per_node: int) -> list[str]:
    """What the job asks of Slurm: ``--instances`` nodes of ``--gpus`` tasks each, GPUs where the
    partition has them, the user's settings, then ``--slurm-args``."""
    settings = options.settings
    argv = [f"--nodes={options.instances}", f"--ntasks-per-node={options.procs_per_instance}"]
    if gpus_per_node:
        argv.append(f"--gres=gpu:{min(gpus_per_node, options.procs_per_instance)}")
    for name in ("partition", "time", "account", "qos", "constraint", "reservation"):
        if settings.get(name):
            argv.append(f"--{name}={settings[name]}")
    return [*argv, *settings.get("slurm_args", [])]


# where rank 0 runs, told to the ranks (torch.distributed's env://): the allocation's first node; from a batch
# job's script, which runs there, its own name; from salloc's, which runs here, the address Slurm reaches it at
# (a node's name in Slurm need not resolve where the cluster gives it an address of its own)
_FIRST_NODE_HERE = ('first_node="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"\n'
                    'first_address="$(scontrol show node -o "$first_node" '
                    '| sed -n \'s/.*NodeAddr=\\([^ ]*\\).*/\\1/p\')"\n'
                    'first_address="${first_address:-$first_node}"')
_FIRST_NODE_THERE = 'first_address="$(hostname)"'


def batch_script(job_name: str, job_dir: str, launch: list[str], env: dict[str, str], here: bool) -> str:
    """The script: the job's variables, then ``launch`` (mpirun or srun and the rank runtime); ``here``:
    run by salloc on this machine, else by sbatch on the allocation's first node."""
    exports = "\n".join(f"export {key}={shlex.quote(value)}" for key, value in env.items())
    exit_file = shlex.quote(os.path.join(job_dir, EXIT_FILE))
    return f"""#!/bin/bash
# mpi_magic job {job_name}: the ranks of one cell, or a session's (written by mpi_magic, run by salloc or sbatch)
{exports}
{_FIRST_NODE_HERE if here else _FIRST_NODE_THERE}
export {envvars.MASTER_ADDR}="$first_address"  # the allocation's first node, where rank 0 runs
export {envvars.MASTER_PORT}=$((20000 + SLURM_JOB_ID % 40000))  # one job's own, on that node
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
trap : INT TERM  # the shell outlives the signal; the launcher and the ranks get theirs (from Slurm, or from here)
{" ".join(shlex.quote(word) for word in launch)} &
launcher=$!
(umask 077; echo "$launcher" > {shlex.quote(os.path.join(job_dir, PID_FILE))})  # private, as the exit status
while :; do
  wait "$launcher"; status=$?
  kill -0 "$launcher" 2>/dev/null || break  # wait returned for a signal: the launcher runs on
done
umask 077  # the exit status is private like the rest of the job folder (the cell's own files keep the job's umask)
echo "$status" > {exit_file}
exit "$status"
"""
