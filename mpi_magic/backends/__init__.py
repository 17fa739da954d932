"""Where ranks run. A backend submits a job and yields events; it never imports the view."""

from __future__ import annotations

from ..errors import BackendNotAvailable
from .base import Backend, BackendJob


def get_backend(name: str, config) -> Backend:
    """The backend called ``name``, checked to be usable here (raises before anything starts)."""
    if name == "local":
        from .local import LocalBackend

        return LocalBackend(config)
    raise BackendNotAvailable(
        f"the {name!r} backend is not available in this version of mpi-magic yet; "
        "use --backend local (the default) to run the ranks on this machine"
    )


__all__ = ["Backend", "BackendJob", "get_backend"]
