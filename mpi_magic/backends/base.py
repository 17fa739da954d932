"""What every backend provides: ``submit`` a packed job, then ``poll`` its events."""

from __future__ import annotations

from typing import Protocol

from ..events import Event
from ..options import LaunchOptions


class BackendJob(Protocol):
    name: str
    host: str

    @property
    def finished(self) -> bool:
        """True once the launcher has exited and every event has been delivered."""

    def poll(self, timeout: float) -> list[Event]:
        """Events that arrived, waiting at most ``timeout`` seconds for the first."""

    def cancel(self) -> None:
        """Stop every rank; returns when nothing of the job is left running."""


class Backend(Protocol):
    name: str
    tag_style: str
    pins_digest: bool  # True where the payload leaves the user's private folder

    def submit(self, job_dir: str, job_name: str, digest: str | None, options: LaunchOptions) -> BackendJob:
        """Start the job whose payload is in ``job_dir``."""
