"""What every backend provides: ``submit`` a packed job, then ``poll`` its events; what some
add: sessions (``SessionBackend``), and following jobs started earlier (``AttachableBackend``).

Data members are read-only properties here, so a plain class attribute (``name = "local"``)
or one set in ``__init__`` satisfies them. Each backend module declares its conformance in a
function that only the type checker reads, so a missing or mistyped member fails the check;
the notebook asks ``isinstance(backend, SessionBackend)``, never ``hasattr``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol, runtime_checkable

from ..shared.events import Event
from ..shared.layout import RESULTS

if TYPE_CHECKING:
    from ..options import Config, LaunchOptions, Option, Setting

LEAVE_WAIT = 5.0  # seconds a session's ranks get to leave by themselves (told it ends) before they are stopped


class BackendJob(Protocol):
    """A submitted job, as the notebook follows it to its end."""

    @property
    def abort_grace(self) -> float | None:
        """Seconds after a rank's failure before the job is stopped from here (None: never)."""

    @property
    def linger(self) -> float | None:
        """Seconds after every rank succeeded before a launcher still running is stopped (None: never)."""

    @property
    def finished(self) -> bool:
        """True once the launcher has exited and every event has been delivered."""

    def poll(self, timeout: float) -> list[Event]:
        """Events that arrived, waiting at most ``timeout`` seconds for the first."""

    def cancel(self) -> None:
        """Stop every rank; returns once the stop is under way (``finished`` says when it is done)."""

    def fetch_results(self, job_dir: str, ranks: Iterable[int], kind: str = RESULTS) -> None:
        """Put each listed rank's results file (or the frames a failed rank kept, ``kind``
        ``layout.POST_MORTEM``) where ``layout.result_path`` says."""

    @property
    def launcher(self) -> tuple[int, float] | None:
        """(pid, start time) of the launcher process on this machine, which the job folder records
        so that pruning spares a running job; None where the ranks run elsewhere."""

    @property
    def stacks_dir(self) -> str | None:
        """The folder where the ranks dump their stacks when signalled (``shared/stacks.py``); None
        where the notebook cannot signal them."""

    def request_stacks(self) -> bool:
        """Ask every rank for its stack through the job's own channel, the answers to come as
        ``RankStacks`` events; False where the job has none (its ranks are asked through
        ``stacks_dir``, or not at all)."""


class Backend(Protocol):
    """Where ranks run: checks, plans and submits one cell's job."""

    @property
    def name(self) -> str:
        """As the user names it: ``--backend NAME``."""

    @property
    def pins_digest(self) -> bool:
        """True where the payload leaves the user's private folder, so ranks check its digest."""

    @property
    def stop_description(self) -> str:
        """How an interrupt stops the job, for the message the user sees."""

    def check(self, options: LaunchOptions) -> list[str]:
        """Warnings to show before submitting (errors are raised when the backend is made)."""

    def unpriced(self, options: LaunchOptions) -> str | None:
        """Why the meter knows no price for this job, which a budget (``--max-cost``) is then
        refused with; None where the job's ``Billing`` events carry its price."""

    def plan(self, job_dir: str, job_name: str, digest: str | None, options: LaunchOptions) -> str:
        """What --dry-run prints."""

    def submit(self, job_dir: str, job_name: str, digest: str | None, options: LaunchOptions) -> BackendJob:
        """Start the job whose payload is in ``job_dir``."""


@runtime_checkable
class SessionBackend(Backend, Protocol):
    """A backend whose ranks can stay up between cells (``%mpirun_session``)."""

    def start_session(self, name: str, options: LaunchOptions, config: Config) -> SessionRanks:
        """Start ranks that wait for cells; returns once they are launched (not yet up)."""


class AttachableBackend(Protocol):
    """A backend whose jobs outlive the kernel that started them, so another one can follow them."""

    @property
    def name(self) -> str:
        """As the user names it: ``--backend NAME``."""

    @property
    def stop_description(self) -> str:
        """How an interrupt stops the job, for the message the user sees."""

    def attach(self, job_name: str) -> tuple[BackendJob, dict[str, Any]]:
        """A running or ended one-off job, and what it says about itself: ``instances``,
        ``procs_per_instance``, ``returns`` (the names its cell assigns) and ``gather``."""

    def attach_session(self, job_name: str) -> tuple[SessionRanks, dict[str, Any]]:
        """A session's running ranks, and ``instances``, ``procs_per_instance``, ``env`` and ``cells``
        (how many it has run)."""

    def recent_jobs(self) -> list[dict[str, Any]]:
        """The jobs started from this machine, newest first: ``name``, ``created`` (epoch seconds),
        ``status`` and ``secondary`` (the backend's finer status); for one that still runs, a
        ``warning`` that says what it has cost so far."""


class SessionRanks(Protocol):
    """A session's ranks, up between cells: their events, and the channel to rank 0."""

    @property
    def name(self) -> str:
        """The session's name (every process of it carries it)."""

    @property
    def stop_description(self) -> str:
        """How an interrupt reaches the ranks, for the message the user sees."""

    @property
    def job_name(self) -> str | None:
        """The cloud job the ranks run as (None for local ranks)."""

    @property
    def latency(self) -> float:
        """Seconds the channel adds before the notebook sees interrupted ranks back."""

    @property
    def start_limit(self) -> float:
        """Seconds every rank may take to be up and waiting."""

    @property
    def finished(self) -> bool:
        """True once the launcher has exited and every event has been delivered."""

    def poll(self, timeout: float) -> list[Event]:
        """Events that arrived, waiting at most ``timeout`` seconds for the first."""

    @property
    def launcher(self) -> tuple[int, float] | None:
        """(pid, start time) of the launcher process on this machine; None where the ranks run elsewhere."""

    @property
    def stacks_dir(self) -> str | None:
        """Where the ranks dump their stacks when signalled; None where the notebook cannot signal them."""

    def connect(self) -> bool:
        """True once rank 0 is on the channel (checked without waiting)."""

    def send_cell(self, number: int, job_dir: str, digest: str | None) -> None:
        """Hand rank 0 cell ``number``, whose payload is in ``job_dir`` (``digest``: its SHA-256, where pinned)."""

    def close(self, reason: str) -> None:
        """Tell the ranks the session ends, for ``reason``: they leave by themselves (``stop`` makes sure)."""

    def fetch_results(self, job_dir: str, ranks: Iterable[int], kind: str = RESULTS) -> None:
        """Put each listed rank's results of the last cell (or its ``kind`` of file) where
        ``layout.result_path`` says."""

    def interrupt(self, pids: dict[int, int]) -> None:
        """Interrupt the cell on the given ranks ({rank: pid})."""

    def request_stacks(self) -> bool:
        """Ask every rank for its stack through the ranks' own channel, the answers to come as
        ``RankStacks`` events, in a cell or between cells; False where they are asked through
        ``stacks_dir``, or cannot be asked from the notebook."""

    def memory(self, pids: dict[int, int]) -> dict[int, int]:
        """{rank: resident bytes} of the given ranks, where the backend can tell (else empty)."""

    def facts(self) -> list[str]:
        """Lines the backend adds to ``%mpirun_session`` (a training job's status and billable time)."""

    def stop(self, wait: bool = True) -> None:
        """Stop every rank now, leaving nothing running (``wait=False``: return once the stop is under way)."""

    @property
    def released(self) -> str | None:
        """Why this notebook no longer holds ranks that run on (another notebook took them over);
        None while it holds them."""

    def let_go(self, reason: str) -> None:
        """Hold the ranks no more and leave them running where they can outlive the notebook (a
        cloud job another notebook may take over); elsewhere, stop them."""


def _no_values(args: argparse.Namespace, config: Config) -> dict:
    return {}


@dataclass(frozen=True)
class Declaration:
    """What a backend is, declared once in its own folder (``declaration.py``) and listed in the
    registry, which builds the magic's options, %mpirun_config, the session checks and the view's
    words from it. Nothing here imports the backend: ``make`` and ``attach`` do, when called."""

    name: str  # as the user names it: --backend NAME
    about: str  # what --backend's help says of it: "this machine"
    make: Callable[[Config, LaunchOptions], Backend]  # the backend, checked to be usable here
    default_gpus: Callable[[dict], int]  # processes per instance when --gpus is not given, from its settings
    max_ranks: int  # the most ranks one job may have
    why_max: str  # the reason a larger job is refused with
    options: tuple[Option, ...] = ()  # the line's options only it takes (the job's shape: fixed for a session)
    settings: tuple[Setting, ...] = ()  # its defaults, set with %mpirun_config or MPI_MAGIC_* variables
    values: Callable[[argparse.Namespace, Config], dict] = _no_values  # its settings from the line (and the
    # defaults), checked for form; they travel as ``LaunchOptions.settings``
    idle_default: float | None = None  # seconds a session may sit without a cell unless --max-idle says
    prices: bool = False  # its jobs' price is known, so a budget (--max-cost) applies
    one_host: bool = False  # its instances are simulated on this machine, so one mpirun holds every rank
    attach: Callable[[Config], AttachableBackend] | None = None  # its jobs outlive the kernel: others follow them
    files: tuple[str, ...] = ()  # its settings that name a file the job takes along (an export copies them)
    extra: str = ""  # the extra of mpi_magic's install it needs on the notebook's side ("sagemaker")
    export_needs: str = ""  # what an exported job needs to run from a terminal
    export_launch: str = "the launch"  # what an export's launch.txt holds
