"""What every backend provides: ``submit`` a packed job, then ``poll`` its events."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..events import Event

if TYPE_CHECKING:  # options reads the backends' instance facts: no import back at run time
    from ..options import LaunchOptions


class BackendJob(Protocol):
    name: str
    host: str
    abort_grace: float | None  # seconds after a rank's failure before the job is stopped from here
    linger: float | None  # seconds after every rank succeeded before a launcher still running is stopped

    @property
    def finished(self) -> bool:
        """True once the launcher has exited and every event has been delivered."""

    def poll(self, timeout: float) -> list[Event]:
        """Events that arrived, waiting at most ``timeout`` seconds for the first."""

    def cancel(self) -> None:
        """Stop every rank; returns when nothing of the job is left running."""

    def fetch_results(self, job_dir: str, ranks) -> None:
        """Put each listed rank's results file into ``job_dir/results``."""


class Backend(Protocol):
    name: str
    pins_digest: bool  # True where the payload leaves the user's private folder
    stop_description: str  # how an interrupt stops the job, for the message the user sees

    def check(self, options: LaunchOptions) -> list[str]:
        """Warnings to show before submitting (errors are raised when the backend is made)."""

    def plan(self, job_dir: str, job_name: str, digest: str | None, options: LaunchOptions) -> str:
        """What --dry-run prints."""

    def submit(self, job_dir: str, job_name: str, digest: str | None, options: LaunchOptions) -> BackendJob:
        """Start the job whose payload is in ``job_dir``."""
