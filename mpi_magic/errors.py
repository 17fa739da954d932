"""Every error mpi_magic raises, in one tree.

    MpiMagicError
    ├── CaptureError (+TypeError)      a name the cell reads cannot travel to the ranks
    ├── LauncherNotFound (+FileNotFoundError)   no usable mpirun
    ├── PayloadError (+ValueError)     a payload or result file is damaged or incompatible
    ├── SageMakerSetupError            a cloud setting is missing or wrong; nothing was uploaded
    ├── SlurmSetupError                Slurm cannot take the job as asked; nothing was submitted
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


class SageMakerSetupError(MpiMagicError):
    """Something the SageMaker backend needs is missing or wrong; nothing was uploaded or started."""


class SlurmSetupError(MpiMagicError):
    """Slurm cannot take the job as asked (no client, an unknown partition, a limit); nothing was submitted."""


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


class RankFailure:
    """What one rank reported (or what the launcher said) when it failed.

    A plain class: this module is imported on every rank, where dataclasses cost milliseconds."""

    __slots__ = ("rank", "instance", "host", "error_type", "message", "traceback")

    def __init__(self, rank: int, instance: int, host: str = "", error_type: str = "", message: str = "",
                 traceback: str = ""):
        self.rank, self.instance, self.host = rank, instance, host
        self.error_type, self.message, self.traceback = error_type, message, traceback

    def __eq__(self, other: object) -> bool:
        return type(other) is RankFailure and all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    def __repr__(self) -> str:
        return "RankFailure(%s)" % ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)

    def headline(self) -> str:
        where = f"rank {self.rank} (instance {self.instance}{', ' + self.host if self.host else ''})"
        if self.error_type:
            return f"{where} raised {self.error_type}: {self.message}".rstrip(": ")
        return f"{where} {self.message or 'exited without reporting'}"


class RankExitError(JobError):
    """Ranks ended without reporting a Python exception (killed by a signal, os._exit)."""

    def __init__(self, failures: list[RankFailure], summary: str = ""):
        self.failures = failures
        lines = [f.headline() for f in failures] or [summary or "the launcher failed"]
        super().__init__("; ".join(lines))


class RemoteRankError(JobError):
    """One or more ranks raised. IPython shows the remote traceback, not the launcher's.

    ``rank``, ``instance``, ``error_type`` and ``message`` describe the first failing rank;
    ``failures`` holds every rank that reported an exception; ``debuggable`` the ranks whose
    frames ``%mpirun_debug`` can open.
    """

    def __init__(self, failures: list[RankFailure], world_size: int, debuggable: list[int] | None = None):
        if not failures:
            raise ValueError("RemoteRankError needs at least one failure")
        self.failures = sorted(failures, key=lambda f: f.rank)
        self.world_size = world_size
        first = self.failures[0]
        self.rank, self.instance, self.host = first.rank, first.instance, first.host
        self.error_type, self.message = first.error_type, first.message
        self.remote_traceback = first.traceback
        self.debuggable = sorted(debuggable or [])
        super().__init__(self._summary())

    def _summary(self) -> str:
        first = self.failures[0]
        text = first.headline()
        others = len(self.failures) - 1
        if others:
            ranks = compact_ranks([f.rank for f in self.failures[1:]])
            text += f" (and {others} more of {self.world_size} ranks: {ranks})"
        return text

    def _render_traceback_(self) -> list[str]:
        """IPython calls this instead of formatting the local (launcher) traceback."""
        first = self.failures[0]
        lines = [f"{_RED}RemoteRankError{_RESET}: {self._summary()}", ""]
        lines.append(f"--- traceback of {first.headline().split(' raised')[0]} ---")
        lines.extend(first.traceback.rstrip("\n").splitlines() or [f"{first.error_type}: {first.message}"])
        kinds: dict[tuple[str, str], list[int]] = {}
        for failure in self.failures[1:]:
            kinds.setdefault((failure.error_type, failure.message), []).append(failure.rank)
        for (error_type, message), ranks in kinds.items():
            lines.append(f"ranks {compact_ranks(ranks)} also raised {error_type}: {message}")
        if self.debuggable:
            lines.append(f"%mpirun_debug opens the debugger on rank {self.debuggable[0]}'s frames and locals"
                         + (" (%mpirun_debug N on rank N)" if len(self.debuggable) > 1 else ""))
        return lines


_RED, _RESET = "\x1b[0;31m", "\x1b[0m"


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

