"""A real Slurm cluster on this machine, for tests and for rehearsing ``--backend slurm``.

    python -m mpi_magic.testing.slurm_cluster start --nodes 4 [--root DIR]   (prints SLURM_CONF=...)
    python -m mpi_magic.testing.slurm_cluster stop [--root DIR]                (ends it, removes DIR)

Debian's daemons, unchanged (``apt-get install slurmctld slurmd slurm-client munge``: ``.ci/run``
and ``dev.sh`` install them where they are missing; this module installs nothing): ``munged`` with
a key of the cluster's own, one ``slurmctld``, and one ``slurmd -N nK`` per node. Where this machine
can make test hosts (root: ``mpi_magic.testing.hosts``), the cluster is one as on a real network:
``slurmctld`` runs in host ``head``, node nK's ``slurmd`` in host ``nK``, each with its own address,
and this machine is the cluster's login node (Slurm's commands here reach ``slurmctld`` over its
link to the hosts). Elsewhere, or with ``--stand-in``, every node is a name for this host on a port of
its own (Debian builds slurmd to run several on one host), and mpirun in an allocation sees one host.
Processes are tracked with ``proctrack/linuxproc`` and tasks run without ``task/`` confinement, so
neither cgroups nor systemd are needed. Every daemon runs in the foreground of a session of its own,
recorded in the root folder, so ``stop`` ends each one and leaves no process behind. A cluster that
Python starts (the tests) is stopped as well when that Python ends without stopping it (killed, say):
a keeper waits for it to end, then stops the cluster (``stop --after PID``); its hosts go down with it.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from ..shared import envvars, procs
from . import hosts, servers

DAEMONS = ("munged", "slurmctld", "slurmd")
PACKAGES = "slurmctld slurmd slurm-client munge libpmix-dev"  # libpmix-dev: for srun --mpi=pmix
PIDS = "daemons.pids"  # in the root: one pid per line, each its process group's leader
UP_LIMIT = 60.0  # seconds the daemons get to come up and report every node idle
STOP_GRACE = 1.0  # seconds between SIGTERM to the daemons and SIGKILL
HEAD = "head"  # the test host slurmctld runs in (on test hosts)
BED = "bed"  # in the root: the test hosts' folder
CTLD_PORT, SLURMD_PORT = 6817, 6818  # Slurm's own ports, on test hosts (each host's are its own)
SOCKET_PATH_MAX = 107  # a Unix socket's path, in bytes (sun_path's 108, less its NUL)
# Run before each task of a job where the nodes together declare more CPUs than this machine has: Open
# MPI, which Slurm tells each node's CPUs, would busy-poll while it waits, each rank taking a core that
# others need (a collective-heavy cell then runs several times slower). A job's own value stays.
TASK_PROLOG = """#!/bin/sh
[ -n "${OMPI_MCA_mpi_yield_when_idle+set}" ] || echo export OMPI_MCA_mpi_yield_when_idle=1
"""


class ClusterError(RuntimeError):
    """The cluster could not be started (what is missing, or what a daemon said)."""


def missing_programs() -> list[str]:
    return [name for name in (*DAEMONS, "sinfo", "sbatch") if not shutil.which(name, path=_path())]


def _path() -> str:
    return os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"


class SlurmCluster:
    """A cluster of ``nodes`` nodes (``n1``..``nN``; partitions ``debug``, ``short`` and ``gpu``) under ``root``:
    on test hosts where this machine can make them, unless ``stand_in`` (every node on this host)."""

    def __init__(self, root: str, nodes: int = 4, cpus: int | None = None, outlives_me: bool = False,
                 stand_in: bool = False):
        self.root, self.nodes = os.path.abspath(root), nodes
        self.outlives_me = outlives_me  # it runs on after this process ends (the command's start), until stopped
        self.cpus = cpus or max(2, os.cpu_count() or 1)  # each node may run as many tasks as this machine has cores
        self._daemons: list[subprocess.Popen] = []  # those this process started, to be waited for
        self._keeper: subprocess.Popen | None = None  # stops the cluster if this process ends first
        # why every node runs on this host (None: each runs in a test host of its own, ``bed``)
        self.stand_in_reason = "asked for (--stand-in)" if stand_in else hosts.missing()
        self.bed = None if self.stand_in_reason else hosts.TestHosts(
            self._path(BED), names=[HEAD, *self.node_names], sshd=False, outlives_me=True)  # (the cluster's keeper)

    @property
    def node_names(self) -> list[str]:
        return [f"n{n}" for n in range(1, self.nodes + 1)]

    @property
    def layout(self) -> str:
        """Where the nodes run, in a sentence."""
        nodes = f"nodes n1..n{self.nodes}" if self.nodes > 1 else "node n1"
        if self.bed is None:
            return f"{nodes} all on this host (test hosts are not used: {self.stand_in_reason})"
        last = self.bed.address(self.node_names[-1]).rsplit(".", 1)[1]
        addresses = self.bed.address("n1") + (f"-{last}" if self.nodes > 1 else "")
        return (f"{nodes} on test hosts of their own ({addresses}), slurmctld on host {HEAD} "
                f"({self.bed.address(HEAD)}); this machine is their login node, {self.bed.login_address}")

    @property
    def conf(self) -> str:
        return os.path.join(self.root, "slurm.conf")

    @property
    def oversubscribed(self) -> bool:
        """Whether the nodes declare more CPUs together than this machine has: their ranks share cores."""
        return self.nodes * self.cpus > (os.cpu_count() or 1)

    @property
    def environ(self) -> dict[str, str]:
        """What a client needs: Slurm's commands read the cluster's configuration from SLURM_CONF; on test
        hosts, a session's rank 0 reaches the notebook at this machine's address there."""
        notebook = {envvars.PREFIX + "NOTEBOOK_HOST": self.bed.login_address} if self.bed is not None else {}  # (notebook_host)
        return {"SLURM_CONF": self.conf, **notebook}

    def start(self) -> SlurmCluster:
        missing = missing_programs()
        if missing:
            raise ClusterError(f"{', '.join(missing)} not found: install Debian's Slurm with "
                               f"apt-get install {PACKAGES}")
        longest = os.path.join(self.root, f"spool-n{self.nodes}", f"n{self.nodes}_99999999.4294967295")  # a step's
        if len(os.fsencode(longest)) > SOCKET_PATH_MAX:
            raise ClusterError(f"the cluster's folder {self.root} is too long a path for the Unix sockets the daemons "
                               f"make under it ({len(os.fsencode(longest))} bytes, {SOCKET_PATH_MAX} at most): "
                               f"choose a shorter --root")
        os.makedirs(os.path.join(self.root, "state"), mode=0o700, exist_ok=True)
        if os.path.exists(os.path.join(self.root, PIDS)):
            raise ClusterError(f"a cluster runs under {self.root} already: stop it first")
        self._write_key()
        try:
            if not self.outlives_me:
                self._keeper = servers.start([sys.executable, "-m", __name__, "stop", "--root", self.root, "--after",
                                              str(os.getpid())], ends_with_parent=False, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL)
            if self.bed is not None:
                self.bed.up()
            self._write_conf()
            # one munged, on this machine: its socket is a path that every host sees
            self._spawn(["munged", "--foreground", "--force", f"--socket={self._munge_socket}",
                         f"--key-file={self._path('munge.key')}", f"--log-file={self._path('munged.log')}",
                         f"--pid-file={self._path('munged.pid')}", f"--seed-file={self._path('munged.seed')}"])
            self._wait_for(lambda: os.path.exists(self._munge_socket), "munged did not start")
            self._spawn(["slurmctld", "-D", "-i", "-f", self.conf], host=HEAD)
            for node in self.node_names:
                for folder in ("spool", "tmp"):  # each node's own, so that two nodes' steps never meet
                    os.makedirs(self._path(f"{folder}-{node}"), mode=0o700, exist_ok=True)
                self.boot(node)
            self._wait_for(self._all_idle, "the nodes did not all come up idle")
        except BaseException:
            self.stop()
            raise
        return self

    def boot(self, node: str) -> None:
        """Node ``node``'s slurmd started: at the cluster's start, and again on a test host that was lost
        (``bed.lose``), as on a node that rebooted (Slurm puts it back in service)."""
        self._spawn(["slurmd", "-D", "-N", node, "-f", self.conf], host=node)

    def stop(self, remove: bool = False) -> None:
        """End the jobs, then every daemon (SIGTERM, then SIGKILL after a grace), then whatever a
        job left behind, and the test hosts; with ``remove``, the cluster's folder too (its logs with it)."""
        path = os.path.join(self.root, PIDS)
        bed = self.bed if self.bed is not None else hosts.TestHosts(self._path(BED), outlives_me=True)  # (the keeper's)
        try:
            with open(path) as f:
                pids = [int(line) for line in f if line.strip()]
        except FileNotFoundError:
            pids = []
        if not pids and not os.path.exists(os.path.join(self.root, BED, hosts.STATE)):
            if remove:
                shutil.rmtree(self.root, ignore_errors=True)
            return
        try:
            if pids:
                self.run("scancel", "--user", getpass.getuser(), timeout=10)
        except (OSError, subprocess.SubprocessError):
            pass  # the controller is gone already
        # SIGTERM, and a second for each daemon to end (busy with a job, slurmctld and slurmd take longer, and
        # nothing of a test cluster's state is worth the wait); then SIGKILL to what is left of its group (a
        # job's step daemon, which outlives SIGTERM)
        for signum, group, grace in ((signal.SIGTERM, False, STOP_GRACE), (signal.SIGKILL, True, 5.0)):
            for pid in pids:
                try:
                    os.killpg(pid, signum)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.monotonic() + grace
            while any(self._running(pid, group) for pid in pids) and time.monotonic() < deadline:
                time.sleep(0.05)
        for process in self._daemons:
            process.wait(timeout=5)
        self._daemons.clear()
        _kill_left_behind(self.conf)
        bed.down()  # (and whatever else still runs in a host)
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        if remove:
            shutil.rmtree(self.root, ignore_errors=True)
        if self._keeper is not None:  # (last: if this stop is cut short, the keeper finishes it)
            self._keeper.kill()
            self._keeper.wait()
            self._keeper = None

    def _running(self, leader: int, group: bool) -> bool:
        """Whether daemon ``leader`` (with ``group``, a process of its group) runs on; a daemon this process
        started is reaped here once it has ended (as a zombie it would stay, in its group too)."""
        ours = next((process for process in self._daemons if process.pid == leader), None)
        if ours is not None and ours.poll() is not None and not group:
            return False
        return procs.alive(leader, group=group)

    def run(self, *argv: str, **kwargs) -> subprocess.CompletedProcess:
        """A Slurm command against this cluster (sinfo, sbatch, squeue, scancel, scontrol)."""
        env = {**os.environ, **self.environ, **kwargs.pop("env", {})}
        return subprocess.run(list(argv), env=env, capture_output=True, text=True, **{"timeout": 60, **kwargs})

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- what start does -------------------------------------------------------------------

    @property
    def _munge_socket(self) -> str:
        return self._path("munge.socket")

    def _path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def _write_key(self) -> None:
        key = self._path("munge.key")
        if not os.path.exists(key):
            with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400), "wb") as f:
                f.write(os.urandom(1024))

    def _write_conf(self) -> None:
        user = getpass.getuser()
        root = self.root
        # partition short has a time limit of 10 minutes; partition gpu, the last two nodes, counts 2 GPUs on
        # each (two device files that are no GPUs: Slurm schedules --gres=gpu:N there, and binds nothing).
        # ReturnToService=1: a node set down (scontrol update state=down reason=...) stays down, with its
        # reason, until it is resumed, as a failed node does; one that only stopped answering comes back.
        # SlurmdTimeout=10, MessageTimeout=5: a node that stops answering (lost, or cut off) is set down, and its
        # jobs ended, within about 20 s, each ping of it waiting 5 s (a real cluster's slurmctld waits 300 s, and
        # 10 s for each answer, by default).
        gpu_nodes = [f"n{n}" for n in range(max(1, self.nodes - 1), self.nodes + 1)]
        if self.bed is None:  # every node a name for this host, on a port of its own
            controller = f"localhost(127.0.0.1)\nSlurmctldPort={procs.free_port()}"
            where = {node: f"NodeHostname=localhost NodeAddr=127.0.0.1 Port={procs.free_port()}"
                     for node in self.node_names}
        else:  # each in its own host, at its own address
            controller = f"{HEAD}({self.bed.address(HEAD)})\nSlurmctldPort={CTLD_PORT}"
            where = {node: f"NodeHostname={node} NodeAddr={self.bed.address(node)} Port={SLURMD_PORT}"
                     for node in self.node_names}
        nodes = "\n".join(f"NodeName={node} {where[node]} CPUs={self.cpus} RealMemory=1000 State=UNKNOWN"
                          + (" Gres=gpu:2" if node in gpu_nodes else "") for node in self.node_names)
        with open(self._path("gres.conf"), "w") as f:
            f.write("".join(f"NodeName={node} Name=gpu File=/dev/null,/dev/zero\n" for node in gpu_nodes))
        task_prolog = ""
        if self.oversubscribed:
            with open(os.open(self._path("task_prolog.sh"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o755), "w") as f:
                f.write(TASK_PROLOG)
            task_prolog = f"TaskProlog={self._path('task_prolog.sh')}\n"
        with open(self.conf, "w") as f:
            f.write(f"""\
ClusterName=mpimagic
SlurmctldHost={controller}
AuthType=auth/munge
AuthInfo=socket={self._munge_socket}
CredType=cred/munge
MpiDefault=none
GresTypes=gpu
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
{task_prolog}ReturnToService=1
SlurmUser={user}
SlurmdUser={user}
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmdSpoolDir={root}/spool-%n
TmpFS={root}/tmp-%n
StateSaveLocation={root}/state
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
KillWait=2
SlurmdTimeout=10
MessageTimeout=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
{nodes}
PartitionName=debug Nodes=n[1-{self.nodes}] Default=YES MaxTime=INFINITE State=UP
PartitionName=short Nodes=n[1-{self.nodes}] MaxTime=10 State=UP
PartitionName=gpu Nodes={",".join(gpu_nodes)} MaxTime=INFINITE State=UP
""")

    def _spawn(self, argv: list[str], host: str | None = None) -> None:
        """A daemon in the foreground of a session of its own (``servers``), recorded before it runs on; on
        test hosts, in ``host`` (this machine without one)."""
        log = self._path(f"{argv[0]}.out")
        if self.bed is not None and host is not None:
            process = self.bed.spawn(host, argv, log=log, env={**os.environ, **self.environ})  # (the bed records it)
        else:
            with open(log, "ab") as out:
                process = servers.start(argv, ends_with_parent=False, stdout=out, stderr=subprocess.STDOUT,
                                        env={**os.environ, **self.environ, "PATH": _path()})  # (the keeper stops it)
        self._daemons.append(process)
        with open(self._path(PIDS), "a") as f:
            f.write(f"{process.pid}\n")

    def _all_idle(self) -> bool:
        shown = self.run("sinfo", "-h", "-N", "-o", "%N %t")
        states = dict(line.split()[:2] for line in shown.stdout.splitlines() if line.strip()).values()  # (one row per partition)
        return shown.returncode == 0 and len(states) == self.nodes and all(state == "idle" for state in states)

    def _wait_for(self, check, failure: str) -> None:
        deadline = time.monotonic() + UP_LIMIT
        while not check():
            if time.monotonic() > deadline:
                raise ClusterError(f"{failure} within {UP_LIMIT:g}s (logs under {self.root})")
            time.sleep(0.2)


def _kill_left_behind(conf: str) -> None:
    """SIGKILL to what this cluster's jobs left: a step daemon, or a process of a job (which
    carries its SLURM_JOB_ID and this cluster's SLURM_CONF); never a shell that merely set SLURM_CONF."""
    import psutil

    for process in psutil.process_iter(["name"]):
        try:
            environ = _raw_environ(process.pid)
            if b"\0SLURM_CONF=" + conf.encode() + b"\0" in environ and (
                    b"\0SLURM_JOB_ID=" in environ or process.info["name"] == "slurmstepd"):
                process.kill()
        except (OSError, psutil.Error):
            continue


def _raw_environ(pid: int) -> bytes:
    """A process's environment as the kernel shows it, NUL-separated (and NUL-led, for matching whole
    entries). Read raw: a step daemon writes its title over the start of that block, leaving an empty
    entry there, where psutil's reading of it stops."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        return b"\0" + f.read()


def default_root() -> str:
    return os.path.join(tempfile.gettempdir(), f"mpi_magic_slurm_{os.getuid()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpi_magic.testing.slurm_cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("--nodes", type=int, default=4, help="nodes of the cluster (start; default 4)")
    parser.add_argument("--root", default=default_root(), help="its folder (default: %(default)s)")
    parser.add_argument("--after", type=int, metavar="PID", help="stop: once process PID has ended")
    parser.add_argument("--stand-in", action="store_true",
                        help="start: every node on this host, even where test hosts can be made (they need root)")
    args = parser.parse_args(argv)
    cluster = SlurmCluster(args.root, args.nodes, outlives_me=True, stand_in=args.stand_in)
    if args.action == "stop":
        if args.after:
            import psutil

            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(args.after).wait()
        cluster.stop(remove=True)
        return 0
    try:
        cluster.start()
    except ClusterError as exc:
        print(f"slurm_cluster: {exc}", file=sys.stderr)
        return 1
    print(f"# {cluster.layout}")
    for name, value in cluster.environ.items():
        print(f"export {name}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
