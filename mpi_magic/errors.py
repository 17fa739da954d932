"""Every error mpi_magic raises, in one tree.

    MpiMagicError
    ├── CaptureError (+TypeError)      a name the cell reads cannot travel to the ranks
    ├── LauncherNotFound (+FileNotFoundError)   no usable mpirun
    ├── PayloadError (+ValueError)     a payload or result file is damaged or incompatible
    ├── BackendSetupError              a backend cannot take the job as asked; nothing was submitted
    │   (each backend's own kind, in its folder: SlurmSetupError, SageMakerSetupError)
    └── JobError                       the job ran and did not succeed
        ├── RemoteRankError            one or more ranks raised; shows their tracebacks
        ├── RankExitError              ranks died without reporting (signal, os._exit)
        ├── JobTimeoutError (+TimeoutError)   --timeout elapsed; ranks were stopped
        ├── SessionStartError          a session's ranks did not all come up
        ├── ResultsLost                a session's cell ran, but its results could not be read
        └── BackendNotAvailable        the chosen backend is not usable here

Option mistakes raise IPython's ``UsageError`` instead, which IPython shows as one line.
"""

from __future__ import annotations


class MpiMagicError(Exception):
    """Base class of mpi_magic's errors."""

    def _render_traceback_(self) -> list[str]:
        """IPython shows the message alone: the local stack says nothing the user can act on."""
        return [f"{_RED}{type(self).__name__}{_RESET}: {self}"]


class CaptureError(MpiMagicError, TypeError):
    """A notebook name the cell reads cannot be sent to the ranks."""


class LauncherNotFound(MpiMagicError, FileNotFoundError):
    """No MPI launcher could be found or run."""


class PayloadError(MpiMagicError, ValueError):
    """A payload or result file is damaged, tampered with, or from an incompatible Python."""


class BackendSetupError(MpiMagicError):
    """A backend cannot take the job as asked (a client or setting missing, a refusal from its scheduler
    or cloud); nothing was submitted or paid for. Each backend raises a kind of its own, defined in its
    folder (``mpi_magic.SlurmSetupError``, ``mpi_magic.SageMakerSetupError``)."""


class JobError(MpiMagicError):
    """The job ran and did not succeed."""


class BackendNotAvailable(JobError):
    """The chosen backend cannot be used (not built yet, or a missing extra)."""


class JobTimeoutError(JobError, TimeoutError):
    """The job ran past --timeout; all ranks were stopped."""


class SessionStartError(JobError):
    """The ranks of a session did not all come up; nothing of it is left running."""


class ResultsLost(JobError):
    """A session's cell ran, but its results could not be read here; what it assigned stays on the ranks."""


# What a rank raises when another rank went away first: its failure is a consequence, never the cause.
PEER_LOSS = (
    "Connection closed by peer",  # gloo (torch.distributed on CPU)
    "NCCL communicator was aborted",  # NCCL, after a peer's failure aborted the communicator
    "remote process exited",  # NCCL
    "ERR_PROC_FAILED",  # MPI (Open MPI's MPI_ERR_PROC_FAILED, MPICH's MPIX_ERR_PROC_FAILED, mpi4py's MPI.Exception)
    "ERR_PROC_ABORTED",  # Open MPI
)


class RankFailure:
    """What one rank reported (or what the launcher said) when it failed, and when (``at``, by the
    notebook's clock: the rank's own time, corrected for its instance's clock; None where unknown).

    A plain class: this module is imported on every rank, where dataclasses cost milliseconds."""

    __slots__ = ("rank", "instance", "host", "error_type", "message", "traceback", "at")

    def __init__(self, rank: int, instance: int, host: str = "", error_type: str = "", message: str = "",
                 traceback: str = "", at: float | None = None):
        self.rank, self.instance, self.host = rank, instance, host
        self.error_type, self.message, self.traceback, self.at = error_type, message, traceback, at

    def __eq__(self, other: object) -> bool:
        return type(other) is RankFailure and all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    def __repr__(self) -> str:
        return "RankFailure(%s)" % ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)

    @property
    def lost_a_peer(self) -> bool:
        """It failed because another rank went away (``PEER_LOSS``)."""
        return any(words in self.message or words in self.error_type for words in PEER_LOSS)

    def headline(self) -> str:
        where = f"rank {self.rank} (instance {self.instance}{', ' + self.host if self.host else ''})"
        if self.error_type:
            return f"{where} raised {self.error_type}: {self.message}".rstrip(": ")
        return f"{where} {self.message or 'exited without reporting'}"


def first_failed_first(failures: list[RankFailure]) -> list[RankFailure]:
    """The failures by when they happened; a peer's loss after every other failure, whatever its clock says."""
    return sorted(failures, key=lambda f: (f.lost_a_peer, f.at is None, f.at or 0.0, f.rank))


class RankExitError(JobError):
    """Ranks ended without reporting a Python exception (killed by a signal, os._exit)."""

    def __init__(self, failures: list[RankFailure], summary: str = ""):
        self.failures = first_failed_first(failures)
        lines = [f.headline() for f in self.failures] or [summary or "the launcher failed"]
        super().__init__("; ".join(lines))


class RemoteRankError(JobError):
    """One or more ranks raised. IPython shows the remote traceback, not the launcher's.

    ``rank``, ``instance``, ``error_type`` and ``message`` describe the rank that failed first
    (``first_failed_first``); ``failures`` holds every rank that reported an exception, in that
    order; ``debuggable`` the ranks whose frames ``%mpirun_debug`` can open.
    """

    def __init__(self, failures: list[RankFailure], world_size: int, debuggable: list[int] | None = None):
        if not failures:
            raise ValueError("RemoteRankError needs at least one failure")
        self.failures = first_failed_first(failures)
        self.world_size = world_size
        first = self.failures[0]
        self.rank, self.instance, self.host = first.rank, first.instance, first.host
        self.error_type, self.message = first.error_type, first.message
        self.remote_traceback = first.traceback
        self.debuggable = sorted(debuggable or [])
        super().__init__(self._summary())

    def _summary(self) -> str:
        first, then = self.failures[0], self.failures[1:]
        text = first.headline()
        if then:
            text += f" (then {ranks_phrase([f.rank for f in then])} of {self.world_size} failed"
            times = [f.at for f in then if f.at is not None]
            if first.at is not None and times:
                text += f" within {max(0.0, max(times) - first.at):.1f} s"
            text += ")"
        return text

    def _render_traceback_(self) -> list[str]:
        """IPython calls this instead of formatting the local (launcher) traceback."""
        first = self.failures[0]
        lines = [f"{_RED}RemoteRankError{_RESET}: {self._summary()}", ""]
        lines.append(f"--- traceback of {first.headline().split(' raised')[0]} ---")
        lines.extend(first.traceback.rstrip("\n").splitlines() or [f"{first.error_type}: {first.message}"])
        kinds: dict[tuple[bool, str, str], list[int]] = {}  # in the order they failed
        for failure in self.failures[1:]:
            kinds.setdefault((failure.lost_a_peer, failure.error_type, failure.message), []).append(failure.rank)
        for (lost_a_peer, error_type, message), ranks in kinds.items():
            lines.append(f"then {ranks_phrase(ranks)} {'lost a peer:' if lost_a_peer else 'raised'} "
                         f"{error_type}: {message}")
        if self.debuggable:
            opened = next((f.rank for f in self.failures if f.rank in self.debuggable), self.debuggable[0])
            lines.append(f"%mpirun_debug opens the debugger on rank {opened}'s frames and locals"
                         + (" (%mpirun_debug N on rank N)" if len(self.debuggable) > 1 else ""))
        return lines


_RED, _RESET = "\x1b[0;31m", "\x1b[0m"

INSTALL_MLFLOW = "pip install 'mlflow>=2.16'"  # the ``mlflow`` extra's


def counted(count: int, noun: str, plural: str = "") -> str:
    """'1 cell', '2 cells'; ``plural`` where an s is not it: counted(1, "process", "processes")."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def ranks_phrase(ranks: list[int], shown: int = 8) -> str:
    """'rank 2', 'ranks 0, 1, 3'; past `shown` ranks by spans: 'ranks 0-31, 40-63', 'ranks 0, 2, 4, ... (40 in all)'."""
    ranks = sorted(set(ranks))
    if len(ranks) <= shown:
        return f"{'rank' if len(ranks) == 1 else 'ranks'} {', '.join(str(r) for r in ranks)}"
    pieces = compact_ranks(ranks).split(", ")
    listed = ", ".join(pieces[:shown]) + (f", ... ({len(ranks)} in all)" if len(pieces) > shown else "")
    return f"ranks {listed}"


def compact_ranks(ranks: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    ranks = sorted(set(ranks))
    spans: list[list[int]] = []
    for r in ranks:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)

